"""`pallas_gpu`: the block pair as a Pallas kernel with the
Triton lowering. On a CPU backend it runs in Pallas' interpret mode (slow, exact).

One program per (query head, query tile): it loads its tile of queries once and walks the key
tiles of its causal prefix (hi, from cost.tile_plan), keeping the online-softmax state in
registers; the prefix is that of its own batch row (positions are per row). Masks come from
the positions and segment ids passed in, so one kernel serves every layout. With segment ids, a
tile whose query and key segment-id ranges are disjoint (the cost model's SKIP rule, per batch
row) is branched around: no loads, no matmuls. Under a plain causal mask (no window, no
documents) the tiles whose pairs are all visible, every tile below the diagonal, run in a loop of
their own without the mask's comparisons and selects; the masked loop is left the diagonal.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from parallel import cost
from parallel.kernels.base import (InterpretableKernel, dscores, exponent_scale, logits,
                                   probabilities, softmax_fold, softmax_result, varying, visible)
from parallel.strategy_cost import TileGrid

F32 = jnp.float32
# Triton's launch parameters per head_dim: (num_warps, num_stages), with the tiles of max_tiles
# below. Measured on an H100 (BENCHMARKS.md, "On a GPU"; scripts/bench/gpu_tiles.py): at head_dim
# 64 and 128 in bf16, 64 x 64 tiles with 4 warps and 2 stages were fastest forward + backward of
# the 20 choices tried (128 x 64 tiles ran the backward 2.4x slower at head_dim 128, and 3 stages
# of them did not fit in shared memory). A head_dim not listed takes DEFAULT_LAUNCH. Passing
# Triton compiler parameters also selects the Triton lowering (JAX's default is Mosaic GPU).
LAUNCH = {64: (4, 2), 128: (4, 2)}
DEFAULT_LAUNCH = (4, 2)
# Whether the fully visible tiles under a plain causal mask run in their own unmasked loop
# (`_splits`); False puts every tile through the masked loop. Read when the kernel is traced, so
# scripts/bench/gpu_tiles.py can time both in one run.
SPLIT_FULL_TILES = True


def _triton(head_dim):
    """Each pallas_call's compiler parameters (LAUNCH), read when the kernel is traced."""
    warps, stages = LAUNCH.get(head_dim, DEFAULT_LAUNCH)
    return pl_triton.CompilerParams(num_warps=warps, num_stages=stages)


def _f32_like(x, shape):
    """An output shape: float32, varying over the same mesh axes as `x` (inside shard_map with
    check_vma a pallas_call must say how its outputs vary)."""
    mat = jax.typeof(x).mat
    return jax.ShapeDtypeStruct(shape, F32, manual_axis_type=None if mat.empty else mat)


def _dot(a, b, contract_a, contract_b, tiles):
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                           preferred_element_type=F32, precision=tiles.precision)


def _unless_apart(masked, q_pos, k_pos, q_seg, k_seg, tiles, compute, state):
    """compute(state), or state unchanged when no pair of the tile can be visible: its query
    and key segment-id ranges are disjoint, or a window keeps its positions apart
    (cost.tile_plan's SKIP rule, per batch row). A tile not `masked` sees every pair: computed."""
    if not masked:
        return compute(state)
    meet = None
    if tiles.mask.bounded:
        # The first and last positions as min and max (they increase): Triton's lowering has
        # no `slice` for q_pos[0] (seen on an H100).
        meet = tiles.mask.may_meet(q_pos.min(), q_pos.max(), k_pos.min(), k_pos.max())
    if q_seg is not None:
        apart = (q_seg.min() <= k_seg.max()) & (k_seg.min() <= q_seg.max())
        meet = apart if meet is None else meet & apart
    if meet is None:
        return compute(state)
    return lax.cond(meet, compute, lambda state: state, state)


def _splits(tiles, q_seg) -> bool:
    """Whether the loops run their fully visible tiles apart from the masked ones, unmasked: under
    a causal mask without a window or documents, where those tiles are a prefix of a query tile's
    key tiles (and a suffix of a key tile's query tiles), since positions increase."""
    return (SPLIT_FULL_TILES and tiles.mask.causal and tiles.mask.window is None
            and q_seg is None)


