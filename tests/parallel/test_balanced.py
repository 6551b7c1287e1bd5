"""The `balanced` layout: a per-row permutation from the documents, exact attention through
`order`, and the balance it promises, counted by the kernel itself."""

import numpy as np
import pytest

import parallel
from parallel import cost
from parallel.layouts import balanced
from tests.support import dense_reference as ref
from tests.support.attention_cases import make_inputs, mesh_for, run_kernel
from tests.support.attention_cases import needed_tiles, tile_counts, T, TILE


def packed_rows(rng, batch, seq_len, mean):
    """Segment ids [batch, seq_len] of documents with exponential lengths of `mean` tokens."""
    rows = []
    for _ in range(batch):
        lengths = np.maximum(1, rng.exponential(mean, seq_len).astype(int))
        ends = np.cumsum(lengths)
        rows.append(np.searchsorted(ends, np.arange(seq_len), side="right"))
    return np.stack(rows).astype(np.int32)


@pytest.mark.parametrize("seq_len,num_shards,tile", [(64, 1, 8), (64, 2, 4), (128, 4, 8),
                                                     (96, 4, 8), (256, 8, 4)])
def test_permutation_is_per_row_and_increasing_on_every_shard(seq_len, num_shards, tile):
    seg = packed_rows(np.random.default_rng(seq_len), 3, seq_len, 20)
    perm = parallel.permutation("balanced", seq_len, num_shards, segment_ids=seg, tile=tile)
    inv = parallel.inverse_permutation("balanced", seq_len, num_shards, segment_ids=seg,
                                       tile=tile)
    assert perm.shape == (3, seq_len) and perm.dtype == np.int32
    for row in perm:
        np.testing.assert_array_equal(np.sort(row), np.arange(seq_len))
        blocks = row.reshape(num_shards, -1)
        assert (np.diff(blocks, axis=1) > 0).all()
        # Whole units of `tile` consecutive tokens: every tile is one run of the natural order.
        units = row.reshape(-1, tile)
        np.testing.assert_array_equal(units - units[:, :1], np.arange(tile) + 0 * units)
    x = np.random.default_rng(0).standard_normal((3, seq_len))
    np.testing.assert_array_equal(
        np.take_along_axis(np.take_along_axis(x, perm, 1), inv, 1), x)
    # A pure function of the segment ids: the same rows give the same placement.
    np.testing.assert_array_equal(
        perm, parallel.permutation("balanced", seq_len, num_shards, segment_ids=seg, tile=tile))


# Rows the data can produce: padding (its own segment at the end), a document longer than the
# row, one token per document, one document; exact forward and gradients for each.
EDGE_ROWS = {
    "padding": lambda s, r: np.minimum(np.arange(s) // (s // 8), 3 + r),
    "longer_than_row": lambda s, r: np.zeros(s),
    "token_per_document": lambda s, r: np.arange(s),
    "packed": lambda s, r: np.sort(np.random.default_rng(r).integers(0, 6, s)),
}


@pytest.mark.parametrize("row", EDGE_ROWS)
def test_exact_on_edge_rows(row):
    q, k, v, dout, _ = make_inputs(3, 2, 4, 2)
    seg = np.stack([EDGE_ROWS[row](q.shape[1], r) for r in range(2)]).astype(np.int32)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(4, data=1), layout="balanced",
                            causal=True, tile_q=4, tile_k=4)
    want_out, want_grads = ref.attention(q, k, v, seg, True, dout)
    # (A token alone in its document has dK = 0 exactly: compare against the output's scale.)
    for got, want in zip((out, *grads), (want_out, *want_grads)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want_out).max())


def test_one_document_is_plain_causal_attention():
    q, k, v, dout, _ = make_inputs(5, 2, 4, 1)
    seg = np.zeros(q.shape[:2], np.int32)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(8, data=1), layout="balanced",
                            causal=True)
    want_out, want_grads = ref.attention(q, k, v, None, True, dout)
    assert ref.relative_error(out, want_out) < 1e-5
    for got, want in zip(grads, want_grads):
        assert ref.relative_error(got, want) < 1e-5


