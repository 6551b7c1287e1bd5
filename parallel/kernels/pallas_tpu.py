"""`pallas_tpu`: the block pair as Pallas TPU (Mosaic) kernels. On other backends they run in
Pallas' interpret mode (slow, exact), which is how CI checks them.

TPU kernels are written for the pipeline Pallas builds around them: the grid's last axis walks
the tiles of one reduction (key tiles for an output row of queries, query tiles for dK/dV),
Pallas copies the next tile into VMEM while the current one computes, and the running state
lives in VMEM scratch across that axis. The cost model's tile plan (cost.tile_plan) arrives as
scalar-prefetched SMEM arrays and decides, per grid step:

    past the causal prefix, or a SKIP tile    nothing runs; the index maps point at the last
                                              tile fetched, so no copy is issued either
    FULL                                      no mask is built
    MASKED                                    mask from positions and segment ids

Every value stays 2-D (TPU vector registers are [8, 128] tiles): the online-softmax state is
[rows, 1] columns in VMEM, positions and segment ids come as a column on the query side and a
row on the key side, and the dK/dV kernel computes the transposed scores k q^T so that lse and
delta broadcast as rows. lse and delta live in HBM as rows [heads, 1, n]: a float32 [n, 1]
column there is tiled to 128 lanes, 128 times its size (805 MB per layer for 32 heads at
49,152 tokens); the kernels turn a tile's row into a column, or back, in VMEM.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from parallel import cost
from parallel.kernels.base import (InterpretableKernel, dscores, exponent_scale, logits,
                                   probabilities, softmax_fold, softmax_result, varying,
                                   visible_pairs)
from parallel.strategy_cost import TileGrid

F32 = jnp.float32
LANES = 128  # on a TPU, tiles are multiples of the vector lane width (checked by check_tiles)
_REDUCE_LAST = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))
# The backward kernels' largest tile side. They hold three [tq, tk] float32 values at once
# (scores, probabilities, dP); at 1024 x 1024 the masked path needs 18.3 MB of VMEM, more than
# a TPU v4 core's 16 MiB (the TPU compiler's figure, tests/planner/test_tpu_compile.py). Larger forward
# tiles are split for the backward: the same pairs, the same FLOPs, in finer steps.
BACKWARD_TILE = 512


def _f32_like(x, shape):
    """A float32 output shape varying over the same mesh axes as `x` (check_vma)."""
    mat = jax.typeof(x).mat
    return jax.ShapeDtypeStruct(shape, F32, manual_axis_type=None if mat.empty else mat)


def _dot(a, b, contract_a, contract_b, tiles):
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                           preferred_element_type=F32, precision=tiles.precision)


class _Plan:
    """The tile plan of one block pair, flattened for SMEM, and the index arithmetic on it."""

    def __init__(self, q_pos, k_pos, q_seg, k_seg, b, tiles):
        self.tq, self.tk = tiles.tile_q, tiles.tile_k
        self.num_q, self.num_k = q_pos.shape[-1] // self.tq, k_pos.shape[-1] // self.tk
        hi, plan = cost.tile_plan(q_pos, k_pos, q_seg, k_seg, self.tq, self.tk, tiles.mask,
                                  xp=jnp)
        # lo[row, kt]: the first query tile whose causal prefix reaches key tile kt.
        lo = (hi[:, :, None] <= jnp.arange(self.num_k)[None, None, :]).sum(axis=1)
        # Positions are per batch row ([b, n]), so every row has its own plan and limits.
        self.hi, self.lo = hi.astype(jnp.int32).reshape(-1), lo.astype(jnp.int32).reshape(-1)
        self.plan = plan.reshape(-1)
        self.count = cost.tiles_run(plan, b, xp=jnp)

    def kind(self, plan_ref, row, qt, kt):
        """SKIP / FULL / MASKED of tile (qt, kt) in batch row `row`, inside a kernel."""
        return plan_ref[(row * self.num_q + qt) * self.num_k + kt]

    def limit(self, hi_ref, row, qt):
        """The causal prefix of query tile qt in batch row `row`."""
        return hi_ref[row * self.num_q + qt]

    def first(self, lo_ref, row, kt):
        """The first query tile of batch row `row` whose prefix reaches key tile kt."""
        return lo_ref[row * self.num_k + kt]

    def key_tile(self, hi_ref, row, qt, kt):
        """The key tile to fetch at grid step kt: past the prefix, the prefix's last one."""
        return jnp.maximum(jnp.minimum(kt, self.limit(hi_ref, row, qt) - 1), 0)

    def query_tile(self, lo_ref, row, kt, qt):
        """The query tile to fetch at grid step qt: before `lo`, the first one that is needed."""
        return jnp.minimum(jnp.maximum(qt, self.first(lo_ref, row, kt)), self.num_q - 1)


