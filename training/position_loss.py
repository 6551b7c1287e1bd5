"""The loss as a function of position: does a model use the far context it was trained for?

    rows = long_documents(tokens, eos_id, length=8192, count=8)     # [n, 8193], one document each
    means = loss_by_position(model, rows, buckets=8)                # [8] mean NLL per 1,024 tokens

Each row is the start of one held-out document at least `length` + 1 tokens long (never packed,
so every position's context is its own document's); the model reads it in natural order at
positions 0 .. length-1, and the next-token loss is averaged over rows within equal buckets of
positions. A model that uses its context has a curve that keeps falling; one whose positions
have gone out of range (RoPE past the length it learned) rises after them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def long_documents(tokens: np.ndarray, eos_id: int, length: int, count: int) -> np.ndarray:
    """Up to `count` rows [n, length + 1]: the first length + 1 tokens of each document (EOS
    separated) that has at least that many, in stream order."""
    ends = np.flatnonzero(np.asarray(tokens) == eos_id)
    starts = np.concatenate([[0], ends + 1])[:len(ends)]
    long = [s for s, e in zip(starts, ends) if e - s >= length + 1][:count]
    if not long:
        return np.zeros((0, length + 1), np.int32)
    return np.stack([np.asarray(tokens[s:s + length + 1], np.int32) for s in long])


def loss_by_position(model, rows: np.ndarray, buckets: int) -> np.ndarray:
    """Mean next-token NLL (nats) in each of `buckets` equal ranges of positions, over the rows
    (one at a time: memory is one row's logits)."""
    length = rows.shape[1] - 1
    if length % buckets:
        raise ValueError(f"{buckets} buckets do not split {length} positions evenly")

    graphdef, state = nnx.split(model)

    @jax.jit
    def nll(state, inputs, targets):
        logits = nnx.merge(graphdef, state)(inputs[None])[0]
        picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
        return jax.nn.logsumexp(logits, axis=-1) - picked

    per_token = np.stack([np.asarray(nll(state, r[:-1], r[1:])) for r in rows])  # [n, length]
    return per_token.reshape(len(rows), buckets, length // buckets).mean(axis=(0, 2))
