"""The train state: FSDP-sharded parameters, AdamW state and the step counter, built for real
(training) or abstractly (shapes and shardings only: the planner's compile check, and sample.py,
which restores a checkpoint into it without initialising a model or an optimizer).

    arrays, program = create_train_state(config, mesh, resolved)
    # arrays: {'step', 'params', 'opt_state'}; program: TrainProgram(graphdef, tx, schedule, model)
    arrays, program = create_train_state(config, mesh, resolved, abstract=True)
    # the same, its leaves jax.ShapeDtypeStruct

The train loop holds a run's place between steps in a TrainState (step, arrays, seed, progress).
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import model
from training import optim


@dataclasses.dataclass(frozen=True)
class TrainProgram:
    """What builds, steps and restores a run's arrays: the model's graph (the arrays' params
    merge into it), the optimizer and its learning-rate schedule, and the resolved model config
    (memory switches applied) they were built from (the graph holds the attention choice)."""

    graphdef: nnx.GraphDef
    tx: optax.GradientTransformation
    schedule: Callable[[int], float]
    model: model.ModelConfig


@dataclasses.dataclass
class Progress:
    """Counters that continue across restarts (throughput and time curves stay continuous)."""

    train_time_s: float = 0.0
    train_tokens: int = 0
    wandb_run_id: str = dataclasses.field(default_factory=lambda: secrets.token_hex(4))

    @classmethod
    def from_meta(cls, meta: dict) -> "Progress":
        """A checkpoint record's counters (one saved before a counter existed: it starts at 0)."""
        return cls(float(meta.get("train_time_s", 0.0)), int(meta.get("train_tokens", 0)),
                   meta.get("wandb_run_id") or secrets.token_hex(4))


@dataclasses.dataclass
class TrainState:
    """Where a run stands between two steps.

    step      the last step trained (0 before the first); with seed, the data position:
              batches are a pure function of (seed, step), so nothing else of the data is kept
    arrays    {'step', 'params', 'opt_state'}: the sharded arrays the jitted step takes and
              donates, and a checkpoint's 'state' item
    seed      the run's seed: the model's initial draw (its one randomness: no step draws) and
              the order of the data
    progress  the counters that continue across restarts
    """

    step: int
    arrays: dict
    seed: int
    progress: Progress


def create_train_state(config, mesh, resolved, *, abstract: bool = False, initial_params=None):
    """(arrays, TrainProgram): the arrays every step reads and writes, and what builds and
    steps them; resolved: the run's planner.ResolvedRun, whose model config (memory switches
    applied) and attention choice build the model.
    initial_params(model_cfg, abstract_params) -> params: where the weights come from instead
    of a random draw (config.init_from: training/init_from.py); the model is never drawn."""
    model_cfg = resolved.model
    if abstract or initial_params is not None:
        with jax.set_mesh(mesh):
            net = nnx.eval_shape(lambda: model.Transformer(
                model_cfg, mesh, nnx.Rngs(config.seed), resolved.attention))
    else:
        net = model.create(model_cfg, mesh, config.seed, resolved.attention)
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
    arrays = {"step": step, "params": params, "opt_state": opt_state}
    return arrays, TrainProgram(graphdef, tx, schedule, model_cfg)


def _abstract(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
