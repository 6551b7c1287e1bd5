"""The ring strategy under a sliding window: each device receives only the keys its window
reaches (a halo), not every block.

With a window of W tokens and contiguous chunks (the ring and zigzag layouts), a query block
needs the W - 1 keys before each of its chunks (and after, when bidirectional): a few neighbours'
edges. `plan` works out, from the layout's positions and the mask alone, which key tiles of
every other device's block each device's queries can see; for each ring distance t every device
that has something to give sends the same number of tiles to the device t ahead, and nothing
goes where no one needs it. Striped spreads every window over all devices: every block
is needed whole, the plan saves nothing, and the ring runs as without a window.

    ring layout, N = 8, block 4,096, W = 1,024, tiles 512:
        t = 1: each device sends its last 2 key tiles (the 1,023 keys before the next block,
               in whole tiles) to the next;
        t = 2 .. 7: nothing                  -> 1,024 keys received instead of 28,672

The transfers are issued before the device's own block is computed, so they overlap it. Device
t-ahead receivers that need nothing get nothing and compute nothing. The backward sends the same
halos again (recomputed, as the ring's backward re-sends its blocks), and returns each halo's dK
and dV to the device it came from, which adds them at the slice's place.

The plan assumes the positions are the layout's own formula (as `parallel.permutation` and the
data pipeline place them); a data-dependent layout (balanced) places tokens from the documents
and keeps the whole ring.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel.kernels.base import varying
from parallel.mask import Mask
from parallel.mesh import SEQ
from parallel.strategies import base


@dataclasses.dataclass(frozen=True)
class Shift:
    """One ring distance t of the plan: every source device in `pairs` sends key tiles
    `tiles[source]` of its block (tile_k keys each, increasing) to the device t ahead."""

    distance: int
    tile_k: int
    tiles: tuple[tuple[int, ...], ...]  # per source device, the same count for every one
    pairs: tuple[tuple[int, int], ...]  # (source, destination)

    @property
    def length(self) -> int:
        """Keys each receiver gets."""
        return len(self.tiles[0]) * self.tile_k

    def receives(self, num_shards: int) -> np.ndarray:
        """bool [N]: which devices receive on this shift."""
        got = np.zeros(num_shards, bool)
        got[[dst for _, dst in self.pairs]] = True
        return got


def _needed(q_pos: np.ndarray, k_pos: np.ndarray, mask: Mask) -> np.ndarray:
    """Indices of the keys k_pos [n] that some query of q_pos [n] (both increasing) may see."""
    low, high = mask.query_bounds(k_pos)
    first = np.searchsorted(q_pos, low)  # the first query at or after `low`
    seen = first < len(q_pos)
    seen[seen] = q_pos[first[seen]] <= high[seen]
    return np.nonzero(seen)[0]


def _padded(needed: set, count: int, num_tiles: int) -> tuple[int, ...]:
    """`needed` tile indices plus the nearest other tiles of the block up to `count`, sorted:
    every source sends as many tiles (one transfer shape), all of them real, distinct keys,
    which the receiver's masks and tile plan treat as any others."""
    chosen = set(needed)
    centre = min(needed)
    for i in sorted(range(num_tiles), key=lambda i: (abs(i - centre), i)):
        if len(chosen) == count:
            break
        chosen.add(i)
    return tuple(sorted(chosen))


