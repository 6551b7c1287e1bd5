"""The attention tests' cases, shared by every test of parallel.attention: inputs, meshes, the
layouts' orders, a forward and backward run in natural order, the float64 reference check, and
the rotations of options, heads, tiles and modes the sweeps draw from; and the tile counts of a
block pair (tile_counts, needed_tiles)."""

import jax
import jax.numpy as jnp
import numpy as np

import parallel
from tests.support import dense_reference as ref


SEQ_LEN = 64


# Layouts with one formula for every row (the others place each row from its documents).
STATIC = [name for name, lay in parallel.LAYOUTS.items() if not lay.data_dependent]


def mesh_for(num_shards, data=None):
    """data x seq mesh on the first data*seq devices; data fills the 8 devices by default."""
    if data is None:
        data = 8 // num_shards if num_shards in (2, 4) else 1
    return parallel.make_mesh(data, num_shards, devices=jax.devices()[: data * num_shards])


def make_inputs(seed, batch, q_heads, kv_heads, dim=8, seq_len=SEQ_LEN, segments=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seq_len, q_heads, dim)).astype(np.float32)
    k = rng.standard_normal((batch, seq_len, kv_heads, dim)).astype(np.float32)
    v = rng.standard_normal((batch, seq_len, kv_heads, dim)).astype(np.float32)
    dout = rng.standard_normal((batch, seq_len, q_heads, dim)).astype(np.float32)
    seg = None
    if segments == "packed":  # sorted document ids, random lengths
        seg = np.sort(rng.integers(0, 5, (batch, seq_len)), axis=1).astype(np.int32)
    elif segments == "scattered":  # unsorted ids: tile skipping must stay conservative
        seg = rng.integers(0, 3, (batch, seq_len)).astype(np.int32)
    return q, k, v, dout, seg


def layout_order(layout, seg, batch, seq_len, num_shards, tile=None):
    """int32 [B, S]: the original index at each slot of each row under `layout` (a static
    layout's permutation in every row; balanced places from seg, one document if None)."""
    ids = np.zeros((batch, seq_len), np.int32) if seg is None else seg
    return parallel.row_order(layout, ids, num_shards, tile=tile)


def take(x, order):
    """x [B, S, ...] in natural order -> the layout's order given by order [B, S]."""
    return np.take_along_axis(np.asarray(x), order.reshape(order.shape + (1,) * (x.ndim - 2)), 1)


def run_kernel(q, k, v, dout, seg, *, mesh, layout, causal, tile_q=None, tile_k=None, dtype=None,
               with_order=None, sinks=None, **kw):
    """Lays natural-order inputs out for `layout`, runs forward + VJP, puts results back in
    natural order. `order` goes to attention when with_order (default: when the layout needs
    it); otherwise the layout's formula places the tokens. With sinks [H], their gradient is
    the fourth of the grads."""
    order = layout_order(layout, seg, q.shape[0], q.shape[1], mesh.shape["seq"])
    inv = np.argsort(order, axis=1)
    if with_order is None:
        with_order = parallel.get_layout(layout).data_dependent
    cast = (lambda x: jnp.asarray(x, dtype)) if dtype else jnp.asarray
    seg_p = None if seg is None else jnp.asarray(take(seg, order))
    order_p = jnp.asarray(order) if with_order else None

    @jax.jit
    def fwd_bwd(q, k, v, dout, sinks):
        fn = lambda q, k, v, sinks: parallel.attention(
            q, k, v, mesh=mesh, layout=layout, segment_ids=seg_p, order=order_p, causal=causal,
            tile_q=tile_q, tile_k=tile_k, sinks=sinks, **kw)
        out, vjp = jax.vjp(fn, q, k, v, sinks)
        return out, vjp(dout)

    sinks = None if sinks is None else jnp.asarray(sinks)
    out, grads = fwd_bwd(*(cast(take(x, order)) for x in (q, k, v, dout)), sinks)
    back = lambda x: take(np.asarray(x.astype(jnp.float32)), inv)
    return back(out), tuple(back(g) for g in grads[:3]) + (
        () if sinks is None else (np.asarray(grads[3]),))


