"""The jitted train and eval steps: loss is the global weighted token mean.

The loss is computed as (sum of weighted token losses, sum of weights) over the global batch and
divided once, so it is the same number whatever the mesh or layout (never a mean of per-shard
means). Gradient accumulation sums the same two quantities over micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import parallel
from model import loss
from model.moe import update_correction_bias


def token_loss_sums(graphdef, params, batch, mask_documents: bool):
    """(sum of weight * cross-entropy, sum of weight) over a batch of [B, S] fields."""
    total, weight, _ = loss_sums(graphdef, params, batch, mask_documents)
    return total, weight


def loss_sums(graphdef, params, batch, mask_documents: bool):
    """token_loss_sums, and the mixture-of-experts layers' statistics (None for a dense
    model): Transformer.hidden_and_stats's, with 'penalty', the router losses per token
    (moe.aux_loss_coef x the mean balance loss + moe.z_loss_coef x the mean z-loss), which
    training adds to the loss and evaluation does not."""
    net = nnx.merge(graphdef, params)
    segment_ids = batch["segment_ids"] if mask_documents else None
    # order: where each token came from (the layout's placement; per row for 'balanced').
    # Batches from data/ always carry it; a hand-made batch of a static layout may leave it out.
    x, stats = net.hidden_and_stats(batch["inputs"], batch["positions"], segment_ids,
                                    batch.get("order"))
    targets, weights = batch["targets"], batch["weights"]
    # The gradient is made with the logits, which the backward never holds (model/loss.py).
    total = loss.nll_sum(x, net.head_weight(), targets, weights, mesh=net.mesh,
                         chunk=net.cfg.loss_chunk, soft_cap=net.cfg.final_logit_soft_cap)
    if stats is not None:
        moe = net.cfg.moe
        stats = dict(stats, penalty=moe.aux_loss_coef * jnp.mean(stats["balance"])
                     + moe.z_loss_coef * jnp.mean(stats["z"]))
    return total, jnp.sum(weights), stats


def moe_metrics(stats) -> dict:
    """The progress metrics of the expert layers from their statistics: each layer's largest
    and smallest share of the routed pairs and every expert's share (an array: host_metrics
    keeps it at evaluations), the largest over layers, the balance and z losses (means over
    layers), the share of pairs dropped by a capacity."""
    shares = stats["counts"] / jnp.sum(stats["counts"], axis=-1, keepdims=True)
    out = {"moe/share_max": jnp.max(shares), "moe/balance_loss": jnp.mean(stats["balance"]),
           "moe/z_loss": jnp.mean(stats["z"]),
           "moe/dropped": jnp.sum(stats["dropped"]) / jnp.sum(stats["counts"])}
    for i in range(shares.shape[0]):
        out[f"moe/layer{i}/share_max"] = jnp.max(shares[i])
        out[f"moe/layer{i}/share_min"] = jnp.min(shares[i])
        out[f"moe/layer{i}/shares"] = shares[i]
    return out


def host_metrics(metrics, detailed: bool) -> dict:
    """A step's metrics fetched from the devices -> plain numbers for the trackers; an array
    (each expert's share of a layer's pairs) as a list, only when `detailed` (the run's
    evaluations: E numbers a layer would swell every logged row)."""
    return {k: float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]
            for k, v in metrics.items() if detailed or np.ndim(v) == 0}


def _over_micro_batches(stats):
    """Stats stacked over micro-batches [A, ...] -> one step's: counts and drops add, the
    per-token losses average."""
    return {k: jnp.sum(v, axis=0) if k in ("counts", "dropped") else jnp.mean(v, axis=0)
            for k, v in stats.items()}


def _micro_batches(batch, count: int):
    """[B, S] -> [count, B/count, S], taking rows strided so every data shard feeds every
    micro-batch (contiguous slices would leave most shards idle in each micro-step)."""
    def split(x):
        b = x.shape[0]
        return jnp.swapaxes(x.reshape(b // count, count, *x.shape[1:]), 0, 1)
    return jax.tree.map(split, batch)


def jit_train_step(config, program, arrays, platform: str):
    """The config's train step as every caller runs it (training, the compile check, the step's
    timing): the arrays donated, each keeping its sharding, and the options the platform's
    compiler needs (parallel.compiler_options). program: the state's TrainProgram; arrays
    may be abstract."""
    train_step = make_train_step(program.graphdef, program.tx, program.schedule,
                                 mask_documents=config.data.mask_documents,
                                 grad_accum_steps=config.optim.grad_accum_steps,
                                 skip_nonfinite=config.optim.skip_nonfinite,
                                 model_cfg=program.model)
    return jax.jit(train_step, donate_argnums=0,
                   out_shardings=(jax.tree.map(lambda x: x.sharding, arrays), None),
                   compiler_options=parallel.compiler_options(platform))


def make_train_step(graphdef, tx, schedule, *, mask_documents: bool, grad_accum_steps: int = 1,
                    skip_nonfinite: bool = False, model_cfg=None):
    """train_step(state, batch) -> (state, metrics); state = {'step', 'params', 'opt_state'}.
    model_cfg: the model's config, whose experts' correction bias (moe.bias_update_speed)
    moves after each step by the step's loads (model.moe.update_correction_bias).

    With skip_nonfinite, a step whose loss or gradients are not finite leaves parameters and
    optimizer state unchanged (the step counter still advances) and reports learning/skipped 1.
    """

    def sums_and_grads(params, batch):
        def weighted_sum(params):
            total, weight, stats = loss_sums(graphdef, params, batch, mask_documents)
            # The router losses are per token: weighted like the tokens, they survive the
            # division by the summed weight below as themselves.
            penalty = 0.0 if stats is None else stats["penalty"] * weight
            return total + penalty, (total, weight, stats)
        (_, (total, weight, stats)), grads = jax.value_and_grad(weighted_sum,
                                                                has_aux=True)(params)
        return total, weight, stats, grads

    def train_step(state, batch):
        params = state["params"]
        if grad_accum_steps == 1:
            total, weight, stats, grads = sums_and_grads(params, batch)
        else:
            def accumulate(carry, micro):
                total, weight, stats, grads = sums_and_grads(params, micro)
                # The barrier keeps XLA:TPU from moving the gradients' reductions out of the
                # loop (its while-loop all-reduce code motion fails a RET_CHECK on this sum: a
                # v5p-128 compile of configs/tpu/llama3_8b_128k_v5p.py, data 4 x 8 micro-steps)
                grads = jax.lax.optimization_barrier(grads)
                return jax.tree.map(jnp.add, carry, (total, weight, grads)), stats
            zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
            (total, weight, grads), stats = jax.lax.scan(
                accumulate, zeros, _micro_batches(batch, grad_accum_steps))
            stats = None if stats is None else _over_micro_batches(stats)
        weight = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g / weight, grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        if stats is not None and model_cfg is not None:
            new_params = update_correction_bias(new_params, stats["counts"], model_cfg.moe,
                                                model_cfg.sparse_layers)
        loss, grad_norm = total / weight, optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        if skip_nonfinite:
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
            new_params, opt_state = keep((new_params, opt_state), (params, state["opt_state"]))
        new_state = {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}
        metrics = {"train/loss": loss, "learning/grad_norm": grad_norm,
                   "learning/param_norm": optax.tree.norm(new_params),
                   "learning/lr": schedule(state["step"]),
                   "learning/skipped": 1 - finite.astype(jnp.int32)}
        if stats is not None:
            metrics.update(moe_metrics(stats))
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, *, mask_documents: bool):
    """eval_step(params, batch) -> (sum of token losses, sum of weights)."""
    return lambda params, batch: token_loss_sums(graphdef, params, batch, mask_documents)
