"""pallas_gpu compiled by Triton on a real GPU, against float64: every block pair that a ring
of 4 devices meets, under every layout, with GQA, segment ids, causal and not, windows and soft
caps; and one whole causal sequence in bfloat16.

The other tests run this kernel interpreted on the CPU, where the compiler never sees it. These
need a CUDA device beside the 8 fake CPU devices, so they are skipped everywhere else (make test
included); scripts/bench/gpu_check.sh runs them on a lent H100 or H200 with
`JAX_PLATFORMS=cuda,cpu`. One GPU cannot hold a ring, so each device's meetings run one after
another on the one GPU, with the positions and segment ids the layout gives that device's
block and the key block it meets: the kernel sees exactly the inputs it sees in the ring.

The reference is written here from the contract in parallel/kernels/base.py (a block pair's own
softmax; the backward from a given lse and delta), in float64, sharing no code with the kernel.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import parallel
from parallel.kernels import pallas_gpu
from parallel.spec import TileSpec

N, SEQ_LEN, DIM, HEADS, KV_HEADS = 4, 1024, 64, 4, 2  # block 256: 2 to 8 tiles a side


def gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("needs a CUDA device (JAX_PLATFORMS=cuda,cpu on a GPU machine)")


def reference(q, k, v, do, q_pos, k_pos, q_seg, k_seg, *, causal, window, soft_cap, lse=None,
              delta=None):
    """One block pair in float64: (out, lse) of its own softmax, and (dq, dk, dv) from the
    given lse and delta (the kernel contract's global ones). q [b,H,n,d], k [b,h,m,d]."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    group = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    qp, kp = np.asarray(q_pos)[:, None, :, None], np.asarray(k_pos)[:, None, None, :]
    seen = (qp >= kp) if causal else np.ones_like(qp >= kp)
    if window is not None:
        seen &= ((qp - kp) < window) if causal else (np.abs(qp - kp) < window)
    if q_seg is not None:
        seen &= np.asarray(q_seg)[:, None, :, None] == np.asarray(k_seg)[:, None, None, :]
    scale = q.shape[-1] ** -0.5
    T = lambda x: x.swapaxes(-1, -2)  # matmuls (BLAS), not einsum: the device's CPU is slow
    raw = (q @ T(kr)) * scale
    logit = raw if soft_cap is None else soft_cap * np.tanh(raw / soft_cap)
    s = np.where(seen, logit, -np.inf)
    top = s.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(s - top).sum(-1, keepdims=True)
    own_lse = np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + top, -np.inf)[..., 0]
    p_own = np.exp(s - top) / np.where(total > 0, total, 1.0)
    out = p_own @ vr
    if lse is None:
        lse, delta = np.where(np.isfinite(own_lse), own_lse, 0.0), (do * out).sum(-1)
    p = np.where(seen, np.exp(logit - np.asarray(lse, np.float64)[..., None]), 0.0)
    ds = p * (do @ T(vr) - np.asarray(delta, np.float64)[..., None])
    if soft_cap is not None:
        ds = ds * (1.0 - np.tanh(raw / soft_cap) ** 2)
    fold = lambda x: x.reshape(k.shape[0], k.shape[1], group, *x.shape[2:]).sum(2)
    grads = (ds @ kr * scale, fold(T(ds) @ q) * scale, fold(T(p) @ do))
    return out, own_lse, lse, delta, grads


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def compiled(tiles):
    """The kernel's forward and backward, jitted for the GPU, for one TileSpec."""
    fwd = jax.jit(lambda q, k, v, qp, kp, qs, ks: pallas_gpu.forward(
        q, k, v, qp, kp, qs, ks, tiles, interpret=False))
    bwd = jax.jit(lambda q, k, v, do, lse, delta, qp, kp, qs, ks: pallas_gpu.backward(
        q, k, v, do, lse, delta, qp, kp, qs, ks, tiles, interpret=False))
    return fwd, bwd


# (causal, segments, window, soft cap, (tile_q, tile_k)): each layout meets every row.
CASES = [(True, "packed", None, None, (128, 64)), (True, None, 300, None, (64, 32)),
         (False, "packed", None, 2.0, (64, 64)), (True, "packed", 97, 1.5, (128, 64)),
         (False, None, None, None, (32, 64)),
         (True, None, None, None, (64, 32))]  # plain causal: the unmasked loops (SPLIT_FULL_TILES)


