"""The jitted train and eval steps: loss is the global weighted token mean.

The loss is computed as (sum of weighted token losses, sum of weights) over the global batch and
divided once, so it is the same number whatever the mesh or layout (never a mean of per-shard
means). Gradient accumulation sums the same two quantities over micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from model import loss


def token_loss_sums(graphdef, params, batch, mask_documents: bool):
    """(sum of weight * cross-entropy, sum of weight) over a batch of [B, S] fields."""
    net = nnx.merge(graphdef, params)
    segment_ids = batch["segment_ids"] if mask_documents else None
    # order: where each token came from (the layout's placement; per row for 'balanced').
    # Batches from data/ always carry it; a hand-made batch of a static layout may leave it out.
    x = net.hidden(batch["inputs"], batch["positions"], segment_ids, batch.get("order"))
    targets, weights = batch["targets"], batch["weights"]
    if net.cfg.loss_chunk:  # never makes the [B, S, V] logits (model/loss.py)
        total = loss.chunked_nll_sum(x, net.head_weight(), targets, weights, mesh=net.mesh,
                                     chunk=net.cfg.loss_chunk,
                                     soft_cap=net.cfg.final_logit_soft_cap)
    else:
        total = loss.plain_nll_sum(net.logits(x), targets, weights)
    return total, jnp.sum(weights)


def _micro_batches(batch, count: int):
    """[B, S] -> [count, B/count, S], taking rows strided so every data shard feeds every
    micro-batch (contiguous slices would leave most shards idle in each micro-step)."""
    def split(x):
        b = x.shape[0]
        return jnp.swapaxes(x.reshape(b // count, count, *x.shape[1:]), 0, 1)
    return jax.tree.map(split, batch)


def make_train_step(graphdef, tx, schedule, *, mask_documents: bool, grad_accum_steps: int = 1,
                    skip_nonfinite: bool = False):
    """train_step(state, batch) -> (state, metrics); state = {'step', 'params', 'opt_state'}.

    With skip_nonfinite, a step whose loss or gradients are not finite leaves parameters and
    optimizer state unchanged (the step counter still advances) and reports learning/skipped 1.
    """

    def sums_and_grads(params, batch):
        def weighted_sum(params):
            total, weight = token_loss_sums(graphdef, params, batch, mask_documents)
            return total, weight
        (total, weight), grads = jax.value_and_grad(weighted_sum, has_aux=True)(params)
        return total, weight, grads

    def train_step(state, batch):
        params = state["params"]
        if grad_accum_steps == 1:
            total, weight, grads = sums_and_grads(params, batch)
        else:
            def accumulate(carry, micro):
                total, weight, grads = sums_and_grads(params, micro)
                return jax.tree.map(jnp.add, carry, (total, weight, grads)), None
            zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
            (total, weight, grads), _ = jax.lax.scan(
                accumulate, zeros, _micro_batches(batch, grad_accum_steps))
        weight = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g / weight, grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
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
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, *, mask_documents: bool):
    """eval_step(params, batch) -> (sum of token losses, sum of weights)."""
    return lambda params, batch: token_loss_sums(graphdef, params, batch, mask_documents)