def _when_tile(kind, runs, compute):
    """Runs compute(masked) for a tile that runs: unmasked when FULL, masked when MASKED."""
    @pl.when(runs & (kind == cost.FULL))
    def _():
        compute(False)

    @pl.when(runs & (kind == cost.MASKED))
    def _():
        compute(True)


def _mask(s, masked, q_pos, k_pos, q_seg, k_seg, tiles):
    visible = visible_pairs(q_pos, k_pos, q_seg, k_seg, tiles.mask) if masked else None
    # No rule at all (bidirectional, no segment ids): every pair is visible. The masked branch
    # is still traced (pl.when compiles both), so it must not need a mask.
    return s if visible is None else jnp.where(visible, s, -jnp.inf)


def _segment_refs(rest, with_segments, n_out):
    """Splits the trailing refs: (q_seg, k_seg or None, None), outputs, scratch."""
    segs, rest = (rest[:2], rest[2:]) if with_segments else ((None, None), rest)
    return segs, rest[:n_out], rest[n_out:]


def _div(a, b):
    """a // b for the non-negative grid indices: lax.div, as Mosaic lowers no floor division."""
    return lax.div(a, jnp.int32(b))


def _read(ref):
    return None if ref is None else ref[...]


def _column_to_row(column):
    """[t, 1] -> [1, t] in VMEM (broadcast to the lanes, transpose, keep one row)."""
    return jnp.broadcast_to(column, (column.shape[0], LANES)).T[:1, :]


def _row_to_column(row):
    """[1, t] -> [t, 1] in VMEM."""
    return jnp.broadcast_to(row, (LANES, row.shape[1])).T[:, :1]


def _forward_kernel(hi_ref, plan_ref, q_ref, k_ref, v_ref, qp_ref, kp_ref, *rest, plan, tiles,
                    heads, with_segments):
    """Grid step (query head r, query tile qt, key tile kt): folds one key tile into the
    running softmax state; the last key tile writes the block's out and lse."""
    (qs_ref, ks_ref), (o_ref, lse_ref), (o_acc, m_acc, l_acc) = _segment_refs(
        rest, with_segments, 2)
    r, qt, kt = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(kt == 0)
    def _():
        o_acc[...] = jnp.zeros(o_acc.shape, F32)
        m_acc[...] = jnp.full(m_acc.shape, -jnp.inf, F32)
        l_acc[...] = jnp.zeros(l_acc.shape, F32)

    def compute(masked):
        s = logits(_dot(q_ref[...], k_ref[...], 1, 1, tiles), tiles)
        s = _mask(s, masked, qp_ref[...], kp_ref[...], _read(qs_ref), _read(ks_ref), tiles)
        p, alpha, m_acc[...], l_acc[...] = softmax_fold(m_acc[...], l_acc[...], s, masked,
                                                        exponent_scale(tiles))
        v = v_ref[...]
        o_acc[...] = o_acc[...] * alpha + _dot(p.astype(v.dtype), v, 1, 0, tiles)

    row = _div(r, heads)
    _when_tile(plan.kind(plan_ref, row, qt, kt), kt < plan.limit(hi_ref, row, qt), compute)

    @pl.when(kt == plan.num_k - 1)
    def _():
        o_ref[...], lse = softmax_result(o_acc[...], m_acc[...], l_acc[...],
                                         exponent_scale(tiles))
        lse_ref[...] = _column_to_row(lse)


def _flat(x):
    return x.reshape(-1, *x.shape[2:])