@pytest.mark.parametrize("layout", list(parallel.LAYOUTS))
@pytest.mark.parametrize("causal,segments,window,soft_cap,tile", CASES)
def test_every_block_pair_of_the_ring_matches_float64(layout, causal, segments, window,
                                                       soft_cap, tile):
    device = gpu()
    rng = np.random.default_rng(len(layout) * 7 + tile[0] + (window or 0))
    seg = (np.sort(rng.integers(0, 6, (1, SEQ_LEN)), axis=1).astype(np.int32)
           if segments else None)
    order = parallel.row_order(layout, np.zeros((1, SEQ_LEN), np.int32) if seg is None else seg,
                               N)
    block = SEQ_LEN // N
    # Positions and segment ids in the layout's order; device i holds slots
    # [i * block, (i + 1) * block).
    all_pos = order.astype(np.int32)
    all_seg = None if seg is None else np.take_along_axis(seg, order, 1)
    pos = [all_pos[:, i * block:(i + 1) * block] for i in range(N)]
    seg_of = lambda i: None if all_seg is None else all_seg[:, i * block:(i + 1) * block]
    tiles = TileSpec(tile_q=tile[0], tile_k=tile[1], causal=causal, scale=DIM ** -0.5,
                     precision=lax.Precision.HIGHEST, varying_axes=(), window=window,
                     soft_cap=soft_cap)
    fwd, bwd = compiled(tiles)
    put = lambda x: None if x is None else jax.device_put(jnp.asarray(x), device)
    # The whole sequence in the layout's order, split the same way.
    q, do = (rng.standard_normal((1, HEADS, SEQ_LEN, DIM), np.float32) for _ in "ab")
    k, v = (rng.standard_normal((1, KV_HEADS, SEQ_LEN, DIM), np.float32) for _ in "ab")
    part = lambda x, i: x[:, :, i * block:(i + 1) * block]
    options = dict(causal=causal, window=window, soft_cap=soft_cap)
    checked = 0
    for d in range(N):
        # The global lse and delta of device d's queries: their softmax over every key.
        _, _, lse, delta, _ = reference(part(q, d), k, v, part(do, d), pos[d], all_pos, seg_of(d),
                                        all_seg, **options)
        for s in range(N):
            src = (d - s) % N
            q_pos, k_pos, q_seg, k_seg = pos[d], pos[src], seg_of(d), seg_of(src)
            want_out, want_lse, _, _, want_grads = reference(
                part(q, d), part(k, src), part(v, src), part(do, d), q_pos, k_pos, q_seg, k_seg,
                lse=lse, delta=delta, **options)
            if not np.isfinite(want_lse).any():
                continue  # the strategy never calls the kernel for a pair with nothing visible
            where = f"{layout}: device {d} meets block {src}"
            args = [put(x) for x in (q_pos, k_pos, q_seg, k_seg)]
            inputs = [put(x) for x in (part(q, d), part(k, src), part(v, src))]
            out, got_lse, _ = fwd(*inputs, *args)
            assert out.devices() == {device}
            assert relative_error(out, want_out) < 1e-5, where
            finite = np.isfinite(want_lse)
            np.testing.assert_array_equal(np.isfinite(np.asarray(got_lse)), finite, where)
            assert relative_error(np.asarray(got_lse)[finite], want_lse[finite]) < 1e-5, where
            grads = bwd(*inputs, put(part(do, d)), put(lse.astype(np.float32)),
                        put(delta.astype(np.float32)), *args)
            for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
                error = relative_error(got, want)
                assert error < 1e-5, f"{where}: {name} {error:.2g}"
            checked += 1
    assert checked >= N  # at least the diagonal


def test_a_whole_causal_sequence_in_bfloat16():
    """Llama-sized heads (128) on 2,048 tokens at the kernel's default tiles, bf16 inputs: within
    bf16's rounding of the float64 result on the same (rounded) inputs."""
    device = gpu()
    n, d = 2048, 128
    rng = np.random.default_rng(0)
    bf16 = lambda shape: np.asarray(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
                                    .astype(jnp.float32))
    q, do, k, v = bf16((1, 4, n, d)), bf16((1, 4, n, d)), bf16((1, 2, n, d)), bf16((1, 2, n, d))
    pos = np.arange(n, dtype=np.int32)[None]
    tiles = TileSpec(tile_q=pallas_gpu.KERNEL.max_tiles[0], tile_k=pallas_gpu.KERNEL.max_tiles[1],
                     causal=True, scale=d ** -0.5, precision=None, varying_axes=())
    fwd, bwd = compiled(tiles)
    put = lambda x, dtype=jnp.bfloat16: jax.device_put(jnp.asarray(x, dtype), device)
    want_out, want_lse, lse, delta, want_grads = reference(
        q, k, v, do, pos, pos, None, None, causal=True, window=None, soft_cap=None)
    out, got_lse, _ = fwd(put(q), put(k), put(v), put(pos, jnp.int32), put(pos, jnp.int32),
                          None, None)
    assert relative_error(out, want_out) < 1e-2
    assert relative_error(got_lse, want_lse) < 1e-3
    grads = bwd(put(q), put(k), put(v), put(do), put(lse, jnp.float32), put(delta, jnp.float32),
                put(pos, jnp.int32), put(pos, jnp.int32), None, None)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        assert relative_error(got, want) < 2e-2, name
