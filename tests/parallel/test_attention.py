"""parallel.attention equals dense float64 attention: forward and gradients, every layout."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parallel
from parallel.kernels import xla
from tests.tiers import split
from tests.support import dense_reference as ref
from tests.support.attention_cases import (assert_matches_reference, HEADS, layout_order,
                                           make_inputs, mesh_for, MODES, OPTIONS, run_kernel,
                                           SEQ_LEN, STATIC, take, TILES, with_options)


_PICKED = [(layout, n, mode)
           for i, (layout, n) in enumerate(itertools.product(parallel.LAYOUTS, (1, 2, 4, 8)))
           for j, mode in enumerate(MODES)
           if (layout in STATIC and (i + j) % 2 == 0) or (layout not in STATIC and n in (2, 8))]
CASES = [(layout, n, *mode, HEADS[c % 3], TILES[c % 4], (c // 4) % 2 == 1, OPTIONS[c % 5])
         for c, (layout, n, mode) in enumerate(_PICKED)]


# The fast tier: a case of every layout and option; the sweeps tier: the rest.
@pytest.mark.parametrize("layout,num_shards,causal,segments,heads,tile,with_order,options",
                         split(CASES, 0, 7))
def test_matches_dense_reference(layout, num_shards, causal, segments, heads, tile, with_order,
                                 options):
    mesh = mesh_for(num_shards)
    batch = 2 * mesh.shape["data"]
    q, k, v, dout, seg = make_inputs(num_shards, batch, *heads, segments=segments)
    given, reference = with_options(heads[0], options, seed=num_shards)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=layout, causal=causal,
                            tile_q=tile[0], tile_k=tile[1],
                            with_order=with_order or parallel.get_layout(layout).data_dependent,
                            **given)
    assert_matches_reference(out, grads, q, k, v, seg, causal, dout, **reference)


def test_reference_agrees_with_autodiff():
    """The numpy backward is itself checked against jax.grad of a dense float32 einsum."""
    q, k, v, dout, seg = make_inputs(7, 2, 4, 2, segments="packed")

    def dense(q, k, v):
        kr, vr = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, kr, precision="highest") / np.sqrt(q.shape[-1])
        s = jnp.where(ref.mask(2, SEQ_LEN, seg, True), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), vr, precision="highest")

    out, vjp = jax.vjp(dense, q, k, v)
    want_out, want_grads = ref.attention(q, k, v, seg, True, dout)
    assert ref.relative_error(out, want_out) < 1e-5
    for got, want in zip(vjp(dout), want_grads):
        assert ref.relative_error(got, want) < 1e-5


@pytest.mark.parametrize("layout", split(parallel.LAYOUTS, fast=[0, 3]))
def test_data_sharded_two_by_four(layout):
    mesh = mesh_for(4, data=2)
    q, k, v, dout, seg = make_inputs(11, 4, 4, 2, segments="packed")
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=layout, causal=True)
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)
    # Output keeps the input's sharding: batch over 'data', seq over 'seq'.
    order = layout_order(layout, seg, 4, SEQ_LEN, 4)
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    qs, ks, vs = (jax.device_put(take(x, order), sharding) for x in (q, k, v))
    y = jax.jit(lambda a, b, c, o: parallel.attention(a, b, c, mesh=mesh, layout=layout,
                                                      order=o))(qs, ks, vs,
                                                                jax.device_put(order, sharding))
    assert y.sharding.is_equivalent_to(sharding, 4)


@pytest.mark.parametrize("layout", split(["striped", "balanced"], fast=[1]))  # static, per-row
def test_bfloat16_error_does_not_grow_with_ring_size(layout):
    seq_len = 256
    q, k, v, dout, seg = make_inputs(3, 2, 4, 2, dim=16, seq_len=seq_len, segments="packed")
    # The reference sees exactly the bfloat16 values the kernel sees.
    q, k, v, dout = (np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
                     for x in (q, k, v, dout))
    want_out, want_grads = ref.attention(q, k, v, seg, True, dout)
    errors = {}
    for n in (1, 2, 8):
        out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(n, data=1), layout=layout,
                                causal=True, dtype=jnp.bfloat16)
        assert np.isfinite(out).all()
        errors[n] = max(ref.relative_error(out, want_out),
                        *(ref.relative_error(g, w) for g, w in zip(grads, want_grads)))
    assert max(errors.values()) < 2e-2, errors  # about bfloat16's precision, 2**-8
    assert max(errors.values()) <= 1.5 * errors[1], errors


@pytest.mark.parametrize("layout", split(parallel.LAYOUTS, fast=[0]))
def test_mesh_with_explicit_axes(layout):
    """jax.make_mesh's default (Explicit axes) works too, with plain or sharded inputs."""
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    assert mesh.axis_types[0] == jax.sharding.AxisType.Explicit
    q, k, v, dout, seg = make_inputs(5, 4, 4, 2, segments="packed")
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=layout, causal=True)
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)
    order = layout_order(layout, None, 4, SEQ_LEN, 4)
    with jax.set_mesh(mesh):
        rows = jax.NamedSharding(mesh, jax.P("data", "seq"))
        placed = [jax.device_put(take(x, order), rows) for x in (q, k, v)]
        placed.append(jax.device_put(order, rows))
        y = jax.jit(lambda a, b, c, o: parallel.attention(a, b, c, mesh=mesh, layout=layout,
                                                          order=o))(*placed)
    np.testing.assert_allclose(take(np.asarray(y), np.argsort(order, axis=1)),
                               ref.attention(q, k, v, None, True), rtol=1e-4, atol=1e-5)


# (SCORE_BUDGET, MASK_PIECE, (heads per group, query rows per step)) for batch 2, H=4, h=2,
# tiles of 8: groups smaller than a KV head's query heads, equal to them, one batch row, two rows;
# row steps smaller than a tile; masked tiles whole (piece 8) or in pieces of 2 and 4.
GROUPINGS = [(16, 2, (1, 2)), (64, 4, (1, 8)), (128, 8, (2, 8)), (256, 2, (4, 8)),
             (512, 4, (8, 8))]


@pytest.mark.parametrize("budget,piece,grouping,layout",
                         split([(*g, "striped") for g in GROUPINGS]
                               + [(*g, "balanced") for g in GROUPINGS if g[2][0] > 4], 3))
def test_every_cut_of_heads_rows_and_masked_tiles_is_exact(monkeypatch, budget, piece, grouping,
                                                           layout):
    """The xla kernel takes heads in groups and queries in steps sized by SCORE_BUDGET, and
    computes masked tiles in pieces of MASK_PIECE; every cut gives the reference's numbers,
    with GQA, documents and causal masks, and with rows placed alike (striped) or each its own
    way (balanced: a group of two rows holds two orders)."""
    monkeypatch.setattr(xla, "SCORE_BUDGET", budget)
    monkeypatch.setattr(xla, "MASK_PIECE", piece)
    groups = xla.Groups.choose(2, 4, 2, 8, 8)
    assert (groups.size, groups.rows) == grouping
    jax.clear_caches()  # the compiled kernels of other settings must not be reused
    q, k, v, dout, seg = make_inputs(13, 2, 4, 2, segments="packed")
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh_for(2, data=1), layout=layout,
                            causal=True, tile_q=8, tile_k=8)
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)