def _int32(x):
    return None if x is None else x.astype(jnp.int32)


class _KeyWalk:
    """BlockSpecs of a grid (query head r, query tile qt, key tile kt) that walks the key tiles
    of each query tile (the forward and dQ): a query tile and its [rows, 1] columns stay put
    across the walk, key tiles past the causal prefix repeat the prefix's last one."""

    def __init__(self, plan, q, k):
        b, heads, _, d = q.shape
        g = heads // k.shape[1]
        row = lambda r: _div(r, heads)  # the batch row of query head r
        key = lambda r, qt, kt, hi: plan.key_tile(hi, row(r), qt, kt)
        self.grid = (b * heads, plan.num_q, plan.num_k)
        self.q_tile = pl.BlockSpec((None, plan.tq, d), lambda r, qt, kt, *_: (r, qt, 0))
        self.q_row = pl.BlockSpec((None, 1, plan.tq), lambda r, qt, kt, *_: (r, 0, qt))
        self.kv_tile = pl.BlockSpec((None, plan.tk, d),
                                    lambda r, qt, kt, hi, _: (_div(r, g), key(r, qt, kt, hi), 0))
        # Positions and segment ids of the batch row: a column of the query tile, a row of the
        # key tile.
        self.row_specs = [
            pl.BlockSpec((None, plan.tq, 1), lambda r, qt, kt, *_: (row(r), qt, 0)),
            pl.BlockSpec((None, 1, plan.tk),
                         lambda r, qt, kt, hi, _: (row(r), 0, key(r, qt, kt, hi)))]

    def mask_inputs(self, q_pos, k_pos, q_seg, k_seg):
        """(arrays, specs): positions, and segment ids if any, query side as columns."""
        arrays = [_int32(q_pos)[:, :, None], _int32(k_pos)[:, None, :]]
        if q_seg is not None:
            arrays += [_int32(q_seg)[:, :, None], _int32(k_seg)[:, None, :]]
        return arrays, self.row_specs * (len(arrays) // 2)


def forward(q, k, v, q_pos, k_pos, q_seg, k_seg, tiles, *, interpret):
    b, heads, n, d = q.shape
    plan = _Plan(q_pos, k_pos, q_seg, k_seg, b, tiles)
    tq, walk = plan.tq, _KeyWalk(plan, q, k)
    masks, mask_specs = walk.mask_inputs(q_pos, k_pos, q_seg, k_seg)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=walk.grid,
        in_specs=[walk.q_tile, walk.kv_tile, walk.kv_tile, *mask_specs],
        out_specs=[walk.q_tile, walk.q_row],
        scratch_shapes=[pltpu.VMEM((tq, d), F32), pltpu.VMEM((tq, 1), F32),
                        pltpu.VMEM((tq, 1), F32)])
    kernel = functools.partial(_forward_kernel, plan=plan, tiles=tiles, heads=heads,
                               with_segments=q_seg is not None)
    out, lse = pl.pallas_call(
        kernel, grid_spec=grid, compiler_params=_REDUCE_LAST, interpret=interpret,
        out_shape=[_f32_like(q, (b * heads, n, d)), _f32_like(q, (b * heads, 1, n))],
    )(*varying([plan.hi, plan.plan, _flat(q), _flat(k), _flat(v), *masks], tiles))
    return out.reshape(q.shape), lse.reshape(b, heads, n), varying(plan.count, tiles)


def _probabilities(s, lse, masked, q_pos, k_pos, q_seg, k_seg, tiles):
    """Final probabilities from raw scores and the GLOBAL lse (broadcast-ready), 0 where masked,
    and the soft cap's slope (None without one: base.probabilities)."""
    p, slope = probabilities(s, lse, tiles)
    visible = visible_pairs(q_pos, k_pos, q_seg, k_seg, tiles.mask) if masked else None
    return (p if visible is None else jnp.where(visible, p, 0.0)), slope



