"""Building blocks of the decoder: RMSNorm, RoPE, attention (sequence-parallel), SwiGLU MLP.

Shapes: B batch, S sequence (in the attention layout's order, sharded over 'seq'), D d_model,
H query heads, K key/value heads, Dh head dim. Parameters carry sharding annotations: every
matrix is sharded on its first axis over the whole mesh (FSDP over ('data', 'seq')), so each
device stores 1/devices of the weights and XLA gathers them layer by layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import parallel
from model.config import ModelConfig

FSDP = (parallel.DATA, parallel.SEQ)  # parameter shards span the whole mesh
ACTIVATIONS = jax.P(parallel.DATA, parallel.SEQ)  # [B, S, ...]: batch over data, seq over seq


def dense(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs, scale: float = 1.0):
    init = nnx.initializers.variance_scaling(scale, "fan_in", "normal")
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=cfg.compute_dtype,
                      param_dtype=cfg.weights_dtype, rngs=rngs,
                      kernel_init=nnx.with_partitioning(init, (FSDP, None)))


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32. [..., D] -> [..., D] in the compute dtype."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        del rngs
        self.eps, self.dtype = cfg.norm_eps, cfg.compute_dtype
        self.scale = nnx.Param(jnp.ones((cfg.d_model,), cfg.weights_dtype), out_sharding=(None,))

    def __call__(self, x):
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (x * self.scale[...].astype(jnp.float32)).astype(self.dtype)


def rope(x, positions, theta: float):
    """Rotary embedding by ORIGINAL token positions (never local offsets).

    x [B, S, heads, Dh]; positions [B, S] int, in the same (permuted) order as x. Pairs dimension
    i with i + Dh/2 and rotates it by positions * theta^(-2i/Dh).
    """
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [Dh/2]
    angle = positions.astype(jnp.float32)[..., None, None] * freq  # [B, S, 1, Dh/2]
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Causal self-attention with RoPE and GQA; the attention itself is parallel.attention."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs):
        self.cfg, self.mesh = cfg, mesh
        self.q = dense(cfg, cfg.d_model, cfg.num_heads * cfg.head_dim, rngs)
        self.k = dense(cfg, cfg.d_model, cfg.num_kv_heads * cfg.head_dim, rngs)
        self.v = dense(cfg, cfg.d_model, cfg.num_kv_heads * cfg.head_dim, rngs)
        self.o = dense(cfg, cfg.num_heads * cfg.head_dim, cfg.d_model, rngs,
                       scale=1.0 / cfg.num_layers)

    def __call__(self, x, positions, segment_ids, order=None):
        """x [B, S, D] -> [B, S, D]; positions (RoPE), segment_ids and order (the original
        index of each token, parallel.attention's `order`) [B, S]; the last two may be None."""
        cfg = self.cfg
        b, s, _ = x.shape
        q = self.q(x).reshape(b, s, cfg.num_heads, cfg.head_dim)
        k = self.k(x).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
        v = self.v(x).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
        q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
        out = parallel.attention(q, k, v, mesh=self.mesh, layout=cfg.attention_layout,
                                 strategy=cfg.attention_strategy, kernel=cfg.attention_kernel,
                                 segment_ids=segment_ids, order=order, tile_q=cfg.tile_q or None,
                                 tile_k=cfg.tile_k or None,
                                 ulysses_degree=cfg.ulysses_degree or None)
        return self.o(out.reshape(b, s, cfg.num_heads * cfg.head_dim))


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)). [B, S, D] -> [B, S, D]."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.gate = dense(cfg, cfg.d_model, cfg.mlp_dim, rngs)
        self.up = dense(cfg, cfg.d_model, cfg.mlp_dim, rngs)
        self.down = dense(cfg, cfg.mlp_dim, cfg.d_model, rngs, scale=1.0 / cfg.num_layers)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))
