"""The Pallas kernels (pallas_gpu, pallas_tpu): exact against float64 in Pallas' interpret mode
(this CPU), the same tile counts as the xla kernel, and lowerings (Triton for CUDA, Mosaic for TPU)
that build without the accelerator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import parallel
from parallel.kernels import pallas_gpu, pallas_tpu
from parallel.spec import TileSpec
from tests.tiers import split
from tests.support.attention_cases import (OPTIONS, assert_matches_reference, layout_order,
                                           make_inputs, mesh_for, run_kernel, take, with_options)

# (num_shards, causal, segments, (q_heads, kv_heads), (tile_q, tile_k)) for every layout.
CASES = [(2, True, "packed", (4, 2), (8, 8)), (4, False, "scattered", (4, 1), (4, 8)),
         (2, True, None, (2, 2), (16, 4)),
         (2, False, None, (4, 2), (8, 8))]  # bidirectional, no segment ids: nothing to mask
PALLAS = ["pallas_gpu", "pallas_tpu"]


# Every case of every layout (balanced: with segment ids, its rows' own orders) for each kernel,
# the windows, sinks and soft caps rotating over them.
_LAID = [(layout, *case) for layout in parallel.LAYOUTS for case in CASES
         if layout != "balanced" or case[2] == "packed"]


@pytest.mark.parametrize("kernel,layout,num_shards,causal,segments,heads,tile,options",
                         split([(kernel, *case, OPTIONS[(i + 3 * j) % len(OPTIONS)])
                                for j, kernel in enumerate(PALLAS) for i, case in enumerate(_LAID)],
                               0, 7))  # each kernel and option
def test_matches_dense_reference(kernel, layout, num_shards, causal, segments, heads, tile,
                                 options):
    q, k, v, dout, seg = make_inputs(11, 2, *heads, segments=segments)
    given, reference = with_options(heads[0], options)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(num_shards, data=2), layout=layout,
                            causal=causal, tile_q=tile[0], tile_k=tile[1], kernel=kernel,
                            **given)
    assert_matches_reference(out, grads, q, k, v, seg, causal, dout, **reference)


@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_tpu_backward_splits_large_tiles_exactly(layout, monkeypatch):
    """Tiles larger than BACKWARD_TILE (1024 on a v4: too much VMEM) are split for dQ, dK, dV;
    here 16 x 8 tiles backward in 4 x 4 steps, against float64."""
    monkeypatch.setattr(pallas_tpu, "BACKWARD_TILE", 4)
    assert pallas_tpu._backward_side(16) == 4
    q, k, v, dout, seg = make_inputs(13, 2, 4, 2, segments="packed")
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(2, data=2), layout=layout,
                            causal=True, tile_q=16, tile_k=8, kernel="pallas_tpu")
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)


def test_tpu_backward_tile_fills_the_lanes():
    assert [pallas_tpu._backward_side(t) for t in (256, 512, 768, 1024, 2048)] == [
        256, 512, 384, 512, 512]


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_counts_the_same_tiles_as_the_xla_kernel(layout):
    x = np.zeros((1, 64, 1, 8), np.float32)
    seg = np.repeat(np.arange(4, dtype=np.int32), [6, 30, 20, 8])[None]  # natural order
    order = layout_order(layout, seg, 1, 64, 4, tile=4)
    counts = {kernel: np.asarray(parallel.attention_with_stats(
        x, x, x, mesh=mesh_for(4, data=1), layout=layout, kernel=kernel, tile_q=4, tile_k=4,
        segment_ids=take(seg, order), order=order)[1]) for kernel in ("xla", *PALLAS)}
    for kernel in PALLAS:
        np.testing.assert_array_equal(counts[kernel], counts["xla"], err_msg=kernel)


@pytest.mark.parametrize("kernel", PALLAS)
def test_skips_tiles_between_documents_row_by_row(kernel):
    """Each batch row skips by its own documents: two rows at once count what the xla kernel
    counts on each row alone (xla plans a group of rows together, so it runs one at a time)."""
    x = np.zeros((2, 64, 2, 8), np.float32)
    seg = np.repeat(np.array([[0, 1, 2, 3], [0, 0, 1, 1]]), 16, axis=1)  # packed documents
    run = lambda kernel, rows, seg: np.asarray(parallel.attention_with_stats(
        x[rows], x[rows], x[rows], mesh=mesh_for(2, data=1), layout="ring", kernel=kernel,
        segment_ids=None if seg is None else seg[rows], tile_q=4, tile_k=4)[1])
    both = run(kernel, slice(0, 2), seg)
    np.testing.assert_array_equal(both, run("xla", slice(0, 1), seg) + run("xla", slice(1, 2), seg))
    assert both.sum() < run(kernel, slice(0, 2), None).sum()


def export_block_pair(kernel, platform, tiles, n, d, segments=True, **kw):
    """jax.export of the kernel's forward and backward on one bf16 GQA block pair, lowered for
    `platform` (no device of that kind needed): the exported module's MLIR text."""
    b, heads, kv_heads = 1, 4, 2
    q = jax.ShapeDtypeStruct((b, heads, n, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((b, kv_heads, n, d), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((b, heads, n), jnp.float32)
    pos = jax.ShapeDtypeStruct((b, n), jnp.int32)
    seg = jax.ShapeDtypeStruct((b, n), jnp.int32)

    def fwd_bwd(q, k, v, do, lse, delta, qp, kp, qs=None, ks=None):
        out, lse_f, _ = kernel.forward(q, k, v, qp, kp, qs, ks, tiles, interpret=False)
        grads = kernel.backward(q, k, v, do, lse, delta, qp, kp, qs, ks, tiles, interpret=False)
        return out, lse_f, *grads

    args = (q, kv, kv, q, rows, rows, pos, pos) + ((seg, seg) if segments else ())
    return export.export(jax.jit(fwd_bwd), platforms=[platform], **kw)(*args).mlir_module()


@pytest.mark.parametrize("window,soft_cap", [(None, None), (100, 2.0)])
def test_lowers_to_triton_without_a_gpu(window, soft_cap):
    """The kernels must build as Triton programs: forward, dK/dV and dQ, with a window and a
    soft cap too (on an H100, reading q_pos[0] for the window's test was refused: Triton's
    lowering has no `slice`; this lowering refuses it the same way, here)."""
    tiles = TileSpec(tile_q=64, tile_k=64, causal=True, scale=0.125, precision=None,
                     varying_axes=(), window=window, soft_cap=soft_cap)
    triton = "__gpu$xla.gpu.triton"
    mlir = export_block_pair(pallas_gpu, "cuda", tiles, 256, 64, disabled_checks=[
        export.DisabledSafetyCheck.custom_call(triton)])
    assert mlir.count(triton) == 3


def test_lowers_to_mosaic_without_a_tpu():
    """The kernels must build as Mosaic programs at TPU tile sizes, with and without segment
    ids: forward, dK/dV and dQ."""
    tiles = TileSpec(tile_q=128, tile_k=256, causal=True, scale=0.125, precision=None,
                     varying_axes=())
    for segments in (True, False):
        mlir = export_block_pair(pallas_tpu, "tpu", tiles, 512, 128, segments=segments)
        assert mlir.count("tpu_custom_call") == 3


def test_tpu_tiles_must_fill_the_lanes():
    with pytest.raises(ValueError, match="needs tile_q and tile_k that are multiples of 128"):
        pallas_tpu.KERNEL.check_tiles(128, 64, interpret=False)
    pallas_tpu.KERNEL.check_tiles(8, 4, interpret=True)  # interpreted: any tile
