"""One ring step on one device: its query block against the key/value block it holds, by tiles.

Shapes inside the kernel (per device; b = local batch, n = block = seq/N, h = KV heads,
g = query heads per KV head, d = head dim):

    q, dq, o  [b, n, h, g, d]      (query heads h*g reshaped; no transpose)
    k, v      [b, n, h, d]         (only the KV heads exist, and travel)
    m, l, lse [b, h, g, n]         float32 row statistics
    pos       [n]                  original token indices of a block, increasing
    seg       [b, n] or None       segment (document) ids

A block pair is cut into tiles of tile_q x tile_k. Because original indices increase along every
block, the key tiles a query tile can see under the causal mask are a prefix [0, hi) of the key
tiles, with hi computed from the first key index of each tile and the last query index of the
query tile. The loops run only over that prefix: a fully masked tile is never visited, so it costs
no matmul, and this is real control flow (a while loop per device), not a `select` that evaluates
both sides. Inside the prefix, a tile whose query and key segment-id ranges do not overlap for any
batch row is skipped by `lax.cond` (again real control flow: nothing here is vmapped).

Example (causal, striped, N=4, block 8, tile 2): device 1 holds positions [1 5 9 ... 29];
key block from device 3 holds [3 7 11 ... 31]. Query tile 0 = {1, 5}, last index 5; key tiles
start at 3, 11, 19, 27: only key tile 0 can be visible, hi = 1 for query tile 0, and the
device computes 1 + 2 + 3 + 4 = 10 of the 16 tiles on that step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class TileSpec:
    """Static parameters of the tiled block computation."""

    tile_q: int
    tile_k: int
    causal: bool
    scale: float
    precision: lax.Precision | None  # HIGHEST for float32 inputs (TPU would use bf16 passes)
    varying_axes: tuple[str, ...]  # mesh axes the kernel's values vary over (for check_vma)


def varying(x, spec: TileSpec):
    """Marks a freshly created array as varying over the kernel's mesh axes (shard_map typing)."""
    return jax.tree.map(lambda a: lax.pcast(a, spec.varying_axes, to="varying"), x)


def key_tile_limits(q_pos, k_pos, spec: TileSpec):
    """hi[qt] = number of leading key tiles that may hold a key visible to query tile qt. [Tq]"""
    n_q, n_k = q_pos.shape[0] // spec.tile_q, k_pos.shape[0] // spec.tile_k
    if not spec.causal:
        return jnp.full((n_q,), n_k, jnp.int32)
    q_last = q_pos[spec.tile_q - 1::spec.tile_q]  # largest original index in each query tile
    k_first = k_pos[::spec.tile_k]  # smallest original index in each key tile
    return jnp.sum(k_first[None, :] <= q_last[:, None], axis=1, dtype=jnp.int32)


def segment_ranges(seg, tile):
    """(min, max) segment id of each tile, per batch row: two [b, T] arrays."""
    if seg is None:
        return None
    tiled = seg.reshape(seg.shape[0], -1, tile)
    return tiled.min(axis=-1), tiled.max(axis=-1)


def tiles_can_meet(q_ranges, k_ranges, qt, kt):
    """False when, in every batch row, the two tiles' segment-id ranges are disjoint."""
    if q_ranges is None:
        return jnp.bool_(True)
    (q_lo, q_hi), (k_lo, k_hi) = q_ranges, k_ranges
    overlap = (q_lo[:, qt] <= k_hi[:, kt]) & (k_lo[:, kt] <= q_hi[:, qt])
    return jnp.any(overlap)


def tile_mask(q_pos, k_pos, q_seg, k_seg, causal):
    """Visibility of key j to query i: [b or 1, 1, 1, tq, tk] bool, or None if all visible."""
    mask = None
    if causal:
        mask = (k_pos[None, :] <= q_pos[:, None])[None]
    if q_seg is not None:
        same = q_seg[:, :, None] == k_seg[:, None, :]
        mask = same if mask is None else mask & same
    return None if mask is None else mask[:, None, None]


def _slice(x, start, size, axis):
    return None if x is None else lax.dynamic_slice_in_dim(x, start, size, axis)


def _scores(q_t, k_t, spec):
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q_t, k_t, preferred_element_type=F32,
                   precision=spec.precision)
    return s * spec.scale


def _for_each_visible_tile(q_pos, k_pos, q_seg, k_seg, spec, query_tile_fn, init):
    """Runs query_tile_fn(qt, kt, carry) over every tile that is not fully masked.

    Returns (carry, number of tiles computed). The visit order is query tile major.
    """
    limits = key_tile_limits(q_pos, k_pos, spec)
    q_ranges = segment_ranges(q_seg, spec.tile_q)
    k_ranges = segment_ranges(k_seg, spec.tile_k)

    def over_key_tiles(qt, state):
        def visit(kt, state):
            carry, count = state
            meet = tiles_can_meet(q_ranges, k_ranges, qt, kt)
            return lax.cond(meet, lambda c: (query_tile_fn(qt, kt, c[0]), c[1] + 1),
                            lambda c: c, (carry, count))
        return lax.fori_loop(0, limits[qt], visit, state)

    count = varying(jnp.zeros((), jnp.int32), spec)
    return lax.fori_loop(0, limits.shape[0], over_key_tiles, (init, count))


