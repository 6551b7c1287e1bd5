"""The tile rule and the cost model built on it: which tiles run, and what the ring's critical
path is. The kernels (`tile_plan`), the planner, the benchmarks and the tests all use this
module, so the work they count and the work that runs cannot drift apart.

A block pair (a device's query block against one key block) is cut into tile_q x tile_k tiles.
Original indices increase along every block (see `parallel.layouts`), so under the causal mask
the key tiles a query tile can see are a prefix: key tile kt may hold a visible key for query
tile qt iff its first key index <= the query tile's last index. Tiles past the prefix never run;
inside it, with segment ids, a tile whose query and key documents cannot meet is skipped too.

Every count takes the mask as `causal`: a bool (causal or not), or a parallel.mask.Mask with a
sliding window, whose tiles out of reach are skipped like those past the causal edge.

Closed forms (causal, one document, square tiles, T = tiles per block side, W = T^2 = one dense
block pair), slowest device per ring step:

    layout    step 0         every later step    critical path
    ring      T(T+1)/2       T^2                 T(T+1)/2 + (N-1) T^2
    striped   T(T+1)/2       T(T+1)/2            N T(T+1)/2
    zigzag    T(T+1)/2       T^2 / 2             T(T+1)/2 + (N-1) T^2/2

`ring_tile_counts` computes the per-device, per-step counts exactly from the layout's positions
(for any layout and tile shape); the tests check them against these forms and against the
kernels' own counters.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from parallel.layouts import get_layout, row_order
from parallel.mask import as_mask


def key_tile_limits(q_pos, k_pos, tile_q: int, tile_k: int, causal, xp=np):
    """hi[..., qt]: the number of leading key tiles that may hold a key visible to query tile qt.

    q_pos [..., n_q], k_pos [..., n_k]: increasing original indices (leading axes, such as batch
    rows, broadcast); causal: a bool or a `Mask` (a window bounds the prefix of a bidirectional
    mask too). Returns int32 [..., n_q / tile_q].
    Example: q_pos [1 5 9 13], k_pos [3 7 11 15], tiles of 2: query tile 0 ends at 5 and key
    tiles start at 3 and 11 -> hi = [1, 2].
    """
    mask = as_mask(causal)
    q_first, q_last = q_pos[..., ::tile_q], q_pos[..., tile_q - 1::tile_q]
    k_first = k_pos[..., ::tile_k]  # smallest original index in each key tile
    _, high = mask.key_bounds(q_first, q_last)
    if high is None:
        shape = xp.broadcast_shapes(q_last.shape[:-1], k_first.shape[:-1]) + q_last.shape[-1:]
        return xp.full(shape, k_first.shape[-1], dtype=np.int32)
    return xp.sum(k_first[..., None, :] <= high[..., :, None], axis=-1).astype(np.int32)


def _tile_ranges(pos, tile):
    """(first, last) original index of each tile: two [..., T] arrays."""
    return pos[..., ::tile], pos[..., tile - 1::tile]


def _per_tile_pair(rule, q_pos, k_pos, tile_q: int, tile_k: int, xp):
    """rule(q_first, q_last, k_first, k_last) on every (query tile, key tile) pair's position
    ranges: [..., n_q/tile_q, n_k/tile_k] bool."""
    (q_first, q_last), (k_first, k_last) = _tile_ranges(q_pos, tile_q), _tile_ranges(k_pos, tile_k)
    out = rule(q_first[..., :, None], q_last[..., :, None], k_first[..., None, :],
               k_last[..., None, :])
    shape = xp.broadcast_shapes(q_first.shape[:-1], k_first.shape[:-1]) + (
        q_first.shape[-1], k_first.shape[-1])
    return xp.broadcast_to(out, shape)


def fully_visible(q_pos, k_pos, tile_q: int, tile_k: int, causal, xp=np):
    """[..., n_q/tile_q, n_k/tile_k] bool: every key of the tile is visible to every query (no
    mask needed), by the mask's rule (a bool: causal or not, or a `Mask`)."""
    return _per_tile_pair(as_mask(causal).all_visible, q_pos, k_pos, tile_q, tile_k, xp)