def _full_limits(plan, split, axis):
    """The tiles of each loop that need no mask (cost.FULL), counted along `axis` of the plan
    [b, Tq, Tk]; zeros where the loops are not split."""
    return (plan == cost.FULL).sum(axis=axis) * split


def _split_loops(start, stop, full, split, full_first, loop, state):
    """lax.fori_loop(start, stop, loop(masked=True), state); with `split`, the `full` tiles of
    the range that see every pair (its first ones when full_first, else its last) through
    loop(False) instead."""
    if not split:
        return lax.fori_loop(start, stop, loop(True), state)
    mid = start + full if full_first else stop - full
    state = lax.fori_loop(start, mid, loop(not full_first), state)
    return lax.fori_loop(mid, stop, loop(full_first), state)


def _forward_kernel(hi_ref, full_ref, q_ref, k_ref, v_ref, qp_ref, kp_ref, *rest, tiles,
                    with_segments, split):
    if with_segments:
        qs_ref, ks_ref, o_ref, lse_ref = rest
    else:
        (o_ref, lse_ref), qs_ref, ks_ref = rest, None, None
    tk = tiles.tile_k
    q = q_ref[...]
    q_pos = qp_ref[...]
    q_seg = None if qs_ref is None else qs_ref[...]

    def loop(masked):
        def body(kt, state):
            keys = pl.ds(kt * tk, tk)
            k_seg = None if ks_ref is None else ks_ref[keys]

            def compute(state):
                o, m, l = state
                k, v = k_ref[keys, :], v_ref[keys, :]
                s = logits(_dot(q, k, 1, 1, tiles), tiles)
                mask = visible(q_pos, k_pos, q_seg, k_seg, tiles.mask) if masked else None
                if mask is not None:
                    s = jnp.where(mask, s, -jnp.inf)
                p, alpha, m, l = softmax_fold(m, l, s, mask is not None, exponent_scale(tiles))
                return o * alpha[:, None] + _dot(p.astype(v.dtype), v, 1, 0, tiles), m, l

            k_pos = kp_ref[keys] if masked else None
            return _unless_apart(masked, q_pos, k_pos, q_seg, k_seg, tiles, compute, state)
        return body

    rows, d = q.shape
    state = (jnp.zeros((rows, d), F32), jnp.full((rows,), -jnp.inf, F32), jnp.zeros((rows,), F32))
    # The key tiles that see every pair are a prefix.
    o, m, l = _split_loops(0, hi_ref[0], full_ref[0], split, True, loop, state)
    o_ref[...], lse_ref[...] = softmax_result(o, m, l, exponent_scale(tiles))


