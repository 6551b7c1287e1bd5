"""Every strategy other than the ring equals dense float64 attention (forward and gradients) for
every layout, on the issue's meshes, and counts the tiles per step it should."""

import itertools

import numpy as np
import pytest

import parallel
from tests.tiers import split
from tests.support.attention_cases import (HEADS, MODES, OPTIONS, assert_matches_reference,
                                           layout_order, make_inputs, mesh_for, run_kernel, take,
                                           with_options)

MESHES = [(1, 2), (2, 2), (1, 4), (1, 8), (2, 4)]  # data x seq
USP_MESHES = [(1, 4, 2), (1, 8, 2), (1, 8, 4), (2, 4, 2)]  # data x seq, Ulysses degree


def ulysses_heads(degree, i):
    """(q_heads, kv_heads) that the degree divides: MHA, GQA with KV heads repeated to fit the
    degree (2 KV heads for 4 or 8 devices), MQA; rotating with i."""
    return [(degree, degree), (2 * degree, 2), (degree, 1)][i % 3]


# Each strategy meets each layout on three of its meshes in turn (every mesh meets at least two
# layouts); the (causal, segments) modes and head layouts rotate over the cases, so that every
# strategy sees MHA, GQA, MQA, causal or not, packed and scattered segment ids.
def _picked(meshes):
    return [(layout, mesh) for i, (layout, mesh) in
            enumerate(itertools.product(parallel.LAYOUTS, meshes))
            if (i // len(meshes) + i) % len(meshes) < 3]


CASES = [(strategy, layout, (data, seq), None, MODES[c % 4],
          HEADS[c % 3] if strategy == "allgather" else ulysses_heads(seq, c),
          OPTIONS[(c + 2 * i) % len(OPTIONS)])
         for i, strategy in enumerate(("allgather", "ulysses"))
         for c, (layout, (data, seq)) in enumerate(_picked(MESHES))]
CASES += [("usp", layout, (data, seq), u, MODES[c % 4], ulysses_heads(u, c),
           OPTIONS[(c + 4) % len(OPTIONS)])
          for c, (layout, (data, seq, u)) in enumerate(_picked(USP_MESHES))]


# The fast tier: a case of every strategy and option; the sweeps tier: the rest.
@pytest.mark.parametrize("strategy,layout,mesh_shape,degree,mode,heads,options",
                         split(CASES, 0, 6))
def test_matches_dense_reference(strategy, layout, mesh_shape, degree, mode, heads, options):
    data, num_shards = mesh_shape
    causal, segments = mode
    mesh = mesh_for(num_shards, data=data)
    q, k, v, dout, seg = make_inputs(num_shards + data, 2 * data, *heads, segments=segments)
    given, reference = with_options(heads[0], options, seed=num_shards)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=layout, causal=causal,
                            tile_q=4, tile_k=4, strategy=strategy, ulysses_degree=degree,
                            **given)
    assert_matches_reference(out, grads, q, k, v, seg, causal, dout, **reference)


def test_all_strategies_cover_every_registered_one():
    assert {case[0] for case in CASES} | {"ring"} == set(parallel.STRATEGIES)


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_allgather_runs_the_rings_tiles(layout):
    """allgather meets the blocks in the ring's order with the same kernel: tiles[d, s] equal."""
    mesh = mesh_for(4, data=1)
    q, k, v, _, seg = make_inputs(3, 2, 4, 2, segments="packed")
    order = layout_order(layout, seg, 2, q.shape[1], 4, tile=4)
    args = [take(x, order) for x in (q, k, v)]
    counts = {s: np.asarray(parallel.attention_with_stats(
        *args, mesh=mesh, layout=layout, segment_ids=take(seg, order), order=order,
        strategy=s, tile_q=4, tile_k=4)[1]) for s in ("ring", "allgather")}
    np.testing.assert_array_equal(counts["allgather"], counts["ring"])
    assert counts["ring"].sum() > 0


@pytest.mark.parametrize("strategy,degree", [("ulysses", None), ("usp", 2)])
def test_ulysses_tiles_are_the_sorted_groups_causal_triangle(strategy, degree):
    """After the all-to-all a group's tokens are sorted, so with one document and the striped
    layout ulysses (u = N = 4) runs exactly the causal triangle of the whole sequence: T (T + 1)
    / 2 tiles per device in step 0, nothing after; usp (u = 2) runs N / u = 2 steps."""
    mesh = mesh_for(4, data=1)
    q, k, v, _, _ = make_inputs(5, 1, 4, 2)
    order = layout_order("striped", None, 1, q.shape[1], 4)
    _, tiles, _ = parallel.attention_with_stats(
        *[take(x, order) for x in (q, k, v)], mesh=mesh, layout="striped", strategy=strategy,
        ulysses_degree=degree, tile_q=4, tile_k=4)
    tiles = np.asarray(tiles)
    if strategy == "ulysses":
        t = q.shape[1] // 4  # tiles per side of the whole sequence
        np.testing.assert_array_equal(tiles[:, 0], t * (t + 1) // 2)
        assert not tiles[:, 1:].any()
    else:
        assert tiles[:, :2].all() and not tiles[:, 2:].any()
        # two groups of sorted striped tokens are a striped layout over 2: balanced within 1 tile
        assert tiles.sum(axis=1).max() - tiles.sum(axis=1).min() <= 2


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("num_shards,degree", [(4, 4), (8, 2)])
def test_cost_model_counts_the_ulysses_groups_tiles(layout, num_shards, degree):
    """parallel.cost.group_tile_counts (the planner's and 'auto''s count for ulysses/usp) equals
    the kernel's own count, packed documents, one row: every device of a group alike."""
    mesh = mesh_for(num_shards, data=1)
    q, k, v, _, seg = make_inputs(3, 1, 4, 2, segments="packed")
    order = layout_order(layout, seg, 1, q.shape[1], num_shards, tile=4)
    _, tiles, _ = parallel.attention_with_stats(
        *[take(x, order) for x in (q, k, v)], mesh=mesh, layout=layout,
        segment_ids=take(seg, order), order=order, strategy="usp", ulysses_degree=degree,
        tile_q=4, tile_k=4)
    groups = num_shards // degree
    want = parallel.cost.group_tile_counts(layout, num_shards, degree, q.shape[1] // num_shards,
                                           (4, 4), seg)[0]
    got = np.asarray(tiles)[:, :groups].reshape(groups, degree, groups)
    for j in range(degree):
        np.testing.assert_array_equal(got[:, j], want)
    assert not np.asarray(tiles)[:, groups:].any()
