"""attention_with_stats: the tiles each device computes match the cost model (parallel.cost and
its closed forms) and skip exactly the fully masked tiles."""

import numpy as np
import pytest

import parallel
from parallel import cost
from tests.support import dense_reference as ref
from tests.support.attention_cases import STATIC
from tests.support.attention_cases import needed_tiles, T, TILE, tile_counts


TRIANGLE, FULL = T * (T + 1) // 2, T * T

# Slowest device's tiles per ring step: the closed forms of the cost model (parallel/cost.py).
CLOSED_FORMS = {
    "ring": lambda n: [TRIANGLE] + [FULL] * (n - 1),
    "striped": lambda n: [TRIANGLE] * n,
    "zigzag": lambda n: [TRIANGLE] + [FULL // 2] * (n - 1),
}


@pytest.mark.parametrize("num_shards", [2, 4, 8])
@pytest.mark.parametrize("layout", STATIC)
def test_causal_tiles_match_cost_model_and_skip_exactly(layout, num_shards):
    tiles = tile_counts(layout, num_shards)
    np.testing.assert_array_equal(tiles.max(axis=0), CLOSED_FORMS[layout](num_shards))
    # The cost model counts every device and step exactly as the kernel does.
    np.testing.assert_array_equal(
        tiles, cost.ring_tile_counts(layout, num_shards, T * TILE, TILE, TILE))
    # Every tile with a visible pair is computed, and no other: the skipping is exact.
    np.testing.assert_array_equal(tiles, needed_tiles(layout, num_shards))


def test_critical_path_ratios_at_eight_shards():
    counts = {layout: tile_counts(layout, 8) for layout in STATIC}
    path = {layout: cost.critical_path(c) for layout, c in counts.items()}
    ideal = (8 * T * TILE) * (8 * T * TILE + 1) / 2 / (8 * TILE * TILE)
    assert cost.ideal_tiles(8 * T * TILE, 8, TILE, TILE) == ideal
    assert path == {"ring": 484, "striped": 288, "zigzag": 260}
    assert path["ring"] / path["striped"] >= 1.6 and path["ring"] / path["zigzag"] >= 1.8
    efficiency = {layout: cost.efficiency(c, 8 * T * TILE, TILE, TILE)
                  for layout, c in counts.items()}
    assert efficiency["zigzag"] >= 0.95 and efficiency["striped"] >= 0.85
    assert efficiency["zigzag"] == pytest.approx(ideal / 260)


@pytest.mark.parametrize("layout", STATIC)
def test_bidirectional_computes_every_tile(layout):
    np.testing.assert_array_equal(tile_counts(layout, 4, causal=False), np.full((4, 4), FULL))
    np.testing.assert_array_equal(cost.ring_tile_counts(layout, 4, T * TILE, TILE, TILE, False),
                                  np.full((4, 4), FULL))


# The Pallas kernels on zigzag, whose blocks hold documents out of order (conservative skipping).
@pytest.mark.parametrize("layout,kernel", [(layout, "xla") for layout in parallel.LAYOUTS]
                         + [("zigzag", "pallas_gpu"), ("zigzag", "pallas_tpu")])
def test_segments_skip_tiles_whose_documents_cannot_meet(layout, kernel):
    rng = np.random.default_rng(0)
    seq_len = 4 * T * TILE
    cuts = np.sort(rng.choice(np.arange(1, seq_len), 6, replace=False))
    seg = np.searchsorted(cuts, np.arange(seq_len), side="right")[None].astype(np.int32)
    with_docs = tile_counts(layout, 4, segment_ids=seg, kernel=kernel)
    without = tile_counts(layout, 4, kernel=kernel)
    assert (with_docs <= without).all() and with_docs.sum() < without.sum()
    # Skipping is conservative: every tile with a visible pair is still computed.
    assert (with_docs >= needed_tiles(layout, 4, segment_ids=seg)).all()


def test_ring_with_one_document_per_block_does_no_cross_block_work():
    """Documents aligned to ring blocks never meet another block: only step 0 computes."""
    seq_len, block = 4 * T * TILE, T * TILE
    seg = (np.arange(seq_len) // block)[None].astype(np.int32)
    tiles = tile_counts("ring", 4, segment_ids=seg)
    np.testing.assert_array_equal(tiles[:, 0], [TRIANGLE] * 4)
    np.testing.assert_array_equal(tiles[:, 1:], 0)


def test_counts_are_maximum_over_data_shards():
    """With the batch split over 'data', each replica skips by its own documents."""
    seq_len = 2 * T * TILE
    seg = np.zeros((2, seq_len), np.int32)
    seg[1, seq_len // 2:] = 1  # row 1: two documents, one per ring block; row 0: one document
    both = tile_counts("ring", 2, segment_ids=seg, batch=2, data=2)
    row0 = tile_counts("ring", 2, segment_ids=seg[:1], batch=1, data=1)
    row1 = tile_counts("ring", 2, segment_ids=seg[1:], batch=1, data=1)
    np.testing.assert_array_equal(both, np.maximum(row0, row1))
    assert (row1 < row0).any()


@pytest.mark.parametrize("layout", STATIC)
def test_tile_plan_skips_only_empty_tiles_and_unmasks_only_full_ones(layout):
    """cost.tile_plan against the dense mask of every block pair of a packed row."""
    rng = np.random.default_rng(1)
    n, seq_len = 4, 4 * T * TILE
    block = seq_len // n
    seg = np.sort(rng.integers(0, 6, seq_len)).astype(np.int32)  # natural order
    visible = ref.mask(1, seq_len, seg[None], True)[0, 0]
    lay = parallel.get_layout(layout)
    for d in range(n):
        for src in range(n):
            q_pos, k_pos = lay.positions(d, block, n), lay.positions(src, block, n)
            hi, plan = cost.tile_plan(q_pos, k_pos, seg[q_pos][None], seg[k_pos][None], TILE,
                                      TILE, causal=True)
            pairs = visible[np.ix_(q_pos, k_pos)].reshape(T, TILE, T, TILE).transpose(0, 2, 1, 3)
            for qt in range(T):
                for kt in range(T):
                    any_visible, all_visible = pairs[qt, kt].any(), pairs[qt, kt].all()
                    if kt >= hi[0, qt] or plan[0, qt, kt] == cost.SKIP:
                        assert not any_visible, (d, src, qt, kt)
                    elif plan[0, qt, kt] == cost.FULL:
                        assert all_visible, (d, src, qt, kt)