def _row_limits(limits, heads):
    """Per-row loop limits [b, T] (hi or lo) -> an input [b * T, 1] and the BlockSpec that gives
    program (query head r, tile i) its row's entry."""
    per_row = limits.shape[1]
    spec = pl.BlockSpec((None, 1), lambda r, i: ((r // heads) * per_row + i, 0))
    return limits.astype(jnp.int32).reshape(-1, 1), spec


def forward(q, k, v, q_pos, k_pos, q_seg, k_seg, tiles, *, interpret):
    b, heads, n, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    tq, tk = tiles.tile_q, tiles.tile_k
    n_k = k.shape[2]  # a halo's key block may be shorter than the query block
    hi, plan = cost.tile_plan(q_pos, k_pos, q_seg, k_seg, tq, tk, tiles.mask, xp=jnp)
    count = cost.tiles_run(plan, b, xp=jnp)  # what its programs compute, per batch row
    split = _splits(tiles, q_seg)
    full, _ = _row_limits(_full_limits(plan, split, axis=2), heads)
    hi, hi_spec = _row_limits(hi, heads)
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    row_q = pl.BlockSpec((None, tq, d), lambda r, i: (r, i, 0))
    row_kv = pl.BlockSpec((None, n_k, d), lambda r, i: (r // g, 0, 0))
    q_rows = pl.BlockSpec((None, tq), lambda r, i: (r // heads, i))
    k_rows = pl.BlockSpec((None, n_k), lambda r, i: (r // heads, 0))
    inputs = [hi, full, flat(q), flat(k), flat(v), q_pos, k_pos]
    specs = [hi_spec, hi_spec, row_q, row_kv, row_kv, q_rows, k_rows]
    if q_seg is not None:
        inputs += [q_seg, k_seg]
        specs += [q_rows, k_rows]
    kernel = functools.partial(_forward_kernel, tiles=tiles, with_segments=q_seg is not None,
                               split=split)
    out, lse = pl.pallas_call(
        kernel, grid=(b * heads, n // tq), in_specs=specs,
        out_specs=[row_q, pl.BlockSpec((None, tq), lambda r, i: (r, i))],
        out_shape=[_f32_like(q, (b * heads, n, d)), _f32_like(q, (b * heads, n))],
        compiler_params=_triton(d), interpret=interpret)(*varying(inputs, tiles))
    return out.reshape(q.shape), lse.reshape(b, heads, n), varying(count, tiles)


def _probabilities(q, k, lse, q_pos, k_pos, q_seg, k_seg, tiles, masked):
    """Final probabilities of a (query tile, key tile) from the GLOBAL lse, 0 where masked (a
    tile `masked` False sees every pair), and the soft cap's slope (None without one:
    base.probabilities)."""
    p, slope = probabilities(_dot(q, k, 1, 1, tiles), lse[:, None], tiles)
    mask = visible(q_pos, k_pos, q_seg, k_seg, tiles.mask) if masked else None
    return (p if mask is None else jnp.where(mask, p, 0.0)), slope



def _dkdv_kernel(lo_ref, full_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qp_ref,
                 kp_ref, *rest, tiles, with_segments, num_q_tiles, split):
    """One (query head, key tile): walks the query tiles that can see it, from lo; with `split`,
    the last full_ref[0] of them, which see all of it, unmasked."""
    if with_segments:
        qs_ref, ks_ref, dk_ref, dv_ref = rest
    else:
        (dk_ref, dv_ref), qs_ref, ks_ref = rest, None, None
    tq = tiles.tile_q
    k, v, k_pos = k_ref[...], v_ref[...], kp_ref[...]
    k_seg = None if ks_ref is None else ks_ref[...]

    def loop(masked):
        def body(qt, grads):
            rows = pl.ds(qt * tq, tq)
            q_seg = None if qs_ref is None else qs_ref[rows]

            def compute(grads):
                dk, dv = grads
                q, do = q_ref[rows, :], do_ref[rows, :]
                p, slope = _probabilities(q, k, lse_ref[rows], q_pos, k_pos, q_seg, k_seg, tiles,
                                          masked)
                dv = dv + _dot(p.astype(do.dtype), do, 0, 0, tiles)
                ds = dscores(p, slope, _dot(do, v, 1, 1, tiles) - delta_ref[rows][:, None])
                return dk + _dot(ds.astype(q.dtype), q, 0, 0, tiles), dv

            q_pos = qp_ref[rows] if masked else None
            return _unless_apart(masked, q_pos, k_pos, q_seg, k_seg, tiles, compute, grads)
        return body

    zeros = jnp.zeros(k.shape, F32)
    # The query tiles that see every key of this tile are a suffix.
    dk, dv = _split_loops(lo_ref[0], num_q_tiles, full_ref[0], split, False, loop, (zeros, zeros))
    dk_ref[...] = dk * tiles.scale
    dv_ref[...] = dv


def _dq_kernel(hi_ref, full_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qp_ref,
               kp_ref, *rest, tiles, with_segments, split):
    """One (query head, query tile): walks the key tiles of its causal prefix; with `split`, the
    first full_ref[0] of them, which it sees whole, unmasked."""
    if with_segments:
        qs_ref, ks_ref, dq_ref = rest
    else:
        (dq_ref,), qs_ref, ks_ref = rest, None, None
    tk = tiles.tile_k
    q, do, lse, delta, q_pos = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...], qp_ref[...]
    q_seg = None if qs_ref is None else qs_ref[...]

    def loop(masked):
        def body(kt, dq):
            keys = pl.ds(kt * tk, tk)
            k_seg = None if ks_ref is None else ks_ref[keys]

            def compute(dq):
                k = k_ref[keys, :]
                p, slope = _probabilities(q, k, lse, q_pos, k_pos, q_seg, k_seg, tiles, masked)
                ds = dscores(p, slope, _dot(do, v_ref[keys, :], 1, 1, tiles) - delta[:, None])
                return dq + _dot(ds.astype(k.dtype), k, 1, 0, tiles)

            k_pos = kp_ref[keys] if masked else None
            return _unless_apart(masked, q_pos, k_pos, q_seg, k_seg, tiles, compute, dq)
        return body

    # The key tiles that see every pair are a prefix.
    dq = _split_loops(0, hi_ref[0], full_ref[0], split, True, loop, jnp.zeros(q.shape, F32))
    dq_ref[...] = dq * tiles.scale


def backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles, *, interpret):
    b, heads, n, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    tq, tk = tiles.tile_q, tiles.tile_k
    n_k = k.shape[2]  # a halo's key block may be shorter than the query block
    hi, plan = cost.tile_plan(q_pos, k_pos, None, None, tq, tk, tiles.mask, xp=jnp)
    # lo[row, kt]: the first query tile whose causal prefix reaches key tile kt.
    lo = (hi[:, :, None] <= jnp.arange(n_k // tk)[None, None, :]).sum(axis=1)
    split = _splits(tiles, q_seg)
    full_q, _ = _row_limits(_full_limits(plan, split, axis=2), heads)  # per query tile
    full_k, _ = _row_limits(_full_limits(plan, split, axis=1), heads)  # per key tile
    (hi, hi_spec), (lo, lo_spec) = _row_limits(hi, heads), _row_limits(lo, heads)
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    whole_q = pl.BlockSpec((None, n, d), lambda r, i: (r, 0, 0))
    whole_kv = pl.BlockSpec((None, n_k, d), lambda r, i: (r // g, 0, 0))
    whole_row = pl.BlockSpec((None, n), lambda r, i: (r, 0))
    # Positions and segment ids: the batch row of query head r, whole or one tile of it.
    of_row = lambda size, block: pl.BlockSpec((None, size), lambda r, i: (r // heads, block(i)))
    arrays = [flat(q), flat(k), flat(v), flat(do), flat(lse), flat(delta), q_pos, k_pos]
    with_segments = q_seg is not None
    segs = [q_seg, k_seg] if with_segments else []

    key_tile = pl.BlockSpec((None, tk, d), lambda r, i: (r // g, i, 0))
    dkdv_rows = [of_row(n, lambda i: 0), of_row(tk, lambda i: i)]
    dkdv_specs = [lo_spec, lo_spec, whole_q, key_tile, key_tile, whole_q, whole_row, whole_row,
                  *dkdv_rows, *(dkdv_rows if with_segments else [])]
    out_tile = pl.BlockSpec((None, tk, d), lambda r, i: (r, i, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, tiles=tiles, with_segments=with_segments,
                          num_q_tiles=n // tq, split=split),
        grid=(b * heads, n_k // tk), in_specs=dkdv_specs, out_specs=[out_tile, out_tile],
        out_shape=[_f32_like(q, (b * heads, n_k, d))] * 2,
        compiler_params=_triton(d),
        interpret=interpret)(*varying([lo, full_k, *arrays, *segs], tiles))

    query_tile = pl.BlockSpec((None, tq, d), lambda r, i: (r, i, 0))
    row_tile = pl.BlockSpec((None, tq), lambda r, i: (r, i))
    dq_rows = [of_row(tq, lambda i: i), of_row(n_k, lambda i: 0)]
    dq_specs = [hi_spec, hi_spec, query_tile, whole_kv, whole_kv, query_tile, row_tile, row_tile,
                *dq_rows, *(dq_rows if with_segments else [])]
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, tiles=tiles, with_segments=with_segments, split=split),
        grid=(b * heads, n // tq), in_specs=dq_specs, out_specs=query_tile,
        out_shape=_f32_like(q, (b * heads, n, d)),
        compiler_params=_triton(d),
        interpret=interpret)(*varying([hi, full_q, *arrays, *segs], tiles))
    # dK, dV were made per query head; the g query heads of a KV head add up.
    per_kv = lambda x: x.reshape(b, kv_heads, g, n_k, d).sum(axis=2)
    return dq.reshape(q.shape), per_kv(dk), per_kv(dv)


class PallasGpuKernel(InterpretableKernel):
    name = "pallas_gpu"
    platforms = ("gpu", "cpu")
    fused_on = ("gpu",)
    max_tiles = (64, 64)  # measured on an H100: see LAUNCH above
    grid = TileGrid(per_head=True)  # a program per (row, head, query tile); live key tiles only


KERNEL = PallasGpuKernel(forward, backward)
