"""Latent attention (MLA) whose sequence devices pass the latent, not the keys and values.

A token of DeepSeek-V3 keeps its keys and values as a latent c [R] (R = kv_lora_rank, normalised)
and one RoPE key k_r [r] every head shares; the heads' keys and values are an up-projection:

    [k_nope | v] per head = c kv_b      kv_b [R, H (nope + v)]      k = [k_nope | k_r]

So what a ring step, an all-gather or a Ulysses group moves can be the R + r values of a token
(576 for DeepSeek-V3) instead of its H (nope + r + v) (40,960): each device expands the blocks
it holds or receives through kv_b just before their tiles. The backward pulls each block's dK,
dV back through the expansion at the device that used them, so what travels home with the block
is dc [R] and dk_r [r] a token, and each device sums its share of d kv_b = c^T [dk_nope | dv]
over the blocks it met (one psum at the end):

    latent_attention(q, c, k_rope, kv_b, mesh=, layout=, ...)  -> [B, S, H, v]

q [B, S, H, nope + r] (RoPE applied), c [B, S, R], k_rope [B, S, r] (RoPE applied) in the
layout's order, sharded (batch over 'data', seq over 'seq'); kv_b replicated. Exact: the same
kernel on the same keys and values as parallel.attention(q, k, v) after the expansion.

The strategies: `ring` (the latent hops), `allgather` (the latents gathered), `ulysses` and
`usp` (the group gathers its latents and each device expands only its own heads' part of kv_b;
the queries travel by all-to-all as before). A sliding window is not taken (no MLA family has
one): parallel.attention with the expanded keys moves a window's halo.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from parallel.attention import _QKV, _LSE, _SEG, SAVED_BY_NAME, _no_cotangent, _sharded
from parallel.mesh import DATA, SEQ
from parallel.spec import make_spec
from parallel.strategies.latent_codec import LatentShape

_LATENT = P(DATA, SEQ, None)  # [B, S, R] and [B, S, r]


def latent_attention(q, c, k_rope, kv_b, *, mesh, layout, segment_ids=None, order=None,
                     causal=True, strategy="ring", kernel="auto", tile_q=None, tile_k=None,
                     scale=None, ulysses_degree=None):
    """Exact sequence-parallel latent attention (module docstring): q [B, S, H, nope + r],
    c [B, S, R], k_rope [B, S, r], kv_b [R, H (nope + v)] -> [B, S, H, v] in q's dtype.
    Arguments as parallel.attention's (no window, sinks or soft cap: MLA has none)."""
    heads, qk = q.shape[2], q.shape[3]
    rope = k_rope.shape[-1]
    shape = LatentShape(heads, qk - rope, rope, kv_b.shape[1] // heads - (qk - rope))
    if c.shape[:2] != q.shape[:2] or k_rope.shape[:2] != q.shape[:2] or c.ndim != 3 \
            or kv_b.shape != (c.shape[-1], heads * (shape.nope + shape.v)) or shape.v < 1:
        raise ValueError(f"latent attention: q {q.shape}, c {c.shape}, k_rope {k_rope.shape} "
                         f"and kv_b {kv_b.shape} do not fit together (q [B, S, H, nope + r], "
                         f"c [B, S, R], k_rope [B, S, r], kv_b [R, H (nope + v)])")
    keys = jax.ShapeDtypeStruct((*q.shape[:3], shape.width), q.dtype)
    spec = make_spec(keys, keys, keys, segment_ids, order, mesh=mesh, layout=layout,
                     strategy=strategy, kernel=kernel, causal=causal, tile_q=tile_q,
                     tile_k=tile_k, scale=qk ** -0.5 if scale is None else scale,
                     ulysses_degree=ulysses_degree)
    if not spec.strategy.passes_latents:
        raise ValueError(f"strategy {spec.strategy.name!r} does not pass latents: use ring, "
                         f"allgather, ulysses or usp, or the expanded keys (parallel.attention)")
    q = jnp.pad(q, [(0, 0)] * 3 + [(0, shape.width - qk)])
    with jax.named_scope("attention"):
        return _latent(spec, shape, q, c, k_rope, kv_b, segment_ids, order)[..., :shape.v]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _forward(spec, shape, q, c, k_rope, kv_b, seg, order):
    def local(q, c, k_rope, kv_b, seg, order):
        return spec.strategy.latent_forward(spec, shape, q, c, k_rope, kv_b, seg, order)
    return _sharded(spec, local, (q, c, k_rope, kv_b, seg, order),
                    (_QKV, _LATENT, _LATENT, P(), _SEG, _SEG), (_QKV, _LSE))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _backward(spec, shape, q, c, k_rope, kv_b, seg, order, out, lse, dout):
    def local(*args):
        dq, dc, d_rope, d_kv_b = spec.strategy.latent_backward(spec, shape, *args)
        return dq, dc, d_rope, lax.psum(d_kv_b, (DATA, SEQ))
    return _sharded(spec, local, (q, c, k_rope, kv_b, seg, order, out, lse, dout),
                    (_QKV, _LATENT, _LATENT, P(), _SEG, _SEG, _QKV, _LSE, _QKV),
                    (_QKV, _LATENT, _LATENT, P()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _latent(spec, shape, q, c, k_rope, kv_b, seg, order):
    return _forward(spec, shape, q, c, k_rope, kv_b, seg, order)[0]


def _latent_fwd(spec, shape, q, c, k_rope, kv_b, seg, order):
    out, lse = _forward(spec, shape, q, c, k_rope, kv_b, seg, order)
    # named as parallel.attention names them: remat_policy 'attention' keeps these two
    out, lse = (checkpoint_name(x, name) for x, name in zip((out, lse), SAVED_BY_NAME))
    return out, (q, c, k_rope, kv_b, seg, order, out, lse)


def _latent_bwd(spec, shape, residuals, dout):
    q, c, k_rope, kv_b, seg, order, out, lse = residuals
    dq, dc, d_rope, d_kv_b = _backward(spec, shape, q, c, k_rope, kv_b, seg, order, out, lse,
                                       dout)
    return (dq, dc.astype(c.dtype), d_rope.astype(k_rope.dtype), d_kv_b.astype(kv_b.dtype),
            _no_cotangent(seg), _no_cotangent(order))


_latent.defvjp(_latent_fwd, _latent_bwd)