def tiles_may_meet(q_pos, k_pos, tile_q: int, tile_k: int, causal, xp=np):
    """[..., n_q/tile_q, n_k/tile_k] bool: some key of the tile may be visible to some query."""
    return _per_tile_pair(as_mask(causal).may_meet, q_pos, k_pos, tile_q, tile_k, xp)


SKIP, FULL, MASKED = 0, 1, 2  # what a tile needs


def tile_plan(q_pos, k_pos, q_seg, k_seg, tile_q: int, tile_k: int, causal, xp=np):
    """(hi [R, Tq], plan [R, Tq, Tk]) int32: per batch row, the prefix of key tiles each query
    tile may see, and what each tile needs: SKIP (past the prefix, before a window's reach, or
    its queries' and keys' segment-id ranges are disjoint, so no pair can be visible), FULL (one
    shared segment and all keys visible: no mask) or MASKED.

    Positions are [n] (every row alike) or [b, n] (each row its own order: `attention`'s
    `order`); segment ids [b, n] or None; causal a bool or a `Mask` (with a window). R is b when
    either is per row, else 1. Ranges make the rule exact for packed (sorted) ids and
    conservative for any ids.

    Example: causal, positions 0..7 on both sides, tiles of 4, one document -> hi [[1, 2]],
    plan [[[MASKED, SKIP], [FULL, MASKED]]].
    """
    q_pos, k_pos = q_pos.reshape(-1, q_pos.shape[-1]), k_pos.reshape(-1, k_pos.shape[-1])
    hi = key_tile_limits(q_pos, k_pos, tile_q, tile_k, causal, xp)  # [1 or b, Tq]
    full = fully_visible(q_pos, k_pos, tile_q, tile_k, causal, xp)  # [1 or b, Tq, Tk]
    runs = xp.arange(full.shape[-1])[None, None, :] < hi[:, :, None]
    if as_mask(causal).bounded:
        runs = runs & tiles_may_meet(q_pos, k_pos, tile_q, tile_k, causal, xp)
    if q_seg is not None:
        (q_lo, q_hi), (k_lo, k_hi) = _ranges(q_seg, tile_q, xp), _ranges(k_seg, tile_k, xp)
        meet = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
        runs = runs & meet
        full = full & ((q_lo == q_hi)[:, :, None] & (k_lo == k_hi)[:, None, :]
                       & (q_lo[:, :, None] == k_lo[:, None, :]))
    plan = xp.where(runs, xp.where(full, FULL, MASKED), SKIP).astype(np.int32)
    return xp.broadcast_to(hi, plan.shape[:2]), plan


