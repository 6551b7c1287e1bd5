"""`balanced`: each row's tokens placed from its documents, so that with packed documents every
device does nearly the same unmasked work on every ring step.

With documents masked, the work of a row is no longer the causal triangle but one small
triangle per document, and the static layouts lose their balance: striped's tiles straddle
documents and cannot be skipped, ring and zigzag leave whole documents, and their work, on one
device. `balanced` makes the placement a function of the row's segment ids, computed on the
host when the batch is made:

1. Cut the row, in natural order, into units of `tile` tokens (the attention tile). A device
   holds S / (N * tile) whole units, in increasing order. Every kernel tile is then one unit of
   consecutive tokens, so the tiles that run are exactly the tiles one device would run on the
   whole row in natural order (same skip rules): no work is added, it is only shared out.
2. Unit pair (i, j), j <= i, runs iff some document spans both units. If unit i sits on device
   a and unit j on device b, that tile runs on device a at ring step (a - b) mod N. So a
   placement gives a work matrix W[device, step] and the ring's critical path
   sum_s max_d W[d, s].
3. Start from a zigzag over units (0, 1, .., N-1, N-1, .., 0, 0, 1, ..: long documents are
   then balanced as zigzag balances one sequence) and improve by swapping units between
   devices while the critical path (then the spread of W) does not grow, until PATIENCE rounds
   in a row bring no gain (search_rounds at most: more for rows of many units). Swaps are
   scored in vectorised batches, with a fixed seed: the placement is a pure function of the
   segment ids.
   Run the same search from ring's contiguous start too (documents much shorter than a block
   are balanced there already) and keep the better; a tie keeps the zigzag.

    segment_ids [B, S] (natural order) -> permutation [B, S]: row r's slot j holds original
    token perm[r, j]; every shard's slice increases.

Example (S = 16, N = 2, tile 2; documents of 6, 2 and 8 tokens, segment ids
[0]*6 + [1]*2 + [2]*8): device 0 holds [0 1 2 3 10 11 14 15], device 1 [4 5 6 7 8 9 12 13].

Both searches together take about 0.1 s for a 64k-token row (N = 8, tiles 256 to 1024:
scripts/bench/documents.py prints it); they run in the data pipeline's prefetch thread.
"""

from __future__ import annotations

import numpy as np

from parallel.layouts.base import MAX_DEFAULT_TILE, Layout, largest_divisor

ROUNDS = 150  # rounds of the swap search, at least (search_rounds)
CANDIDATES = 64  # swaps scored per round
PATIENCE = 40  # rounds without a lower score before the search stops