def assert_matches_reference(out, grads, q, k, v, seg, causal, dout, **options):
    """Output and dq, dk, dv (and dsinks) within 1e-5 relative of the float64 reference with
    the same options (window, sinks, soft_cap)."""
    want_out, want_grads = ref.attention(q, k, v, seg, causal, dout, **options)
    assert ref.relative_error(out, want_out) < 1e-5
    assert len(grads) == len(want_grads)
    for name, got, want in zip(("q", "k", "v", "sinks"), grads, want_grads):
        assert ref.relative_error(got, want) < 1e-5, f"d{name}"


# Windows, sinks and soft caps (issue: Mistral, Gemma, GPT-OSS), rotating over the cases: a
# window inside one device's block (8 tokens at N = 8), windows across blocks, caps that bite
# (scores here are about N(0, 1)).
OPTIONS = [{}, {"window": 5}, {"window": 21, "sinks": True}, {"logit_soft_cap": 1.5},
           {"window": 9, "logit_soft_cap": 2.0, "sinks": True}]


def with_options(q_heads, options, seed=0):
    """(attention keywords, reference keywords) of one OPTIONS entry: sinks drawn per head."""
    sinks = (np.random.default_rng(seed).standard_normal(q_heads).astype(np.float32)
             if options.get("sinks") else None)
    common = {"window": options.get("window"), "sinks": sinks}
    return ({**common, "logit_soft_cap": options.get("logit_soft_cap")},
            {**common, "soft_cap": options.get("logit_soft_cap")})


# Every layout x ring size, each with two of the four (causal, segments) modes in turn, so that
# every layout meets every mode twice (balanced, the same kernels' path for every N, takes all
# four at N = 2 and 8); head layout and tiles rotate so that MHA, GQA and MQA and every tile shape
# meet every layout, and static layouts get their tokens' places from the formula or from
# `order` in turn.
HEADS = [(2, 2), (4, 2), (4, 1)]  # (q_heads, kv_heads): MHA, GQA, MQA


TILES = [(None, None), (4, 2), (2, 4), (1, 8)]


MODES = [(True, None), (True, "packed"), (False, None), (False, "scattered")]


T = 8  # tiles per block side


TILE = 2


def tile_counts(layout, num_shards, causal=True, segment_ids=None, batch=1, data=1,
                kernel="auto"):
    """Runs the kernel on a [batch, S] problem in natural order; returns tiles[d, s] as numpy."""
    seq_len = num_shards * T * TILE
    mesh = parallel.make_mesh(data, num_shards, devices=jax.devices()[: data * num_shards])
    order = layout_order(layout, segment_ids, batch, seq_len, num_shards, tile=TILE)
    x = np.ones((batch, seq_len, 1, 4), np.float32)
    seg = None if segment_ids is None else take(segment_ids, order)
    _, tiles, _ = parallel.attention_with_stats(x, x, x, mesh=mesh, layout=layout, segment_ids=seg,
                                             order=order, causal=causal, tile_q=TILE, tile_k=TILE,
                                             kernel=kernel)
    return np.asarray(tiles)


def needed_tiles(layout, num_shards, causal=True, segment_ids=None, batch=1):
    """Brute force from the dense mask: tiles holding at least one visible (query, key) pair."""
    seq_len = num_shards * T * TILE
    block = seq_len // num_shards
    visible = ref.mask(batch, seq_len, segment_ids, causal)[:, 0]  # [b, S, S]
    order = layout_order(layout, segment_ids, batch, seq_len, num_shards, tile=TILE)
    counts = np.zeros((num_shards, num_shards), int)
    for row in range(batch):
        owner = order[row].reshape(num_shards, block)
        for d in range(num_shards):
            for step in range(num_shards):
                src = (d - step) % num_shards
                pairs = visible[row][np.ix_(owner[d], owner[src])]  # [q, k], stored order
                per_tile = pairs.reshape(T, TILE, T, TILE).any(axis=(1, 3))
                counts[d, step] = max(counts[d, step], per_tile.sum())
    return counts
