"""The train state: FSDP-sharded parameters, AdamW state and the step counter, built for real
(training) or abstractly (shapes and shardings only: the planner's compile check, and sample.py,
which restores a checkpoint into it without initialising a model or an optimizer).

    create_train_state(config, mesh, resolved)
        -> (state, graphdef, tx, schedule, model_cfg)
    create_train_state(config, mesh, resolved, abstract=True)
        -> the same, its leaves jax.ShapeDtypeStruct
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import model
from training import optim


def create_train_state(config, mesh, resolved, *, abstract: bool = False, initial_params=None):
    """The state every step reads and writes; resolved: the run's planner.ResolvedRun, whose
    model config (attention and memory switches applied) builds the model.
    initial_params(model_cfg, abstract_params) -> params: where the weights come from instead
    of a random draw (config.init_from: training/init_from.py); the model is never drawn."""
    model_cfg = resolved.model
    if abstract or initial_params is not None:
        with jax.set_mesh(mesh):
            net = nnx.eval_shape(lambda: model.Transformer(model_cfg, mesh,
                                                           nnx.Rngs(config.seed)))
    else:
        net = model.create(model_cfg, mesh, config.seed)
    graphdef, params = nnx.split(net, nnx.Param)
    if abstract or initial_params is not None:
        params = jax.tree.map(lambda x: _abstract(x, jax.NamedSharding(mesh, x.sharding.spec)),
                              params)
    if initial_params is not None and not abstract:
        params = initial_params(model_cfg, params)
    tx, schedule = optim.make_optimizer(config.optim, config.num_train_steps)
    opt_shardings = optim.optimizer_shardings(tx, params, mesh)
    replicated = jax.NamedSharding(mesh, jax.P())
    if abstract:
        opt_state = jax.tree.map(_abstract, jax.eval_shape(tx.init, params), opt_shardings)
        step = _abstract(jax.ShapeDtypeStruct((), jnp.int32), replicated)
    else:
        with jax.set_mesh(mesh):
            opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
        step = jax.device_put(jnp.zeros((), jnp.int32), replicated)
    state = {"step": step, "params": params, "opt_state": opt_state}
    return state, graphdef, tx, schedule, model_cfg


def _abstract(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
