"""Every strategy other than the ring equals dense float64 attention (forward and gradients) for
every layout, on the issue's meshes, and counts the ring's tiles per step where it should."""

import itertools

import numpy as np
import pytest

import parallel
from tests.test_attention import (HEADS, MODES, assert_matches_reference, layout_order,
                                  make_inputs, mesh_for, run_kernel, take)

OTHERS = [name for name in parallel.STRATEGIES if name != "ring"]
MESHES = [(1, 2), (2, 2), (1, 4), (1, 8), (2, 4)]  # data x seq
# Each (strategy, layout, mesh) meets one (causal, segments) mode and one head layout, rotating,
# so that every strategy sees MHA, GQA, MQA, causal or not, packed and scattered segment ids.
CASES = [(strategy, layout, mesh, MODES[i % 4], HEADS[i % 3])
         for strategy in OTHERS
         for i, (layout, mesh) in enumerate(itertools.product(parallel.LAYOUTS, MESHES))]


@pytest.mark.parametrize("strategy,layout,mesh_shape,mode,heads", CASES)
def test_matches_dense_reference(strategy, layout, mesh_shape, mode, heads):
    data, num_shards = mesh_shape
    causal, segments = mode
    mesh = mesh_for(num_shards, data=data)
    q, k, v, dout, seg = make_inputs(num_shards + data, 2 * data, *heads, segments=segments)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=layout, causal=causal,
                            tile_q=4, tile_k=4, strategy=strategy)
    assert_matches_reference(out, grads, q, k, v, seg, causal, dout)


@pytest.mark.parametrize("strategy", [s for s in OTHERS if s == "allgather"])
@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_allgather_runs_the_rings_tiles(strategy, layout):
    """allgather meets the blocks in the ring's order with the same kernel: tiles[d, s] equal."""
    mesh = mesh_for(4, data=1)
    q, k, v, _, seg = make_inputs(3, 2, 4, 2, segments="packed")
    order = layout_order(layout, seg, 2, q.shape[1], 4, tile=4)
    args = [take(x, order) for x in (q, k, v)]
    counts = {s: np.asarray(parallel.attention_with_stats(
        *args, mesh=mesh, layout=layout, segment_ids=take(seg, order), order=order,
        strategy=s, tile_q=4, tile_k=4)[1]) for s in ("ring", strategy)}
    np.testing.assert_array_equal(counts[strategy], counts["ring"])
    assert counts["ring"].sum() > 0