class Balanced(Layout):
    name = "balanced"
    data_dependent = True

    def positions(self, shard, block, num_shards, xp=np):
        raise ValueError("layout 'balanced' depends on each row's documents: it has no formula "
                         "per shard; make its [B, S] permutation with parallel.permutation("
                         "'balanced', S, N, segment_ids=...) and pass it as order=")

    def contiguous_run(self, block: int) -> int:
        """The default unit: default tiles divide it, so a tile is one run of consecutive
        tokens."""
        return default_unit(block)

    def one_document_order(self, seq_len, num_shards, unit):
        """One document: the zigzag start over units, which the search keeps."""
        return np.asarray(order_of(zigzag_units(seq_len // unit, num_shards), unit))

    def permutation(self, seq_len: int, num_shards: int) -> np.ndarray:
        raise ValueError("layout 'balanced' needs the rows' segment ids: call "
                         "parallel.permutation('balanced', S, N, segment_ids=[B, S] ids)")

    def row_permutations(self, segment_ids, seq_len: int, num_shards: int,
                         tile: int | None = None) -> np.ndarray:
        """int32 [B, S]: each row's placement (see the module docstring)."""
        self.check_divisible(seq_len, num_shards)
        block = seq_len // num_shards
        unit = default_unit(block) if tile is None else int(tile)
        if unit < 1 or block % unit:
            raise ValueError(f"tile {unit} does not divide the per-device block of {block} tokens: "
                             f"choose a divisor of {block} (the attention tile)")
        if segment_ids is None:
            raise ValueError("layout 'balanced' places tokens from their documents: pass "
                             "segment_ids=[B, S] in natural order (zeros for one document a row)")
        seg = np.asarray(segment_ids)
        if seg.ndim != 2 or seg.shape[1] != seq_len or not np.issubdtype(seg.dtype, np.integer):
            raise ValueError(f"segment_ids must be integers [B, {seq_len}] in natural order; got "
                             f"{seg.dtype} {seg.shape}")
        return np.stack([row_permutation(row, num_shards, unit) for row in seg])


def default_unit(block: int) -> int:
    """The unit when none is given: the default tile of a block (parallel.default_tile)."""
    return largest_divisor(block, MAX_DEFAULT_TILE)


def row_permutation(segment_ids, num_shards: int, unit: int) -> np.ndarray:
    """int32 [S]: one row's placement; device d holds slots d*B .. d*B+B-1."""
    adjacent = unit_graph(segment_ids, unit)
    return order_of(balance_units(adjacent, num_shards), unit)


def order_of(device, unit: int) -> np.ndarray:
    """int32 [S]: the permutation that puts unit u on device[u], each device's units in
    increasing order (every device holds the same number of units)."""
    units = np.argsort(device, kind="stable")  # by device, then increasing within a device
    return (units[:, None] * unit + np.arange(unit)).reshape(-1).astype(np.int32)


def unit_graph(segment_ids, unit: int) -> np.ndarray:
    """bool [M, M], M = S / unit: units i != j share a document (their segment-id ranges meet;
    exact for packed, sorted ids, conservative otherwise: the kernels' own skip rule)."""
    tiled = np.asarray(segment_ids).reshape(-1, unit)
    lo, hi = tiled.min(axis=1), tiled.max(axis=1)
    meet = (lo[:, None] <= hi[None, :]) & (lo[None, :] <= hi[:, None])
    np.fill_diagonal(meet, False)
    return meet


def work(device, adjacent, num_shards: int) -> np.ndarray:
    """W[d, s]: tiles device d runs on ring step s when unit u sits on device[u] (tiles = units:
    the diagonal tile of each unit, and each adjacent pair once, on the later unit's device)."""
    w = np.zeros((num_shards, num_shards), np.int64)
    np.add.at(w, (device, 0), 1)
    later, earlier = np.nonzero(np.tril(adjacent))
    np.add.at(w, (device[later], (device[later] - device[earlier]) % num_shards), 1)
    return w


def _score(w):
    """Critical path first, then the sum of squares (spreads work when the path is level)."""
    return w.max(axis=-2).sum(axis=-1) * 1e12 + (w.astype(np.float64) ** 2).sum(axis=(-2, -1))


def search_rounds(num_units: int) -> int:
    """ROUNDS, or a quarter of the row's units where that is more. A round makes one swap, so a
    row of many units needs more of them: a 524,288-token row of Pareto-distributed documents
    in units of 128 over 64 devices (4,096 units) reaches 0.88 of the ideal critical path
    after 150 rounds and 0.93 after 1,024 (about 3 s a search), rows of 64 units the same
    after 150 as after more (BENCHMARKS.md: packed documents at 32 and 64 devices)."""
    return max(ROUNDS, num_units // 4)


def zigzag_units(num_units: int, num_shards: int) -> np.ndarray:
    """0, 1, .., N-1, N-1, .., 0, 0, 1, ..: every device gets M / N units."""
    r = np.arange(num_units) % (2 * num_shards)
    return np.where(r < num_shards, r, 2 * num_shards - 1 - r)


def contiguous_units(num_units: int, num_shards: int) -> np.ndarray:
    """0, 0, .., 1, 1, ..: ring's placement (best when documents are much shorter than a
    block: each stays on one device and every device holds about the same number)."""
    return np.arange(num_units) // (num_units // num_shards)


def balance_units(adjacent, num_shards: int, rounds: int | None = None,
                  seed: int = 0) -> np.ndarray:
    """device [M]: M / N units per device, with a short critical path (module docstring): the
    better of the searches from a zigzag and from a contiguous start (zigzag on a tie), each of
    at most `rounds` rounds (default: search_rounds(M))."""
    rounds = search_rounds(adjacent.shape[0]) if rounds is None else rounds
    pairs = np.nonzero(np.tril(adjacent))  # (later, earlier) units of every adjacent pair
    searches = [_Search(adjacent, pairs, start(adjacent.shape[0], num_shards), num_shards, seed)
                for start in (zigzag_units, contiguous_units)]
    for search in searches:
        search.run(rounds)
    return min(searches, key=lambda search: search.score).device


class _Search:
    """Swaps of two units on different devices, scored CANDIDATES at a time.

    below[u, e] / above[u, e]: how many units adjacent to u, before / after it, sit on device e.
    Unit u on device x then adds to W: 1 at (x, 0); below[u, e] at (x, (x - e) % N) (u is the
    later unit of the pair); above[u, e] at (e, (e - x) % N).
    """

    def __init__(self, adjacent, pairs, device, num_shards, seed):
        self.adjacent, self.device, self.n = adjacent, device.copy(), num_shards
        self.rng = np.random.default_rng(seed)
        later, earlier = pairs
        m, n = len(device), num_shards
        # Counted from the pair list (O(pairs), not an M x M x N product).
        self.below = np.bincount(later * n + device[earlier], minlength=m * n).reshape(m, n)
        self.above = np.bincount(earlier * n + device[later], minlength=m * n).reshape(m, n)
        self.w = work(self.device, adjacent, num_shards)
        self.score = _score(self.w)

    def _swap_deltas(self, a, b):
        """Change of W for swapping a[i] and b[i]: [K, N, N]. Each unit's part of W (class
        docstring) leaves its device and is added on the other, the four parts of a swap
        summed by one bincount over the [K, N, N] entries they touch (2N + 1 each)."""
        da, db, n, k = self.device[a], self.device[b], self.n, len(a)
        units = np.stack([a, a, b, b])  # [4, K]: added on the new device, taken off the old
        devices = np.stack([db, da, da, db])
        sign = np.array([1, -1, 1, -1])[:, None, None]
        e, x = np.arange(n)[None, None, :], devices[:, :, None]
        swap = np.arange(k)[None, :, None] * n * n
        where = np.concatenate([
            (swap + x * n + (x - e) % n).reshape(-1),  # u the later unit of a pair: on x
            (swap + e * n + (e - x) % n).reshape(-1),  # u the earlier one: on its partner's
            (swap[..., 0] + devices * n).reshape(-1)])  # u's own diagonal tile, step 0
        weight = np.concatenate([(sign * self.below[units]).reshape(-1),
                                 (sign * self.above[units]).reshape(-1),
                                 np.broadcast_to(sign[:, :, 0], (4, k)).reshape(-1)])
        delta = np.bincount(where, weights=weight, minlength=k * n * n)
        delta = delta.astype(np.int64).reshape(k, n, n)
        # An adjacent pair was counted as if its partner stayed: correct the pair's own entry.
        pair = np.nonzero(self.adjacent[a, b])[0]
        for x, y in ((da[pair], db[pair]), (db[pair], da[pair])):
            delta[pair, x, (x - y) % n] += 1
            delta[pair, x, 0] -= 1
        return delta

    def _move(self, unit, new):
        old, column = self.device[unit], self.adjacent[:, unit].astype(np.int64)
        later = np.arange(len(self.device)) > unit
        for table, side in ((self.below, column * later), (self.above, column * ~later)):
            table[:, old] -= side
            table[:, new] += side
        self.device[unit] = new

    def run(self, rounds, patience=PATIENCE):
        """Up to `rounds` rounds; stops after `patience` rounds in a row without a lower score
        (small rows have few swaps to try; equal scores are still taken, to cross plateaus)."""
        m, stale = len(self.device), 0
        for _ in range(rounds):
            if stale >= patience:
                break
            stale += 1
            a, b = self.rng.integers(m, size=(2, CANDIDATES))
            keep = self.device[a] != self.device[b]
            a, b = a[keep], b[keep]
            if not len(a):
                continue
            delta = self._swap_deltas(a, b)
            scores = _score(self.w[None] + delta)
            best = int(np.argmin(scores))
            if scores[best] < self.score:
                stale = 0
            if scores[best] <= self.score:
                self.w, self.score = self.w + delta[best], scores[best]
                da, db = self.device[a[best]], self.device[b[best]]
                self._move(a[best], db)
                self._move(b[best], da)
        return self.device


LAYOUT = Balanced()
