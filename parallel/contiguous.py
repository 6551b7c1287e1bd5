"""A layout's tokens as contiguous blocks and back, inside a shard_map over 'seq'.

A recurrent layer (model/mixers/gated_deltanet.py) scans the sequence in order: its state passing
wants device d to hold the d-th contiguous block of the row, the 'ring' layout. The other
layouts reach that order and come back: a token goes to the device whose block holds its
original index, into the slot of that index.

    x   [b, n, ...]   this device's tokens in the layout's order

    to_blocks(x, layout, order, block)    -> [b, n, ...]: original tokens d n .. d n + n - 1
    from_blocks(y, layout, order, block)  -> [b, n, ...]: back in the layout's order

A static layout (striped, zigzag) moves each token once: the permutation is known when the
program is traced, so each shift s of the devices that carries tokens is one ppermute of the
tokens device d sends device d + s (StaticPlan; striped: n / N tokens every shift; zigzag: its
two halves, two shifts a device), n tokens a device each way in all. A data-dependent layout
(balanced, each row its own placement from the batch's `order`) sends every device a whole
padded block with the tokens it holds there and zeros elsewhere: N blocks a device each way,
what an all-gather of the layer's input costs. Both are exact (a token is copied, never summed
with another) and differentiable (each is the other's transpose).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from parallel.layouts import get_layout
from parallel.mesh import SEQ


def local_positions(layout: str, order, block: int, num_shards: int):
    """The original indices of this device's tokens: the local `order` [b, n] when given (rows
    of their own placement), else the layout's formula, [1, n] (every row alike)."""
    if order is not None:
        return order.astype(jnp.int32)
    shard = jax.lax.axis_index(SEQ)
    return get_layout(layout).positions(shard, block, num_shards, xp=jnp)[None].astype(jnp.int32)


def to_blocks(x, layout: str, order, block: int):
    """This device's tokens x [b, n, ...] in `layout`'s order (order: their original indices,
    [b, n], required by a data-dependent layout) -> the contiguous block of its device index."""
    count = jax.lax.axis_size(SEQ)
    if not get_layout(layout).data_dependent:
        return _send(x, static_plan(layout, block, count), back=False)
    return _to_blocks_padded(x, local_positions(layout, order, block, count))


def from_blocks(y, layout: str, order, block: int):
    """to_blocks undone: the contiguous block y [b, n, ...] of this device -> its tokens in the
    layout's order."""
    count = jax.lax.axis_size(SEQ)
    if not get_layout(layout).data_dependent:
        return _send(y, static_plan(layout, block, count), back=True)
    return _from_blocks_padded(y, local_positions(layout, order, block, count))


@functools.lru_cache(maxsize=64)
def static_plan(layout: str, block: int, count: int) -> tuple:
    """A static layout's moves to contiguous blocks, per shift s of the devices that carries
    tokens: (the (d, d + s) pairs that send, the slots each device sends from [N, w], the slots
    each device puts what it receives into [N, w]), w the most any pair of that shift sends;
    unused entries point at slot `block` (a zero row: nothing moves). Example, striped, N = 2,
    n = 4 (device 0 holds 0 2 4 6): shift 0 keeps slots [0 1] -> [0 2]; shift 1 sends slots
    [2 3] (tokens 4, 6) to device 1's slots [0 2]."""
    pos = np.stack([get_layout(layout).positions(d, block, count, xp=np) for d in range(count)])
    dest, slot = pos // block, pos % block
    plan = []
    for shift in range(count):
        pairs = [(d, (d + shift) % count) for d in range(count)]
        moving = [np.nonzero(dest[d] == e)[0] for d, e in pairs]
        width = max(len(m) for m in moving)
        if not width:
            continue
        send = np.full((count, width), block, np.int32)
        put = np.full((count, width), block, np.int32)
        for (d, e), m in zip(pairs, moving):
            send[d, :len(m)], put[e, :len(m)] = m, slot[d, m]
        plan.append((tuple((d, e) for (d, e), m in zip(pairs, moving) if len(m)), send, put))
    return tuple(plan)


def _send(x, plan, back: bool):
    """x [b, n, ...] moved by a static_plan (back: its inverse)."""
    me = jax.lax.axis_index(SEQ)
    b, n = x.shape[:2]
    padded = jnp.concatenate([x, jnp.zeros((b, 1, *x.shape[2:]), x.dtype)], axis=1)
    out = jnp.zeros_like(padded)
    for pairs, send, put in plan:
        take, give = (put, send) if back else (send, put)
        moved = padded[:, jnp.asarray(take)[me]]
        if any(d != e for d, e in pairs):
            moved = jax.lax.ppermute(moved, SEQ, [(e, d) for d, e in pairs] if back else pairs)
        out = out.at[:, jnp.asarray(give)[me]].add(moved)  # unused entries add zeros to slot n
    return out[:, :n]


def _to_blocks_padded(x, pos):
    """to_blocks for a data-dependent layout: x [b, n, ...], original indices pos [b, n]."""
    b, n = x.shape[:2]
    count = jax.lax.axis_size(SEQ)
    pos = jnp.broadcast_to(pos, (b, n))
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    out = jnp.zeros((count, b, n, *x.shape[2:]), x.dtype)
    out = out.at[pos // n, rows, pos % n].set(x, unique_indices=True)
    out = jax.lax.all_to_all(out, SEQ, 0, 0)  # [source device, b, n, ...]
    return out.sum(axis=0, dtype=x.dtype)  # one source holds each slot, zeros elsewhere


def _from_blocks_padded(y, pos):
    """from_blocks for a data-dependent layout."""
    b, n = y.shape[:2]
    count = jax.lax.axis_size(SEQ)
    pos = jnp.broadcast_to(pos, (b, n))
    sent = jax.lax.all_to_all(jnp.broadcast_to(y[None], (count, *y.shape)), SEQ, 0, 0)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    return sent[pos // n, rows, pos % n]  # sent[e]: device e's block