@functools.lru_cache(maxsize=64)
def plan(layout, num_shards: int, block: int, mask: Mask, tile_k: int):
    """The halo exchange of one layer: a tuple of Shifts, or None when the layout's blocks are
    needed whole (no window, a data-dependent layout, or no saving: striped)."""
    if not mask.bounded or layout.data_dependent or num_shards == 1:
        return None
    pos = layout.permutation(num_shards * block, num_shards).reshape(num_shards, block)
    num_tiles = block // tile_k
    shifts, received = [], 0
    for t in range(1, num_shards):
        wanted = {}  # source -> the key tiles its destination needs
        for dst in range(num_shards):
            src = (dst - t) % num_shards
            needed = _needed(pos[dst], pos[src], mask)
            if len(needed):
                wanted[src] = set((needed // tile_k).tolist())
        if not wanted:
            continue
        count = max(len(w) for w in wanted.values())
        tiles = tuple(_padded(wanted[s], count, num_tiles) if s in wanted else
                      tuple(range(count)) for s in range(num_shards))
        pairs = tuple((s, (s + t) % num_shards) for s in sorted(wanted))
        shifts.append(Shift(t, tile_k, tiles, pairs))
        received += count * tile_k
    if received >= (num_shards - 1) * block:
        return None
    return tuple(shifts)


def received_tokens(shifts, num_shards: int, block: int) -> np.ndarray:
    """int64 [N]: key/value tokens each device receives in the forward under the plan (None:
    the whole ring, N - 1 blocks)."""
    if shifts is None:
        return np.full(num_shards, (num_shards - 1) * block, np.int64)
    got = np.zeros(num_shards, np.int64)
    for shift in shifts:
        got += shift.length * shift.receives(num_shards)
    return got


def _this_device(table):
    """The entry of a static per-device table for the device that runs this."""
    return jnp.asarray(table)[lax.axis_index(SEQ)]


def _tiles_of(x, axis, tile):
    """x with its token axis split into [tiles, tile]."""
    return x.reshape(*x.shape[:axis], x.shape[axis] // tile, tile, *x.shape[axis + 1:])


def _cut(x, axis, shift):
    """This device's tiles of x along `axis` for the shift, concatenated."""
    picked = jnp.take(_tiles_of(x, axis, shift.tile_k), _this_device(shift.tiles), axis=axis)
    return picked.reshape(*x.shape[:axis], shift.length, *x.shape[axis + 1:])


def _send(shift: Shift, block, tiles):
    """This device's tiles of its key block (head-major K, V, segment ids, positions) to the
    device shift.distance ahead; what arrives from the one behind."""
    k, v, seg, pos = block
    kv = lax.ppermute(jnp.stack([_cut(k, 2, shift), _cut(v, 2, shift)]), SEQ, shift.pairs)
    ids = [_cut(pos, 1, shift)] + ([] if seg is None else [_cut(seg, 1, shift)])
    ids = lax.ppermute(jnp.stack(ids), SEQ, shift.pairs)
    return varying((kv[0], kv[1], None if seg is None else ids[1], ids[0]), tiles)


def _add_back(acc, part, shift):
    """acc [b, h, n, d] with part [b, h, length, d] added at this device's tiles of the shift."""
    tiled = _tiles_of(acc, 2, shift.tile_k)
    tiled = tiled.at[:, :, _this_device(shift.tiles)].add(_tiles_of(part, 2, shift.tile_k))
    return tiled.reshape(acc.shape)


def _only_receivers(shift, num_shards, run, nothing):
    """run() on a device that receives on this shift, nothing() on the others."""
    return lax.cond(_this_device(shift.receives(num_shards)), run, nothing)


def halo_forward(spec, shifts, qh, q_pos, q_seg, block, sinks=None):
    """ring_forward's result under the plan: the own block, then each shift's halo."""
    n_shards, tiles = spec.num_shards, spec.tiles
    arriving = [_send(shift, block, tiles) for shift in shifts]  # issued before the compute
    acc = base.empty_result(qh, tiles, sinks)
    acc, count = base.forward_step(spec, qh, q_pos, q_seg, block, acc)
    counts = varying(jnp.zeros((n_shards,), jnp.int32), tiles).at[0].set(count)
    for shift, halo in zip(shifts, arriving):
        def run(halo=halo, acc=acc):
            return base.forward_step(spec, qh, q_pos, q_seg, halo, acc)

        def nothing(acc=acc):
            return acc, varying(jnp.zeros((), jnp.int32), tiles)

        acc, count = _only_receivers(shift, n_shards, run, nothing)
        counts = counts.at[shift.distance].set(count)
    out, lse = acc
    return out, lse, counts


def halo_backward(spec, shifts, qh, doh, lse, delta, q_pos, q_seg, block):
    """ring_backward's result under the plan: (dq, dk, dv) float32 head-major, dk/dv of this
    device's block, each halo's share returned to the device it came from."""
    n_shards, tiles = spec.num_shards, spec.tiles
    arriving = [_send(shift, block, tiles) for shift in shifts]
    k, v, seg, k_pos = block
    dq, dk, dv = base.pair_backward(spec, qh, k, v, doh, lse, delta, q_pos, k_pos, q_seg, seg)
    for shift, (k_h, v_h, seg_h, pos_h) in zip(shifts, arriving):
        def run(k_h=k_h, v_h=v_h, seg_h=seg_h, pos_h=pos_h):
            return base.pair_backward(spec, qh, k_h, v_h, doh, lse, delta, q_pos, pos_h, q_seg,
                                      seg_h)

        def nothing(k_h=k_h):
            return varying((jnp.zeros(qh.shape, jnp.float32),
                            jnp.zeros(k_h.shape, jnp.float32),
                            jnp.zeros(k_h.shape, jnp.float32)), tiles)

        ddq, ddk, ddv = _only_receivers(shift, n_shards, run, nothing)
        dq = dq + ddq
        home = lax.ppermute(jnp.stack([ddk, ddv]), SEQ, [(d, s) for s, d in shift.pairs])
        dk, dv = _add_back(dk, home[0], shift), _add_back(dv, home[1], shift)
    return dq, dk, dv