def forward_block(q, k, v, q_pos, k_pos, q_seg, k_seg, acc, spec: TileSpec):
    """Folds one key/value block into the running online-softmax state of the query block.

    acc = (o [b,n,h,g,d] f32 unnormalised, m [b,h,g,n] f32 running max, l [b,h,g,n] f32 running
    sum). Returns (acc, tiles computed).
    """
    tq, tk = spec.tile_q, spec.tile_k

    def tile(qt, kt, acc):
        o, m, l = acc
        q0, k0 = qt * tq, kt * tk
        q_t, k_t, v_t = _slice(q, q0, tq, 1), _slice(k, k0, tk, 1), _slice(v, k0, tk, 1)
        o_t, m_t, l_t = _slice(o, q0, tq, 1), _slice(m, q0, tq, 3), _slice(l, q0, tq, 3)
        mask = tile_mask(_slice(q_pos, q0, tq, 0), _slice(k_pos, k0, tk, 0),
                         _slice(q_seg, q0, tq, 1), _slice(k_seg, k0, tk, 1), spec.causal)
        s = _scores(q_t, k_t, spec)  # [b, h, g, tq, tk]
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf)
        m_new = jnp.maximum(m_t, s.max(axis=-1))
        # A row with nothing visible so far keeps m = -inf; shift by 0 there so that
        # exp(-inf - -inf) never produces NaN.
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m_t - m_safe)
        l_t = alpha * l_t + p.sum(axis=-1)
        pv = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v.dtype), v_t, preferred_element_type=F32,
                        precision=spec.precision)
        o_t = o_t * jnp.moveaxis(alpha, 3, 1)[..., None] + pv
        return (lax.dynamic_update_slice_in_dim(o, o_t, q0, 1),
                lax.dynamic_update_slice_in_dim(m, m_new, q0, 3),
                lax.dynamic_update_slice_in_dim(l, l_t, q0, 3))

    return _for_each_visible_tile(q_pos, k_pos, q_seg, k_seg, spec, tile, acc)


def backward_block(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, grads, spec: TileSpec):
    """Adds one key/value block's contribution to dq (local) and dk, dv (travelling with k, v).

    do [b,n,h,g,d]; lse, delta [b,h,g,n] f32 (global log-sum-exp and rowsum(dO * O));
    grads = (dq [b,n,h,g,d], dk [b,n,h,d], dv [b,n,h,d]), all float32.
    Probabilities are recomputed as exp(s - lse) with the global lse, so they are final.
    """
    tq, tk = spec.tile_q, spec.tile_k

    def tile(qt, kt, grads):
        dq, dk, dv = grads
        q0, k0 = qt * tq, kt * tk
        q_t, k_t, v_t = _slice(q, q0, tq, 1), _slice(k, k0, tk, 1), _slice(v, k0, tk, 1)
        do_t = _slice(do, q0, tq, 1)
        lse_t, delta_t = _slice(lse, q0, tq, 3), _slice(delta, q0, tq, 3)
        mask = tile_mask(_slice(q_pos, q0, tq, 0), _slice(k_pos, k0, tk, 0),
                         _slice(q_seg, q0, tq, 1), _slice(k_seg, k0, tk, 1), spec.causal)
        p = jnp.exp(_scores(q_t, k_t, spec) - lse_t[..., None])  # [b, h, g, tq, tk]
        if mask is not None:
            p = jnp.where(mask, p, 0.0)  # also drops rows with lse = -inf (nothing visible)
        dv_t = jnp.einsum("bhgqk,bqhgd->bkhd", p.astype(do.dtype), do_t,
                          preferred_element_type=F32, precision=spec.precision)
        dp = jnp.einsum("bqhgd,bkhd->bhgqk", do_t, v_t, preferred_element_type=F32,
                        precision=spec.precision)
        ds = p * (dp - delta_t[..., None]) * spec.scale
        dq_t = jnp.einsum("bhgqk,bkhd->bqhgd", ds.astype(k.dtype), k_t,
                          preferred_element_type=F32, precision=spec.precision)
        dk_t = jnp.einsum("bhgqk,bqhgd->bkhd", ds.astype(q.dtype), q_t,
                          preferred_element_type=F32, precision=spec.precision)
        add = lambda acc, upd, start: lax.dynamic_update_slice_in_dim(
            acc, _slice(acc, start, upd.shape[1], 1) + upd, start, 1)
        return add(dq, dq_t, q0), add(dk, dk_t, k0), add(dv, dv_t, k0)

    grads, _ = _for_each_visible_tile(q_pos, k_pos, q_seg, k_seg, spec, tile, grads)
    return grads
