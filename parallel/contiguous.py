"""A layout's tokens as contiguous blocks and back, inside a shard_map over 'seq'.

A recurrent layer (model/linear_attention.py) scans the sequence in order: its state passing
wants device d to hold the d-th contiguous block of the row, the 'ring' layout. The other
layouts reach that order and come back with one all-to-all each way: a token goes to the device
whose block holds its original index, into the slot of that index.

    x   [b, n, ...]   this device's tokens in the layout's order
    pos [b, n]        their original indices (the batch's `order`, or the layout's formula)

    to_blocks(x, pos)       -> [b, n, ...]: original tokens d n .. d n + n - 1 on device d
    from_blocks(y, pos)     -> [b, n, ...]: back in the layout's order

Both are exact (a token is copied, never summed with another) and differentiable (each is the
other's transpose). Padded: each device sends every other device a whole block with the tokens
it holds there and zeros elsewhere, N blocks a device each way, what an all-gather of the layer's
input costs; the rows of one call may each have their own placement (balanced).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from parallel.layouts import get_layout
from parallel.mesh import SEQ


def local_positions(layout: str, order, block: int, num_shards: int):
    """The original indices of this device's tokens: the local `order` [b, n] when given (rows
    of their own placement), else the layout's formula, [1, n] (every row alike)."""
    if order is not None:
        return order.astype(jnp.int32)
    shard = jax.lax.axis_index(SEQ)
    return get_layout(layout).positions(shard, block, num_shards, xp=jnp)[None].astype(jnp.int32)


def to_blocks(x, pos):
    """This device's tokens x [b, n, ...] (original indices pos [b, n] or [1, n]) -> the
    contiguous block of its device index, [b, n, ...]."""
    b, n = x.shape[:2]
    count = jax.lax.axis_size(SEQ)
    pos = jnp.broadcast_to(pos, (b, n))
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    out = jnp.zeros((count, b, n, *x.shape[2:]), x.dtype)
    out = out.at[pos // n, rows, pos % n].set(x, unique_indices=True)
    out = jax.lax.all_to_all(out, SEQ, 0, 0)  # [source device, b, n, ...]
    return out.sum(axis=0, dtype=x.dtype)  # one source holds each slot, zeros elsewhere


def from_blocks(y, pos):
    """to_blocks undone: the contiguous block y [b, n, ...] of this device -> its tokens in the
    layout's order, original indices pos."""
    b, n = y.shape[:2]
    count = jax.lax.axis_size(SEQ)
    pos = jnp.broadcast_to(pos, (b, n))
    sent = jax.lax.all_to_all(jnp.broadcast_to(y[None], (count, *y.shape)), SEQ, 0, 0)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    return sent[pos // n, rows, pos % n]  # sent[e]: device e's block
