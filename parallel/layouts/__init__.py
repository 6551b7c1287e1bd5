"""Token layouts: where each token of a sequence sits on the mesh's 'seq' shards.

    S=16, N=4 (original token indices, in the order each device stores them)
    ring     dev0 [0 1 2 3]      dev1 [4 5 6 7]      dev2 [8 9 10 11]    dev3 [12 13 14 15]
    striped  dev0 [0 4 8 12]     dev1 [1 5 9 13]     dev2 [2 6 10 14]    dev3 [3 7 11 15]
    zigzag   dev0 [0 1 14 15]    dev1 [2 3 12 13]    dev2 [4 5 10 11]    dev3 [6 7 8 9]
    balanced each row its own placement, from its documents (see balanced.py)

A new layout is one file defining a `Layout` subclass and its `LAYOUT` instance, plus one entry
in the tuple below.
"""

from __future__ import annotations

import numpy as np

from parallel.layouts import balanced, ring, striped, zigzag
from parallel.layouts.base import Layout

LAYOUTS: dict[str, Layout] = {m.LAYOUT.name: m.LAYOUT for m in (ring, striped, zigzag, balanced)}
# The natural order, contiguous blocks: every length that splits over the devices lays out this
# way; what stands in for layout 'auto' until the planner has chosen.
BASELINE = ring.LAYOUT.name


def fitting_layouts(seq_len: int, num_shards: int) -> list[str]:
    """The registered layouts that split seq_len over num_shards (zigzag needs 2N chunks)."""
    fits = []
    for name, layout in LAYOUTS.items():
        try:
            layout.check_divisible(seq_len, num_shards)
        except ValueError:
            continue
        fits.append(name)
    return fits


def get_layout(name: str) -> Layout:
    """The registered layout called `name`; ValueError naming the choices otherwise."""
    if isinstance(name, Layout):
        return name
    try:
        return LAYOUTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention layout {name!r}: choose one of "
                         f"{', '.join(LAYOUTS)}") from None


def block_positions(layout: str, shard, block: int, num_shards: int, xp=np):
    """Original token indices held by seq shard `shard` under `layout`, increasing: [..., block].

    Example: block_positions('zigzag', 1, 4, 4) -> [2 3 12 13].
    """
    return get_layout(layout).positions(shard, block, num_shards, xp=xp)


def permutation(layout: str, seq_len: int, num_shards: int, *, segment_ids=None,
                tile: int | None = None) -> np.ndarray:
    """Natural order -> layout order: int32 [S] for the static layouts, [B, S] for a
    data-dependent one ('balanced', which needs segment_ids [B, S] in natural order and aligns
    documents to `tile`, the attention tile; default: the default tile).

    `x[:, perm]` (static) or `np.take_along_axis(x, perm, axis=1)` ([B, S]) lays a field out.
    Slot j then holds original token perm[..., j]; shard d (slots d*B .. d*B+B-1) holds
    increasing original indices, `block_positions(layout, d, B, N)` for a static layout. Pass
    the permutation, broadcast to [B, S], to `attention` as `order`.

    Example, seq_len=8, num_shards=2:
      ring    [0 1 2 3 4 5 6 7]   striped [0 2 4 6 1 3 5 7]   zigzag [0 1 6 7 2 3 4 5]
    """
    lay = get_layout(layout)
    if lay.data_dependent:
        return lay.row_permutations(segment_ids, seq_len, num_shards, tile)
    return lay.permutation(seq_len, num_shards)


def row_order(layout: str, segment_ids, num_shards: int, *, tile: int | None = None):
    """int32 [B, S]: attention's `order` for rows whose segment ids (natural order) are
    segment_ids [B, S]: the layout's permutation in every row, or balanced's own per row.
    `np.take_along_axis(field, order, axis=1)` lays a [B, S] field out.

    Example: row_order('striped', zeros [2, 8], 2) -> [[0 2 4 6 1 3 5 7]] * 2.
    """
    seg = np.asarray(segment_ids)
    perm = permutation(layout, seg.shape[-1], num_shards, segment_ids=seg, tile=tile)
    return np.ascontiguousarray(np.broadcast_to(perm, seg.shape), np.int32)


def inverse_permutation(layout: str, seq_len: int, num_shards: int, *, segment_ids=None,
                        tile: int | None = None) -> np.ndarray:
    """Layout order -> natural order: `y[:, inv]` ([S]) or `np.take_along_axis(y, inv, 1)`
    ([B, S]) undoes the permutation."""
    perm = permutation(layout, seq_len, num_shards, segment_ids=segment_ids, tile=tile)
    return np.argsort(perm, axis=-1).astype(perm.dtype)


def check_divisible(layout: str, seq_len: int, num_shards: int) -> None:
    """ValueError unless seq_len splits into the layout's equal chunks on num_shards shards."""
    get_layout(layout).check_divisible(seq_len, num_shards)
