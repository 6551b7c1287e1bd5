"""Softmax attention, the layer types 'full_attention' and 'sliding_attention': causal
self-attention with RoPE and GQA over the sequence-parallel attention of parallel/ in training,
against a cache of past keys and values in decoding (model/mixers/cache.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import parallel
from model.config import FULL, SLIDING, ModelConfig
from parallel.choice import AttentionChoice
from model.layers import RMSNorm, dense, rope
from model.mixers.base import Mixer
from model.mixers.cache import KVCache, ShardedCache, attend_cached, attend_sharded


class Attention(nnx.Module):
    """Causal self-attention with RoPE and GQA; the attention itself is parallel.attention.

    What a layer's kind (cfg.layer_type: full or sliding) changes is its window and its RoPE
    (cfg.window, cfg.rope_for); the parameters are the same for both kinds, so that stacked
    blocks of mixed kinds scan. Optional: RMSNorm of each query and key head (qk_norm), learned
    sinks, a soft cap on the scores, Gemma's query scale, biases on the projections."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice):
        self.cfg, self.mesh, self.choice = cfg, mesh, choice
        bias = cfg.attention_bias or cfg.qkv_bias
        # with the output gate (Qwen3-Next) each head's query is followed by its gate
        gates = 2 if cfg.attention_output_gate else 1
        self.q = dense(cfg, cfg.d_model, gates * cfg.num_heads * cfg.head_dim, rngs, bias=bias)
        self.k = dense(cfg, cfg.d_model, cfg.num_kv_heads * cfg.head_dim, rngs, bias=bias)
        self.v = dense(cfg, cfg.d_model, cfg.num_kv_heads * cfg.head_dim, rngs, bias=bias)
        self.o = dense(cfg, cfg.num_heads * cfg.head_dim, cfg.d_model, rngs,
                       scale=1.0 / cfg.num_layers, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg, rngs, dim=cfg.head_dim)
            self.k_norm = RMSNorm(cfg, rngs, dim=cfg.head_dim)
        if cfg.attention_sinks:
            self.sinks = nnx.Param(jnp.zeros((cfg.num_heads,), cfg.weights_dtype),
                                   out_sharding=(None,))

    def options(self, kind: str) -> dict:
        """parallel.attention's keywords for a layer of this kind (window, sinks, cap, scale),
        which the decoding paths take too."""
        cfg = self.cfg
        return dict(window=cfg.window(kind),
                    sinks=self.sinks[...].astype(jnp.float32) if cfg.attention_sinks else None,
                    logit_soft_cap=cfg.attn_logit_soft_cap or None, scale=cfg.score_scale)

    def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                 collect: bool = False, kind: str = FULL):
        """x [B, S, D] -> [B, S, D]; positions (RoPE), segment_ids and order (the original
        index of each token, parallel.attention's `order`) [B, S]; the last two may be None;
        kind: this layer's attention ('full_attention' | 'sliding_attention').

        Training (cache None): the sequence-parallel attention of the configured layout,
        strategy and kernel; with `collect` (a sequence-parallel prefill) also returns this
        layer's keys and values as they sit, a KVCache. Decoding (cache: this layer's KVCache,
        or ShardedCache after a sequence-parallel prefill): the new tokens against the cache
        (model/mixers/cache.py); returns (out, updated cache)."""
        b, s, _ = x.shape
        q, k, v, gate = self.project(x, positions, kind)
        options = self.options(kind)
        if cache is None:
            out = parallel.attention(q, k, v, mesh=self.mesh, segment_ids=segment_ids,
                                     order=order, **self.choice.attention_kwargs(), **options)
        elif isinstance(cache, ShardedCache):
            out, cache = attend_sharded(q, k, v, positions, cache, self.mesh, **options)
        else:
            out, cache = attend_cached(q, k, v, positions, cache, **options)
        out = out.reshape(b, s, -1)
        if gate is not None:  # sigmoid(gate) in float32, as Qwen3-Next's torch model takes it
            out = (out.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(
                out.dtype)
        out = self.o(out)
        if collect:
            return out, KVCache(k, v)
        return out if cache is None else (out, cache)

    def project(self, x, positions, kind: str):
        """x [B, S, D] -> q [B, S, H, Dh], k, v [B, S, K, Dh], RoPE applied, and the output
        gate [B, S, H Dh] (None without cfg.attention_output_gate)."""
        cfg = self.cfg
        b, s, _ = x.shape
        q = self.q(x).reshape(b, s, cfg.num_heads, -1)
        gate = q[..., cfg.head_dim:].reshape(b, s, -1) if cfg.attention_output_gate else None
        q = q[..., :cfg.head_dim]
        k = self.k(x).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
        v = self.v(x).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        theta, scaling = cfg.rope_for(kind)
        rotary = cfg.partial_rotary_factor
        return (rope(q, positions, theta, scaling, rotary),
                rope(k, positions, theta, scaling, rotary), v, gate)


class Softmax(Mixer):
    name = "softmax"
    layer_types = (FULL, SLIDING)
    module = Attention

    def init_cache(self, cfg, batch: int, max_len: int) -> KVCache:
        shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        return KVCache(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))

    def matrix_params(self, m) -> int:
        """q (with its gate: Qwen3-Next's output gate doubles the query projection), k, v, o."""
        queries = m.num_heads * (2 if getattr(m, "attention_output_gate", False) else 1)
        return m.d_model * m.head_dim * (queries + m.num_heads + 2 * m.num_kv_heads)

    def vector_params(self, m) -> int:
        """The q and k norms, the sinks, the projections' biases."""
        return (2 * m.head_dim * m.qk_norm + m.num_heads * m.attention_sinks
                + (m.attention_bias or m.qkv_bias) * (m.num_heads + 2 * m.num_kv_heads)
                * m.head_dim + m.attention_bias * m.d_model)

    def head_widths(self, m) -> tuple[int, int]:
        return m.head_dim, m.head_dim

    def kernel_heads(self, m) -> tuple[int, int]:
        return m.num_kv_heads, m.head_dim


SOFTMAX = Softmax()