def tiles_run(plan, batch: int, xp=np):
    """The tiles a kernel that follows `tile_plan` computes: the tiles not SKIP, summed over
    the batch rows (a plan with one row stands for every row)."""
    return (plan != SKIP).sum() * (batch // plan.shape[0])


def _ranges(seg, tile, xp):
    """(min, max) segment id of each tile, per batch row: two [b, T] arrays."""
    tiled = seg.reshape(seg.shape[0], -1, tile)
    return tiled.min(axis=-1), tiled.max(axis=-1)


def ring_tile_counts(layout: str, num_shards: int, block: int, tile_q: int, tile_k: int,
                     causal=True) -> np.ndarray:
    """tiles[d, s]: tiles device d computes on ring step s (one document), int64 [N, N].

    On step s device d holds the key block of device (d - s) mod N.
    Example: ring_tile_counts('ring', 2, 8, 2, 2) -> [[10, 0], [10, 16]]: device 0's keys on
    step 1 are all in its future; device 1 sees all of device 0's.
    """
    order = get_layout(layout).permutation(num_shards * block, num_shards)
    return placement_tile_counts(order, None, num_shards, tile_q, tile_k, causal)


def placement_tile_counts(order, segment_ids, num_shards: int, tile_q: int, tile_k: int,
                          causal=True) -> np.ndarray:
    """tiles[d, s] for one row of any placement, int64 [N, N]: order [S] is the original index
    at each slot (a layout's permutation, or one row of balanced's), segment_ids [S] in natural
    order (None: one document). The kernels' rule, so it equals attention_with_stats.

    Example: order 0..7 (ring), N 2, one document, tiles of 2 -> [[3, 0], [3, 4]].
    """
    order = np.asarray(order)
    blocks = order.reshape(num_shards, -1)
    seg = None if segment_ids is None else np.asarray(segment_ids)
    counts = np.zeros((num_shards, num_shards), np.int64)
    devices = np.arange(num_shards)
    q_seg = None if seg is None else seg[order][None]  # every slot's, the queries of each plan
    # Every device's queries against one device's key block at a time (N plans, not N^2):
    # a query tile's plan depends only on its own positions and that block's keys.
    for e, k in enumerate(blocks):
        k_seg = None if seg is None else seg[k][None]
        _, plan = tile_plan(order, k, q_seg, k_seg, tile_q, tile_k, causal)
        run = (plan[0] != SKIP).reshape(num_shards, -1).sum(axis=1)  # by query device
        counts[devices, (devices - e) % num_shards] = run  # device d meets block e on step d-e
    return counts


def layout_tile_counts(layout: str, segment_ids, num_shards: int, tile_q: int, tile_k: int,
                       causal=True) -> np.ndarray:
    """tiles[r, d, s] for rows segment_ids [R, S] (natural order) laid out by `layout`, int64
    [R, N, N]: what attention_with_stats reports, row by row. balanced places each row on
    units of lcm(tile_q, tile_k), as training does (training.loop.balance_tile).

    Example: layout_tile_counts('zigzag', zeros [1, 16], 2, 2, 2)[0] -> [[10, 8], [10, 8]].
    """
    seg = np.asarray(segment_ids)
    orders = row_order(layout, seg, num_shards, tile=math.lcm(tile_q, tile_k))
    return _row_counts(orders, seg, num_shards, (tile_q, tile_k), causal)


def _row_counts(orders, segment_ids, num_shards: int, tiles: tuple[int, int],
                causal=True) -> np.ndarray:
    """placement_tile_counts of every row: orders [R, S], segment_ids [R, S] or None."""
    segs = [None] * len(orders) if segment_ids is None else segment_ids
    return np.stack([placement_tile_counts(o, s, num_shards, *tiles, causal)
                     for o, s in zip(orders, segs)])


def single_device_tiles(segment_ids, tile_q: int, tile_k: int, causal=True) -> int:
    """Tiles one device computes on a whole row [S] in natural order: the work N devices share
    (the numerator of `document_efficiency`)."""
    return int(placement_tile_counts(np.arange(len(segment_ids)), segment_ids, 1, tile_q,
                                     tile_k, causal).sum())


def document_efficiency(tiles, single: int) -> float:
    """single-device tiles / N / critical path: 1.0 when N devices share one device's work
    evenly and never wait (tiles [N devices, N steps])."""
    tiles = np.asarray(tiles)
    return single / tiles.shape[0] / critical_path(tiles)


def critical_path(tiles) -> int:
    """Sum over ring steps of the busiest device's tiles: devices wait for each other at every
    hop. tiles [N devices, N steps]."""
    return int(np.asarray(tiles).max(axis=0).sum())


def visible_pair_count(seq_len: int, causal=True) -> float:
    """The (query, key) pairs of one document of seq_len tokens that the mask lets through.
    Example: 4 tokens, Mask(causal=True, window=2) -> 1 + 2 + 2 + 2 = 7."""
    i = np.arange(seq_len, dtype=np.float64)
    mask = as_mask(causal)
    before = i if mask.window is None else np.minimum(i, mask.window - 1)  # keys before i
    after = 0.0 if mask.causal else (seq_len - 1 - i if mask.window is None
                                     else np.minimum(seq_len - 1 - i, mask.window - 1))
    return float((before + after + 1).sum())


def ideal_tiles(seq_len: int, num_shards: int, tile_q: int, tile_k: int,
                causal=True) -> float:
    """The useful (query, key) pairs spread evenly over N devices, in tiles."""
    return visible_pair_count(seq_len, causal) / (num_shards * tile_q * tile_k)


def efficiency(tiles, seq_len: int, tile_q: int, tile_k: int, causal=True) -> float:
    """ideal / critical path: 1.0 is a perfectly balanced ring that computes no masked pair."""
    tiles = np.asarray(tiles)
    return ideal_tiles(seq_len, tiles.shape[0], tile_q, tile_k, causal) / critical_path(tiles)


def layout_orders(layout: str, num_shards: int, block: int, tiles: tuple[int, int],
                  documents=None) -> np.ndarray:
    """int32 [R, S]: the original index at each slot, per row: a static layout's permutation
    ([1, S]), or balanced's placement of each row of documents [R, S] (natural order) on units of
    lcm(tiles). Without documents, balanced places one document: its zigzag start over units,
    which its search keeps."""
    if documents is not None:
        return row_order(layout, np.asarray(documents), num_shards, tile=math.lcm(*tiles))
    return get_layout(layout).one_document_order(num_shards * block, num_shards,
                                                 math.lcm(*tiles))[None]


def step_tile_counts(layout: str, num_shards: int, block: int, tiles: tuple[int, int],
                     documents=None, causal=True) -> np.ndarray:
    """tiles[r, d, s]: tiles device d computes on ring step s for row r (int64 [R, N, N]);
    documents: segment ids [R, S] in natural order (None: one causal document, R = 1); causal:
    a bool or a Mask (a sliding window)."""
    return group_tile_counts(layout, num_shards, 1, block, tiles, documents, causal)


def group_orders(orders, num_shards: int, degree: int) -> np.ndarray:
    """[R, S]: the slots as ulysses/usp compute them: each group of `degree` consecutive
    shards' tokens, concatenated and sorted by original index (parallel/strategies/ulysses.py).
    Example: striped over 4 shards of 2, degree 2: [0 4 1 5 | 2 6 3 7] -> [0 1 4 5 | 2 3 6 7]."""
    orders = np.asarray(orders)
    grouped = orders.reshape(len(orders), num_shards // degree, -1)
    return np.sort(grouped, axis=-1).reshape(orders.shape)


def group_tile_counts(layout: str, num_shards: int, degree: int, block: int,
                      tiles: tuple[int, int], documents=None, causal=True) -> np.ndarray:
    """tiles[r, g, s] for usp with `degree` (ulysses: degree = N; the ring: 1): group g's device
    on step s of the ring over the N / degree groups; each tile spans H / degree heads.
    [R, N/u, N/u]. One document's counts are computed once per shape (the planner and the
    calibration ask for them again and again); read-only."""
    if documents is None:
        return _one_document_counts(layout, num_shards, degree, block, tuple(tiles),
                                    as_mask(causal))
    documents = np.ascontiguousarray(documents)
    return _document_counts(layout, num_shards, degree, block, tuple(tiles), as_mask(causal),
                            documents.tobytes(), documents.shape, documents.dtype.str)


@functools.lru_cache(maxsize=64)
def _document_counts(layout, num_shards, degree, block, tiles, mask, ids: bytes, shape,
                     dtype) -> np.ndarray:
    """group_tile_counts of rows of documents, by value: the planner prices many strategies
    and memory settings on the same rows (balanced's search and the tile counts of 64 devices
    take minutes a row)."""
    documents = np.frombuffer(ids, dtype=dtype).reshape(shape)
    orders = group_orders(layout_orders(layout, num_shards, block, tiles, documents),
                          num_shards, degree)
    counts = _row_counts(orders, documents, num_shards // degree, tiles, mask)
    counts.setflags(write=False)
    return counts


@functools.lru_cache(maxsize=256)
def _one_document_counts(layout, num_shards, degree, block, tiles, mask) -> np.ndarray:
    orders = group_orders(layout_orders(layout, num_shards, block, tiles), num_shards, degree)
    counts = _row_counts(orders, None, num_shards // degree, tiles, mask)
    counts.setflags(write=False)
    return counts
