"""Building blocks of the decoder: projections, RMSNorm, RoPE, the gated MLP (SwiGLU or GeGLU);
the token mixers (attention and the recurrent layers) are in model/mixers/.

Shapes: B batch, S sequence (in the attention layout's order, sharded over 'seq'), D d_model,
H query heads, K key/value heads, Dh head dim. Parameters carry sharding annotations: every
matrix is sharded on its first axis over the whole mesh (FSDP over ('data', 'seq')), so each
device stores 1/devices of the weights and XLA gathers them layer by layer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

import parallel
from parallel.chunks import map_chunks
from model.config import ModelConfig
from model.rope import RopeScaling, frequencies

FSDP = (parallel.DATA, parallel.SEQ)  # parameter shards span the whole mesh
ACTIVATIONS = jax.P(parallel.DATA, parallel.SEQ)  # [B, S, ...]: batch over data, seq over seq


def dense(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs, scale: float = 1.0,
          bias: bool = False):
    """A [d_in, d_out] projection sharded over the whole mesh on its first axis; with `bias`,
    a bias (zeros, replicated)."""
    init = nnx.initializers.variance_scaling(scale, "fan_in", "normal")
    return nnx.Linear(d_in, d_out, use_bias=bias, dtype=cfg.compute_dtype,
                      param_dtype=cfg.weights_dtype, rngs=rngs,
                      kernel_init=nnx.with_partitioning(init, (FSDP, None)),
                      bias_init=nnx.with_partitioning(nnx.initializers.zeros, (None,)))


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32. [..., D] -> [..., D] in the compute dtype (D:
    d_model, or `dim`: head_dim for the norms of queries and keys). The scale is float32
    whatever the parameters' dtype: D numbers a layer, and Gemma's stored scale - 1 comes back
    exactly (in bfloat16, 1 + w would lose w's low bits)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, dim: int | None = None,
                 eps: float | None = None):
        del rngs
        self.eps, self.dtype = cfg.norm_eps if eps is None else eps, cfg.compute_dtype
        self.scale = nnx.Param(jnp.ones((dim or cfg.d_model,), jnp.float32),
                               out_sharding=(None,))

    def __call__(self, x):
        return rms_norm(x, self.scale[...], self.eps, self.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm(x, scale, eps: float, dtype):
    """(x / sqrt(mean(x^2) + eps) * scale).astype(dtype), in float32, over the last axis.

    Its backward keeps only x (in its own dtype) and the float32 reciprocal rms per token; left
    to autodiff it would keep float32 copies of x and of x / rms besides (2 x 4 bytes x D per
    token more).
    """
    return _rms_norm_fwd(x, scale, eps, dtype)[0]


def _rms_norm_fwd(x, scale, eps, dtype):
    xf = x.astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * inv_rms * scale.astype(jnp.float32)).astype(dtype), (x, scale, inv_rms)


def _rms_norm_bwd(eps, dtype, residuals, dy):
    # y = s * xhat with xhat = x r, r = (mean(x^2) + eps)^-1/2, so for g = dy * s:
    # dx = r (g - xhat mean(g xhat)),  dscale = sum over tokens of dy * xhat.
    x, scale, inv_rms = residuals
    xhat = x.astype(jnp.float32) * inv_rms
    dy = dy.astype(jnp.float32)
    g = dy * scale.astype(jnp.float32)
    dx = inv_rms * (g - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dscale = jnp.sum(dy * xhat, axis=tuple(range(x.ndim - 1)))
    return dx.astype(x.dtype), dscale.astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rope(x, positions, theta: float, scaling: RopeScaling = RopeScaling(), rotary: float = 1.0):
    """Rotary embedding by ORIGINAL token positions (never local offsets).

    x [B, S, heads, Dh]; positions [B, S] int, in the same (permuted) order as x. Pairs dimension
    i with i + Dh/2 and rotates it by positions * inv_freq[i]: theta^(-2i/Dh), or as `scaling`
    rescales it (model/rope.py), which may also scale cos and sin (YaRN's attention factor).
    rotary < 1: only the first Dh x rotary dimensions are rotated so (as if they were the
    head), the rest pass unchanged (GLM-4.5's partial rotary); 0: none (Granite 4.0's NoPE).
    """
    if rotary == 0.0:
        return x
    if rotary != 1.0:
        d = int(x.shape[-1] * rotary)
        return jnp.concatenate([rope(x[..., :d], positions, theta, scaling), x[..., d:]], -1)
    inv_freq, factor = frequencies(x.shape[-1], float(theta), scaling)
    angle = positions.astype(jnp.float32)[..., None, None] * jnp.asarray(inv_freq)  # [B,S,1,Dh/2]
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    if factor != 1.0:
        sin, cos = sin * factor, cos * factor
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (act silu, Llama) or GeGLU (GELU with the tanh
    approximation, Gemma). [B, S, D] -> [B, S, D]; with cfg.mlp_chunk, a chunk of each device's
    tokens at a time (parallel/chunks.py), so the [B, S, F] hidden values never exist."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, width: int = 0):
        self.mesh, self.chunk, self.dtype = mesh, cfg.mlp_chunk, cfg.compute_dtype
        self.activation = cfg.mlp_activation
        width = width or cfg.mlp_dim  # another width: the shared experts (model/moe.py)
        self.gate = dense(cfg, cfg.d_model, width, rngs)
        self.up = dense(cfg, cfg.d_model, width, rngs)
        self.down = dense(cfg, width, cfg.d_model, rngs, scale=1.0 / cfg.num_layers)

    def __call__(self, x):
        weights = tuple(layer.kernel[...] for layer in (self.gate, self.up, self.down))
        return map_chunks(functools.partial(gated_mlp, dtype=self.dtype,
                                            activation=self.activation), weights, x,
                          mesh=self.mesh, chunk=self.chunk)


_ACTIVATIONS = {"silu": jax.nn.silu,
                "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}


def gated_mlp(weights, x, dtype, activation: str = "silu"):
    """down(act(x gate) * (x up)) with weights (gate [D, F], up [D, F], down [F, D]); matmuls in
    `dtype`, as nnx.Linear computes them."""
    gate, up, down = (w.astype(dtype) for w in weights)
    x = x.astype(dtype)
    return jnp.dot(_ACTIVATIONS[activation](jnp.dot(x, gate)) * jnp.dot(x, up), down)