def test_kernel_counts_equal_the_layouts_work_model_and_skip_exactly():
    """attention_with_stats' counters equal balanced.work of the placement, and every tile
    with a visible pair runs, no other (documents packed, so skipping is exact)."""
    seq_len, n = 4 * T * TILE, 4
    seg = packed_rows(np.random.default_rng(7), 1, seq_len, 12)
    tiles = tile_counts("balanced", n, segment_ids=seg)
    np.testing.assert_array_equal(tiles, needed_tiles("balanced", n, segment_ids=seg))
    perm = parallel.permutation("balanced", seq_len, n, segment_ids=seg, tile=TILE)[0]
    device = np.empty(seq_len // TILE, int)
    device[perm[::TILE] // TILE] = np.arange(seq_len // TILE) // (seq_len // TILE // n)
    adjacent = balanced.unit_graph(seg[0], TILE)
    np.testing.assert_array_equal(tiles, balanced.work(device, adjacent, n))


@pytest.mark.parametrize("mean", [24, 200, 2000])  # short, long, longer than the row
def test_balance_beats_every_static_layout_with_documents(mean):
    """Efficiency = single-device tiles / N / critical path, from the kernel's counters."""
    seq_len, n = 4 * T * TILE, 4
    seg = packed_rows(np.random.default_rng(mean), 1, seq_len, mean)
    single = cost.single_device_tiles(seg[0], TILE, TILE)
    eff = {layout: cost.document_efficiency(tile_counts(layout, n, segment_ids=seg), single)
           for layout in parallel.LAYOUTS}
    assert eff["balanced"] >= 0.9, eff
    assert eff["balanced"] >= max(eff.values()) - 1e-9, eff


def test_search_keeps_its_tables_exact_and_never_lengthens_a_start():
    """The swap search's incremental W and neighbour tables equal a recount after every round
    (on an arbitrary graph, not only packed documents), and the placement it returns has a
    critical path no longer than either start's: ring's contiguous one or the zigzag."""
    rng = np.random.default_rng(3)
    m, n = 48, 4
    adjacent = rng.random((m, m)) < 0.15
    adjacent = np.triu(adjacent, 1) | np.triu(adjacent, 1).T
    pairs = np.nonzero(np.tril(adjacent))
    search = balanced._Search(adjacent, pairs, balanced.zigzag_units(m, n), n, seed=0)
    for _ in range(20):
        search.run(5)
        device = search.device
        np.testing.assert_array_equal(search.w, balanced.work(device, adjacent, n))
        onehot = np.eye(n, dtype=int)[device]
        np.testing.assert_array_equal(search.below, np.tril(adjacent).astype(int) @ onehot)
        np.testing.assert_array_equal(search.above, np.triu(adjacent).astype(int) @ onehot)
        assert np.bincount(device, minlength=n).tolist() == [m // n] * n
    final = cost.critical_path(balanced.work(balanced.balance_units(adjacent, n), adjacent, n))
    for start in (balanced.zigzag_units, balanced.contiguous_units):
        assert final <= cost.critical_path(balanced.work(start(m, n), adjacent, n))


@pytest.mark.parametrize("bad,match", [
    (dict(segment_ids=None), "pass segment_ids"),
    (dict(segment_ids=np.zeros(64, np.int32)), r"integers \[B, 64\]"),
    (dict(segment_ids=np.zeros((1, 64)), tile=5), "tile 5 does not divide"),
])
def test_bad_arguments_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        parallel.permutation("balanced", 64, 4, **bad)


def test_attention_without_order_says_how_to_make_it():
    x = np.zeros((1, 64, 1, 8), np.float32)
    with pytest.raises(ValueError, match="pass order="):
        parallel.attention(x, x, x, mesh=mesh_for(4, data=1), layout="balanced")
    with pytest.raises(ValueError, match=r"order must be \[batch, seq\]"):
        parallel.attention(x, x, x, mesh=mesh_for(4, data=1), layout="balanced",
                           order=np.arange(64))


def test_an_order_and_tiles_from_two_places_are_an_error_from_one_choice_they_agree():
    """balanced places documents in units; a tile larger than the unit straddles two units and
    loses the balance silently, so attention refuses it. parallel.choose gives one unit to both."""
    seq_len, n = 1024, 4
    seg = packed_rows(np.random.default_rng(3), 1, seq_len, 60)
    mesh = mesh_for(n, data=1)
    x = np.zeros((1, seq_len, 2, 8), np.float32)
    small = parallel.permutation("balanced", seq_len, n, segment_ids=seg, tile=16)
    with pytest.raises(ValueError, match=r"tile_q=64 straddles the units this order was placed "
                                         r"in: build it with .*tile=64"):
        parallel.attention(x, x, x, mesh=mesh, layout="balanced", order=small,
                           segment_ids=np.take_along_axis(seg, small, 1), tile_q=64, tile_k=64)
    choice = parallel.choose(layout="balanced", strategy="ring", kernel="xla", tile_q=64,
                             tile_k=32, seq_len=seq_len, num_shards=n, platform="cpu", q_heads=2)
    assert choice.balance_unit == 64
    order = choice.permutation(seq_len, n, segment_ids=seg)
    _, tiles, _ = parallel.attention_with_stats(x, x, x, mesh=mesh, order=order,
                                             segment_ids=np.take_along_axis(seg, order, 1),
                                             **choice.attention_kwargs())
    single = cost.single_device_tiles(seg[0], 64, 32)
    assert cost.document_efficiency(np.asarray(tiles), single) > 0.8