def _dkdv_kernel(lo_ref, plan_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qp_ref,
                 kp_ref, *rest, plan, tiles, kv_heads, g, with_segments):
    """Grid step (KV head r, key tile kt, t = query head of the group x query tile): adds one
    query tile's share to the key tile's dK and dV, computed transposed ([keys, rows])."""
    (qs_ref, ks_ref), (dk_ref, dv_ref), (dk_acc, dv_acc) = _segment_refs(
        rest, with_segments, 2)
    r, kt, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    qt = lax.rem(t, jnp.int32(plan.num_q))

    @pl.when(t == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

    def compute(masked):
        q, do = q_ref[...], do_ref[...]
        p, slope = _probabilities(_dot(k_ref[...], q, 1, 1, tiles), lse_ref[...], masked,
                                  qp_ref[...], kp_ref[...], _read(qs_ref), _read(ks_ref), tiles)
        dv_acc[...] += _dot(p.astype(do.dtype), do, 1, 0, tiles)
        ds = dscores(p, slope, _dot(v_ref[...], do, 1, 1, tiles) - delta_ref[...])
        dk_acc[...] += _dot(ds.astype(q.dtype), q, 1, 0, tiles)

    row = _div(r, kv_heads)
    _when_tile(plan.kind(plan_ref, row, qt, kt), qt >= plan.first(lo_ref, row, kt), compute)

    @pl.when(t == g * plan.num_q - 1)
    def _():
        dk_ref[...] = dk_acc[...] * tiles.scale
        dv_ref[...] = dv_acc[...]


def _dq_kernel(hi_ref, plan_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qp_ref,
               kp_ref, *rest, plan, tiles, heads, with_segments):
    """Grid step (query head r, query tile qt, key tile kt): adds one key tile's share to dQ."""
    (qs_ref, ks_ref), (dq_ref,), (dq_acc, lse_col, delta_col) = _segment_refs(
        rest, with_segments, 1)
    r, qt, kt = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(kt == 0)
    def _():
        dq_acc[...] = jnp.zeros(dq_acc.shape, F32)
        lse_col[...] = _row_to_column(lse_ref[...])  # the query tile's, for its whole walk
        delta_col[...] = _row_to_column(delta_ref[...])

    def compute(masked):
        k = k_ref[...]
        p, slope = _probabilities(_dot(q_ref[...], k, 1, 1, tiles), lse_col[...], masked,
                                  qp_ref[...], kp_ref[...], _read(qs_ref), _read(ks_ref), tiles)
        ds = dscores(p, slope, _dot(do_ref[...], v_ref[...], 1, 1, tiles) - delta_col[...])
        dq_acc[...] += _dot(ds.astype(k.dtype), k, 1, 0, tiles)

    row = _div(r, heads)
    _when_tile(plan.kind(plan_ref, row, qt, kt), kt < plan.limit(hi_ref, row, qt), compute)

    @pl.when(kt == plan.num_k - 1)
    def _():
        dq_ref[...] = dq_acc[...] * tiles.scale


def _dkdv(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, plan, tiles, interpret):
    """dK, dV per KV head: the g query heads of a group are walked inside one reduction."""
    b, heads, n, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    tq, tk, num_q = plan.tq, plan.tk, plan.num_q
    row = lambda r: _div(r, kv_heads)  # the batch row of KV head r
    query = lambda r, kt, t, lo: plan.query_tile(lo, row(r), kt, lax.rem(t, jnp.int32(num_q)))
    head = lambda r, t: r * g + _div(t, num_q)  # the query head of grid step t
    q_tile = pl.BlockSpec((None, tq, d),
                          lambda r, kt, t, lo, _: (head(r, t), query(r, kt, t, lo), 0))
    q_row = pl.BlockSpec((None, 1, tq),
                         lambda r, kt, t, lo, _: (head(r, t), 0, query(r, kt, t, lo)))
    k_tile = pl.BlockSpec((None, tk, d), lambda r, kt, t, *_: (r, kt, 0))
    # Positions and segment ids of the batch row: a row of the query tile, a column of the keys.
    row_specs = [pl.BlockSpec((None, 1, tq),
                              lambda r, kt, t, lo, _: (row(r), 0, query(r, kt, t, lo))),
                 pl.BlockSpec((None, tk, 1), lambda r, kt, t, *_: (row(r), kt, 0))]
    arrays = [_flat(q), _flat(k), _flat(v), _flat(do), _flat(lse)[:, None, :],
              _flat(delta)[:, None, :], _int32(q_pos)[:, None, :], _int32(k_pos)[:, :, None]]
    specs = [q_tile, k_tile, k_tile, q_tile, q_row, q_row, *row_specs]
    if q_seg is not None:
        arrays += [_int32(q_seg)[:, None, :], _int32(k_seg)[:, :, None]]
        specs += row_specs
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(b * kv_heads, plan.num_k, g * num_q), in_specs=specs,
        out_specs=[k_tile, k_tile],
        scratch_shapes=[pltpu.VMEM((tk, d), F32), pltpu.VMEM((tk, d), F32)])
    kernel = functools.partial(_dkdv_kernel, plan=plan, tiles=tiles, kv_heads=kv_heads, g=g,
                               with_segments=q_seg is not None)
    dk, dv = pl.pallas_call(
        kernel, grid_spec=grid, compiler_params=_REDUCE_LAST, interpret=interpret,
        out_shape=[_f32_like(q, (b * kv_heads, k.shape[2], d))] * 2,  # (a halo: n_k < n)
    )(*varying([plan.lo, plan.plan, *arrays], tiles))
    return dk.reshape(k.shape), dv.reshape(v.shape)


