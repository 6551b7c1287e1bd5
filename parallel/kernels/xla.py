"""`xla`: the block pair as flash-attention tiles of jnp einsums in while loops. Runs everywhere.

Loop nest, per block pair (shapes in kernels/base.py):

    for each group of heads                 (fori_loop; heads of one or more batch rows)
      for each `rows` queries of a tile     (fori_loop over n / rows)
        for kt in [0, hi[qt])               (while loop: the causal prefix of query tile qt)
          switch(plan[qt, kt]):  skip | full tile | masked tile      (cost.tile_plan)
                                                     └ the same nest over square pieces

Why it is shaped like this (measured on one CPU core with scripts/bench/kernel.py):
- Head-major arrays: the matmuls run on contiguous [rows, d] and [d, tile] panels; in
  [n, heads, d] order the same matmuls take about three times as long.
- Small steps: a group of heads and `rows` queries are chosen so that one step's scores fit in
  about 1 MiB (SCORE_BUDGET) and stay in cache between the matmul that makes them, the
  exponential, and the matmul that reads them (a whole 1024 x 1024 tile of 4 heads, 16 MiB,
  ran the backward at half the speed). At tile 1024 a step is one head x 256 queries;
  at tile 32 it spans many heads and rows, so the loops run few iterations. Which tiles run is
  still decided per tile_q x tile_k tile.
- The online-softmax state of the queries in flight is the inner loop's carry and is written
  out once per `rows` queries: nothing the size of the whole block is copied per tile.
- Keys are kept transposed ([d, n], once per group), and the backward accumulates dK and dV
  transposed too: every large operand of every matmul is then read in its natural layout, and
  no [rows, tile] matrix is ever transposed.
- Only tiles that the causal bound or a segment boundary cuts through build a mask, and they are
  computed in square pieces of at most MASK_PIECE, each planned by the same rule as tiles
  (cost.tile_plan): pieces past the causal edge or between documents are skipped, pieces wholly
  visible run unmasked. A diagonal tile then costs less than a full one instead of about 1.6x,
  which matters because striped has a diagonal tile per query tile on every ring step.
- The scale is applied inside the exponent (exp(scale * (s - max))), not to the scores.
- GQA: the g query heads of one KV head are a separate einsum axis, so each K/V tile is read
  once for all of them and dK, dV sum over them inside the matmul.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from parallel import cost
from parallel.cost import FULL, MASKED, SKIP
from parallel.kernels.base import (Kernel, dscores, exponent_scale, logits, probabilities,
                                   softmax_fold, softmax_result, varying, visible)

F32 = jnp.float32
SCORE_BUDGET = 1 << 18  # float32 scores per inner step: 1 MiB (0.5 to 2 MiB measured alike)
MASK_PIECE = 128  # largest side of the square pieces a masked tile is computed in


@dataclasses.dataclass(frozen=True)
class Groups:
    """How the loops cut the work: groups of query heads, and query rows per inner step.

    A group holds `size` consecutive query heads of the flattened [b * H] (batch-major): `kv`
    KV heads with `per_kv` query heads each; it never splits a batch row's heads unevenly, nor
    a KV head's query heads. Queries go `rows` at a time, so that a step's scores,
    size x rows x tile_k floats, fit in SCORE_BUDGET.
    Example: b=2, H=4, h=2: tiles 1024 -> size 1 (8 groups), rows 256; tiles 32 -> size 8
    (1 group), rows 32.
    """

    size: int
    rows: int
    kv: int
    per_kv: int
    count: int
    heads: int  # H, query heads per batch row
    kv_heads: int  # h, KV heads per batch row

    @classmethod
    def choose(cls, batch, heads, kv_heads, tile_q, tile_k) -> "Groups":
        g, total = heads // kv_heads, batch * heads
        size = max(s for s in range(1, total + 1) if total % s == 0
                   and (heads % s == 0 or s % heads == 0) and (g % s == 0 or s % g == 0)
                   and (s == 1 or s * tile_q * tile_k <= SCORE_BUDGET))
        rows = max(r for r in range(1, tile_q + 1)
                   if tile_q % r == 0 and (r == 1 or size * r * tile_k <= SCORE_BUDGET))
        return cls(size=size, rows=rows, kv=max(size // g, 1), per_kv=min(size, g),
                   count=total // size, heads=heads, kv_heads=kv_heads)

    def first_kv(self, i):
        """Index of group i's first KV head among the flattened b * h."""
        return i * self.size // (self.heads // self.kv_heads)

    def queries(self, i, x):
        """Group i of a flattened [b*H, ...] array, as [kv, per_kv, ...]."""
        part = lax.dynamic_slice_in_dim(x, i * self.size, self.size, 0)
        return part.reshape(self.kv, self.per_kv, *x.shape[1:])

    def keys(self, i, x):
        """Group i's KV heads of a flattened [b*h, ...] array: [kv, ...]."""
        return lax.dynamic_slice_in_dim(x, self.first_kv(i), self.kv, 0)

    def rows_of(self, i, x):
        """Per-row [b, n] (positions, segment ids) -> the row of each of group i's KV heads:
        [kv, n] (None stays None)."""
        if x is None:
            return None
        return jnp.take(x, (self.first_kv(i) + jnp.arange(self.kv)) // self.kv_heads, axis=0)

    def plan(self, plan):
        """Per-row tile plan [b or 1, Tq, Tk] -> per group [count, Tq, Tk]: a group skips a tile
        only if all its rows do, and runs it unmasked only if all its rows can."""
        if plan.shape[0] == 1:
            return jnp.broadcast_to(plan, (self.count, *plan.shape[1:]))
        if self.size >= self.heads:
            per = self.size // self.heads
            rows = plan.reshape(plan.shape[0] // per, per, *plan.shape[1:])
            return jnp.where((rows == SKIP).all(axis=1), SKIP,
                             jnp.where((rows == FULL).all(axis=1), FULL, MASKED))
        return jnp.repeat(plan, self.heads // self.size, axis=0)


def _slice(x, start, size, axis):
    """x[start : start + size] along `axis` (None stays None: no segment ids)."""
    return None if x is None else lax.dynamic_slice_in_dim(x, start, size, axis)


def _mask(q_pos, k_pos, q_seg, k_seg, rule):
    """[kv, 1, rows, tk] bool (the g axis added): key j visible to query i (rule: a Mask)."""
    mask = visible(q_pos, k_pos, q_seg, k_seg, rule)
    return None if mask is None else jnp.expand_dims(mask, -3)


def _matmul(spec, a, b, tiles):
    return jnp.einsum(spec, a, b, preferred_element_type=F32, precision=tiles.precision)


def _online_softmax_step(state, s, v_t, mask, tiles):
    """Folds one tile's raw scores s [kv, g, rows, tk] into the running (o, m, l)."""
    o, m, l = state
    s = logits(s, tiles)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    p, alpha, m, l = softmax_fold(m, l, s, mask is not None, exponent_scale(tiles))
    pv = _matmul("kgqt,ktd->kgqd", p.astype(v_t.dtype), v_t, tiles)
    return o * alpha[..., None] + pv, m, l


def _sub_size(rows, width):
    """Side of the square pieces a masked (rows x width) block is cut into, or None if the block
    is already that small. Pieces past the causal edge are then skipped and pieces wholly before
    it run unmasked: a diagonal tile costs about half a full one instead of more than one."""
    sub = max(s for s in range(1, min(rows, width, MASK_PIECE) + 1)
              if rows % s == 0 and width % s == 0)
    return None if sub == rows and sub == width else sub


def _piece_plan(qp, qs, kp, ks, sub, rule):
    """cost.tile_plan of a block's pieces, one plan for all the group's KV slots: [nr], [nr, nk]."""
    hi, plan = cost.tile_plan(qp, kp, qs, ks, sub, sub, rule, xp=jnp)
    return hi.max(axis=0), jnp.where((plan == SKIP).all(axis=0), SKIP,
                         jnp.where((plan == FULL).all(axis=0), FULL, MASKED))


def _forward_group(q, k, v, q_pos, k_pos, q_seg, k_seg, hi, plan, rows, tiles, count):
    """One group: q [kv, g, n, d], k, v [kv, n, d] -> out f32, lse f32 [kv, g, n], count.

    Each step of the outer loop takes `rows` queries of query tile qt through the key tiles
    its plan runs; the first step of each query tile counts the tiles."""
    tk, per_tile = tiles.tile_k, tiles.tile_q // rows
    kv, g, n, d = q.shape
    k_tr = jnp.swapaxes(k, 1, 2)  # [kv, d, n]: q @ k^T reads both panels in natural order

    def attend(state, queries, k0, width, masked):
        q_c, qp, qs = queries
        kp, ks = _slice(k_pos, k0, width, 1), _slice(k_seg, k0, width, 1)
        s = _matmul("kgqd,kdt->kgqt", q_c, _slice(k_tr, k0, width, 2), tiles)
        mask = _mask(qp, kp, qs, ks, tiles.mask) if masked else None
        return _online_softmax_step(state, s, _slice(v, k0, width, 1), mask, tiles)

    def attend_masked(state, queries, k0):
        sub = _sub_size(queries[0].shape[2], tk)
        if sub is None:
            return attend(state, queries, k0, tk, True)
        q_c, qp, qs = queries
        hi_p, plan_p = _piece_plan(qp, qs, _slice(k_pos, k0, tk, 1), _slice(k_seg, k0, tk, 1),
                                   sub, tiles.mask)

        def piece_rows(r, state):
            part = (_slice(q_c, r * sub, sub, 2), _slice(qp, r * sub, sub, 1),
                    _slice(qs, r * sub, sub, 1))
            st = tuple(_slice(x, r * sub, sub, 2) for x in state)

            def piece(j, st):
                run = lambda masked: lambda st: attend(st, part, k0 + j * sub, sub, masked)
                return lax.switch(plan_p[r, j], [lambda st: st, run(False), run(True)], st)

            st = lax.fori_loop(0, hi_p[r], piece, st)
            return tuple(lax.dynamic_update_slice_in_dim(x, y, r * sub, 2)
                         for x, y in zip(state, st))

        return lax.fori_loop(0, q_c.shape[2] // sub, piece_rows, state)

    def query_rows(c, carry):
        out, lse, count = carry
        qt, q0, first = c // per_tile, c * rows, (c % per_tile == 0).astype(jnp.int32)
        queries = (_slice(q, q0, rows, 2), _slice(q_pos, q0, rows, 1), _slice(q_seg, q0, rows, 1))

        def key_tile(kt, carry):
            state, count = carry
            k0, what = kt * tk, plan[qt, kt]
            state = lax.switch(what, [lambda st: st, lambda st: attend(st, queries, k0, tk, False),
                                      lambda st: attend_masked(st, queries, k0)], state)
            return state, count + first * (what != SKIP).astype(jnp.int32)

        state = varying((jnp.zeros((kv, g, rows, d), F32), jnp.full((kv, g, rows), -jnp.inf, F32),
                         jnp.zeros((kv, g, rows), F32)), tiles)
        (o, m, l), count = lax.fori_loop(0, hi[qt], key_tile, (state, count))
        out_c, lse_c = softmax_result(o, m, l, exponent_scale(tiles))
        return (lax.dynamic_update_slice_in_dim(out, out_c, q0, 2),
                lax.dynamic_update_slice_in_dim(lse, lse_c, q0, 2), count)

    init = varying((jnp.zeros((kv, g, n, d), F32), jnp.full((kv, g, n), -jnp.inf, F32)), tiles)
    return lax.fori_loop(0, n // rows, query_rows, (*init, count))


# Query-side arrays of the backward and the axis their rows are on:
# q, q^T, dO, dO^T [kv, g, rows, d] / [kv, g, d, rows]; lse, delta [kv, g, rows]; pos, seg
# [kv, rows].
_QUERY_AXES = (2, 3, 2, 3, 2, 2, 1, 1)


def _backward_group(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, hi, plan, rows, tiles):
    """One group's contributions, float32 and scaled: dq [kv, g, n, d], dk, dv [kv, n, d]."""
    tk, per_tile = tiles.tile_k, tiles.tile_q // rows
    kv, g, n, d = q.shape
    k_tr, v_tr = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [kv, d, n]
    q_side = (q, jnp.swapaxes(q, 2, 3), do, jnp.swapaxes(do, 2, 3), lse, delta, q_pos, q_seg)

    def take_rows(side, start, size):
        return tuple(_slice(x, start, size, axis) for x, axis in zip(side, _QUERY_AXES))

    def zeros(count, width):
        return varying((jnp.zeros((kv, g, count, d), F32), jnp.zeros((kv, d, width), F32),
                        jnp.zeros((kv, d, width), F32)), tiles)

    def grads(side, k0, width, masked):
        """(dq rows, dk^T, dv^T) of one block: queries `side` against keys k0 .. k0+width."""
        q_c, q_c_tr, do_c, do_c_tr, lse_c, delta_c, qp, qs = side
        # Final probabilities from the global lse; rows with lse = -inf are all masked.
        s = _matmul("kgqd,kdt->kgqt", q_c, _slice(k_tr, k0, width, 2), tiles)
        p, slope = probabilities(s, lse_c[..., None], tiles)
        mask = (_mask(qp, _slice(k_pos, k0, width, 1), qs, _slice(k_seg, k0, width, 1),
                      tiles.mask) if masked else None)
        if mask is not None:  # (None: bidirectional without documents, never masked)
            p = jnp.where(mask, p, 0.0)
        dv_t = _matmul("kgdq,kgqt->kdt", do_c_tr, p.astype(do.dtype), tiles)
        ds = dscores(p, slope, _matmul("kgqd,kdt->kgqt", do_c, _slice(v_tr, k0, width, 2), tiles)
                     - delta_c[..., None])
        dq_c = _matmul("kgqt,ktd->kgqd", ds.astype(k.dtype), _slice(k, k0, width, 1), tiles)
        dk_t = _matmul("kgdq,kgqt->kdt", q_c_tr, ds.astype(q.dtype), tiles)
        return dq_c, dk_t, dv_t

    def grads_masked(side, k0):
        count = side[0].shape[2]
        sub = _sub_size(count, tk)
        if sub is None:
            return grads(side, k0, tk, True)
        hi_p, plan_p = _piece_plan(side[6], side[7], _slice(k_pos, k0, tk, 1),
                                   _slice(k_seg, k0, tk, 1), sub, tiles.mask)

        def piece_rows(r, acc):
            part = take_rows(side, r * sub, sub)

            def piece(j, acc):
                run = lambda masked: lambda: grads(part, k0 + j * sub, sub, masked)
                ddq, ddk, ddv = lax.switch(plan_p[r, j], [lambda: zeros(sub, sub), run(False),
                                                          run(True)])
                add = lambda x, y, at, axis: lax.dynamic_update_slice_in_dim(
                    x, _slice(x, at, y.shape[axis], axis) + y, at, axis)
                return (add(acc[0], ddq, r * sub, 2), add(acc[1], ddk, j * sub, 2),
                        add(acc[2], ddv, j * sub, 2))

            return lax.fori_loop(0, hi_p[r], piece, acc)

        return lax.fori_loop(0, count // sub, piece_rows, zeros(count, tk))

    def query_rows(c, carry):
        dq, dk_tr, dv_tr = carry
        qt, q0 = c // per_tile, c * rows
        side = take_rows(q_side, q0, rows)

        def key_tile(kt, carry):
            dq_c, dk_tr, dv_tr = carry
            k0 = kt * tk
            ddq, ddk, ddv = lax.switch(plan[qt, kt], [lambda: zeros(rows, tk),
                                                      lambda: grads(side, k0, tk, False),
                                                      lambda: grads_masked(side, k0)])
            add = lambda acc, upd: lax.dynamic_update_slice_in_dim(
                acc, _slice(acc, k0, tk, 2) + upd, k0, 2)
            return dq_c + ddq, add(dk_tr, ddk), add(dv_tr, ddv)

        dq_c = varying(jnp.zeros((kv, g, rows, d), F32), tiles)
        dq_c, dk_tr, dv_tr = lax.fori_loop(0, hi[qt], key_tile, (dq_c, dk_tr, dv_tr))
        return lax.dynamic_update_slice_in_dim(dq, dq_c * tiles.scale, q0, 2), dk_tr, dv_tr

    n_k = k.shape[1]  # a halo's key block may be shorter than the query block
    init = varying((jnp.zeros((kv, g, n, d), F32), jnp.zeros((kv, d, n_k), F32),
                    jnp.zeros((kv, d, n_k), F32)), tiles)
    dq, dk_tr, dv_tr = lax.fori_loop(0, n // rows, query_rows, init)
    return dq, jnp.swapaxes(dk_tr, 1, 2) * tiles.scale, jnp.swapaxes(dv_tr, 1, 2)


def _flat(x):
    """[b, heads, ...] -> [b * heads, ...] (None stays None)."""
    return None if x is None else x.reshape(-1, *x.shape[2:])


def _setup(q, k, q_pos, k_pos, q_seg, k_seg, tiles):
    b, heads = q.shape[:2]
    groups = Groups.choose(b, heads, k.shape[1], tiles.tile_q, tiles.tile_k)
    hi, plan = cost.tile_plan(q_pos, k_pos, q_seg, k_seg, tiles.tile_q, tiles.tile_k,
                              tiles.mask, xp=jnp)
    # One loop bound for all rows of a group; a row's tiles past its own prefix are SKIP.
    return groups, hi.max(axis=0), groups.plan(plan)


class XlaKernel(Kernel):
    name = "xla"

    def forward(self, q, k, v, q_pos, k_pos, q_seg, k_seg, tiles):
        b, heads, n, d = q.shape
        groups, hi, plan = _setup(q, k, q_pos, k_pos, q_seg, k_seg, tiles)

        def group(i, carry):
            out, lse, count = carry
            o_g, lse_g, count = _forward_group(
                groups.queries(i, _flat(q)), groups.keys(i, _flat(k)), groups.keys(i, _flat(v)),
                groups.rows_of(i, q_pos), groups.rows_of(i, k_pos), groups.rows_of(i, q_seg),
                groups.rows_of(i, k_seg), hi, plan[i], groups.rows, tiles, count)
            start = i * groups.size
            return (lax.dynamic_update_slice_in_dim(out, o_g.reshape(-1, n, d), start, 0),
                    lax.dynamic_update_slice_in_dim(lse, lse_g.reshape(-1, n), start, 0), count)

        init = varying((jnp.zeros((b * heads, n, d), F32), jnp.full((b * heads, n), -jnp.inf, F32),
                        jnp.zeros((), jnp.int32)), tiles)
        out, lse, count = lax.fori_loop(0, groups.count, group, init)
        # Each visit covered `size` heads; a tile counts once per batch row (all its heads).
        return out.reshape(q.shape), lse.reshape(b, heads, n), count * groups.size // heads

    def backward(self, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles):
        b, heads, n, d = q.shape
        groups, hi, plan = _setup(q, k, q_pos, k_pos, q_seg, k_seg, tiles)

        def group(i, carry):
            dq, dk, dv = carry
            of_group = lambda x: groups.queries(i, _flat(x))
            dq_g, dk_g, dv_g = _backward_group(
                of_group(q), groups.keys(i, _flat(k)), groups.keys(i, _flat(v)), of_group(do),
                of_group(lse), of_group(delta), groups.rows_of(i, q_pos), groups.rows_of(i, k_pos),
                groups.rows_of(i, q_seg), groups.rows_of(i, k_seg), hi, plan[i], groups.rows, tiles)
            first_kv = groups.first_kv(i)
            add = lambda acc, upd: lax.dynamic_update_slice_in_dim(
                acc, _slice(acc, first_kv, groups.kv, 0) + upd, first_kv, 0)
            dq = lax.dynamic_update_slice_in_dim(dq, dq_g.reshape(-1, n, d), i * groups.size, 0)
            return dq, add(dk, dk_g), add(dv, dv_g)

        kv_rows = b * k.shape[1]
        n_k = k.shape[2]
        init = varying((jnp.zeros((b * heads, n, d), F32), jnp.zeros((kv_rows, n_k, d), F32),
                        jnp.zeros((kv_rows, n_k, d), F32)), tiles)
        dq, dk, dv = lax.fori_loop(0, groups.count, group, init)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


KERNEL = XlaKernel()
