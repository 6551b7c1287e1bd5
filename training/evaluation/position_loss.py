"""The loss as a function of position: does a model use the far context it was trained for?

    rows = long_documents(tokens, eos_id, length=8192, count=8)      # [n, 8193], a document each
    batch = position_batch(rows, layout="zigzag", num_shards=4)      # laid out like training's
    sums, counts = make_position_eval(graphdef, buckets=8)(params, on_mesh(batch, mesh))
    curve = sums / counts                                            # [8] mean NLL per 1,024

Each row is the start of one held-out document at least `length` + 1 tokens long (never packed,
so every position's context is its own document's). The rows are laid out and sharded exactly
as a training batch and run through the training forward; each token's loss is bucketed by its
ORIGINAL position (the batch's `order`), so every layout and mesh gives the same curve. A model
that uses its context has a curve that keeps falling; one whose positions have gone out of range
(RoPE past the length it learned) rises after them. train.py logs the curve at every eval
(`eval/loss_by_position`, config.eval_position_buckets) and scripts/eval_positions.py computes
it for checkpoints.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import parallel
from model import loss


def long_documents(tokens: np.ndarray, eos_id: int, length: int, count: int) -> np.ndarray:
    """Up to `count` rows [n, length + 1]: the first length + 1 tokens of each document that has
    at least that many, in stream order. Documents are the runs between two EOS: the piece
    before the first one is the end of a document that began before this stream."""
    ends = np.flatnonzero(np.asarray(tokens) == eos_id)
    long = [s for s, e in zip(ends[:-1] + 1, ends[1:]) if e - s >= length + 1][:count]
    if not long:
        return np.zeros((0, length + 1), np.int32)
    return np.stack([np.asarray(tokens[s:s + length + 1], np.int32) for s in long])


def position_batch(rows: np.ndarray, layout: str, num_shards: int,
                   tile: int | None = None) -> dict[str, np.ndarray]:
    """Rows [n, S + 1] (one document each, natural order) -> a batch's fields [n, S] in the
    layout's order: inputs, targets, positions (0 .. S-1), segment_ids (one document), order."""
    n, size = rows.shape[0], rows.shape[1] - 1
    segment_ids = np.zeros((n, size), np.int32)
    order = np.asarray(parallel.row_order(layout, segment_ids, num_shards, tile=tile), np.int32)
    take = lambda x: np.take_along_axis(x, order, axis=1)  # noqa: E731
    positions = np.broadcast_to(np.arange(size, dtype=np.int32), (n, size))
    return {"inputs": take(rows[:, :-1]), "targets": take(rows[:, 1:]),
            "positions": take(positions), "segment_ids": segment_ids, "order": order}


def on_mesh(batch: dict, mesh) -> dict:
    """The batch as global arrays sharded P('data', 'seq'); every process holds all rows (they
    are few) and hands each of its devices its part."""
    sharding = jax.NamedSharding(mesh, jax.P(parallel.DATA, parallel.SEQ))
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
            for k, v in batch.items()}


def make_position_eval(graphdef, buckets: int):
    """A jitted fn(params, batch) -> (sum of token losses [buckets], tokens [buckets]), each
    bucket an equal range of original positions."""

    @jax.jit
    def evaluate(params, batch):
        net = nnx.merge(graphdef, params)
        x = net.hidden(batch["inputs"], batch["positions"], batch["segment_ids"],
                       batch["order"])
        nll = loss.token_nll(x, net.head_weight(), batch["targets"], mesh=net.mesh,
                             chunk=net.cfg.loss_chunk, soft_cap=net.cfg.final_logit_soft_cap)
        bucket = (batch["order"] * buckets // batch["order"].shape[1]).reshape(-1)
        sums = jnp.zeros(buckets, jnp.float32).at[bucket].add(nll.reshape(-1))
        return sums, jnp.zeros(buckets, jnp.float32).at[bucket].add(1.0)

    return evaluate


def curve(evaluate, params, batch) -> list[float]:
    """The mean loss of each bucket, as floats."""
    sums, counts = evaluate(params, batch)
    return [float(s / c) for s, c in zip(jax.device_get(sums), jax.device_get(counts))]