def _dq(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, plan, tiles, interpret):
    b, heads, n, d = q.shape
    walk = _KeyWalk(plan, q, k)
    masks, mask_specs = walk.mask_inputs(q_pos, k_pos, q_seg, k_seg)
    arrays = [_flat(q), _flat(k), _flat(v), _flat(do), _flat(lse)[:, None, :],
              _flat(delta)[:, None, :], *masks]
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=walk.grid,
        in_specs=[walk.q_tile, walk.kv_tile, walk.kv_tile, walk.q_tile, walk.q_row,
                  walk.q_row, *mask_specs],
        out_specs=walk.q_tile, scratch_shapes=[pltpu.VMEM((plan.tq, d), F32),
                                               pltpu.VMEM((plan.tq, 1), F32),
                                               pltpu.VMEM((plan.tq, 1), F32)])
    kernel = functools.partial(_dq_kernel, plan=plan, tiles=tiles, heads=heads,
                               with_segments=q_seg is not None)
    dq = pl.pallas_call(
        kernel, grid_spec=grid, compiler_params=_REDUCE_LAST, interpret=interpret,
        out_shape=_f32_like(q, (b * heads, n, d)),
    )(*varying([plan.hi, plan.plan, *arrays], tiles))
    return dq.reshape(q.shape)


def _backward_side(tile: int) -> int:
    """The largest divisor of `tile` up to BACKWARD_TILE, a multiple of the lanes if `tile` is."""
    if tile <= BACKWARD_TILE:
        return tile
    return max(t for t in range(1, BACKWARD_TILE + 1)
               if tile % t == 0 and (t % LANES == 0 or tile % LANES))


def backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles, *, interpret):
    tiles = dataclasses.replace(tiles, tile_q=_backward_side(tiles.tile_q),
                                tile_k=_backward_side(tiles.tile_k))
    plan = _Plan(q_pos, k_pos, q_seg, k_seg, q.shape[0], tiles)
    args = (q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, plan, tiles, interpret)
    return (_dq(*args), *_dkdv(*args))


class PallasTpuKernel(InterpretableKernel):
    name = "pallas_tpu"
    platforms = ("tpu", "cpu")
    fused_on = ("tpu",)
    # A grid step per (row, head, query tile, key tile) of the whole rectangle: key tiles past
    # the causal prefix repeat the last one (no copy) but still take their step.
    grid = TileGrid(per_head=True, every_tile=True)

    def check_tiles(self, tile_q, tile_k, interpret):
        if not interpret and (tile_q % LANES or tile_k % LANES):
            raise ValueError(
                f"kernel 'pallas_tpu' needs tile_q and tile_k that are multiples of {LANES} on a "
                f"TPU; got {tile_q} x {tile_k}: set tiles of 128, 256 or 512 (blocks of at least "
                f"128 tokens per device), or kernel 'xla'")


KERNEL = PallasTpuKernel(forward, backward)
