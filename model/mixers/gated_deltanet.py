"""Gated DeltaNet layers: the blocks of model.layer_types 'linear_attention' (Qwen3-Next's three
of every four), token mixing by the gated delta rule (model/rules/gated_delta.py) instead of softmax.

    x [B, S, D] -> qkvz, ba projections (by key head, Hugging Face's layout)
      q, k, v -> causal depthwise conv (conv_kernel taps, silu) -> l2-normalised q (/ sqrt dk), k
      beta = sigmoid(b),  g = -exp(a_log) softplus(a + dt_bias)     (per value head, float32)
      o = the gated delta rule                                      [B, S, Hv, dv]
      out = (rmsnorm(o) scale silu(z)) W_out                        [B, S, D]

Over the 'seq' devices (training), parallel.linear_strategy's way (parallel/recurrent/):
'state', each device scans its contiguous block from a zero state and the devices pass states
(bytes independent of the length), or 'heads', all-to-alls to whole rows of a few heads.
Documents (segment ids): the state and the convolution start afresh at each document's first
token.

Decoding: the layer's cache is its state (LinearCache: the recurrent state per value head and
the convolution's last inputs), one token or a prompt at a time.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from model.mixers import recurrent
from model.config import LinearAttentionConfig, ModelConfig
from model.rules.gated_delta import F32, gated_delta_rule
from model.layers import dense, rms_norm
from model.mixers.base import Mixer
from model.mixers.cache import LinearCache
from model.rules.short_conv import causal_conv
from parallel.choice import UNPLANNED, AttentionChoice
from parallel.recurrent import Recurrence, RecurrentShape

LINEAR = "linear_attention"  # its layer type (Hugging Face's name, though it is not softmax)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:
    """One layer's parameters as arrays (ours are [in, out]): qkvz [D, 2 Hk dk + 2 Hv dv] and
    ba [D, 2 Hv] by key head (each key head's q, k, then its Hv / Hk value heads' v, then
    their z; its b's then its a's), conv [K, 2 Hk dk + Hv dv] over q | k | v, dt_bias, a_log
    [Hv], norm [dv], out [Hv dv, D]."""

    qkvz: jax.Array
    ba: jax.Array
    conv: jax.Array
    dt_bias: jax.Array
    a_log: jax.Array
    norm: jax.Array
    out: jax.Array


class GatedDeltaNet(nnx.Module):
    """A Gated DeltaNet layer with Block's attention interface: (x, positions, segment_ids,
    order, cache=, collect=, kind=) -> out [B, S, D] (positions unused: no RoPE)."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice):
        self.cfg, self.mesh, self.choice = cfg, mesh, choice
        la = cfg.linear_attention
        hv, dv, kernel = la.num_value_heads, la.value_head_dim, la.conv_kernel
        self.qkvz = dense(cfg, cfg.d_model, la.conv_channels + hv * dv, rngs)
        self.ba = dense(cfg, cfg.d_model, 2 * hv, rngs)
        bound = kernel ** -0.5  # a depthwise conv's fan-in is its kernel
        self.conv = nnx.Param(jax.random.uniform(rngs.params(), (kernel, la.conv_channels),
                                                 cfg.weights_dtype, -bound, bound),
                              out_sharding=(None, None))
        # Decays of every time scale: exp(a_log) from 1 to 16, times softplus(dt_bias) 0.001..0.1
        # (Mamba's ranges); float32 and no weight decay (training/optim.py), as norm scales.
        dt = jnp.exp(jax.random.uniform(rngs.params(), (hv,), F32, jnp.log(1e-3), jnp.log(0.1)))
        self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)), out_sharding=(None,))
        self.a_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (hv,), F32, 1.0, 16.0)),
                               out_sharding=(None,))
        self.norm = nnx.Param(jnp.ones((dv,), F32), out_sharding=(None,))
        self.out = dense(cfg, hv * dv, cfg.d_model, rngs, scale=1.0 / cfg.num_layers)

    def weights(self) -> Weights:
        return Weights(self.qkvz.kernel[...], self.ba.kernel[...], self.conv[...],
                       self.dt_bias[...], self.a_log[...], self.norm[...], self.out.kernel[...])

    def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                 collect: bool = False, kind: str = LINEAR):
        """Training (cache None): x [B, S, D] in the layout's order, sharded over the mesh ->
        [B, S, D]. Decoding (cache: this layer's LinearCache, tokens in natural order from
        where the cache ends; every row at the same point): (out, the cache after them).
        With `collect` (a sequence-parallel prefill of prompts: segment 0, padding after them
        segment 1): (out, the LinearCache after each row's prompt)."""
        del positions, kind
        cfg = self.cfg
        if cache is not None:
            return layer(self.weights(), x, cfg, cache=cache)
        return layer(self.weights(), x, cfg, self.choice, segment_ids=segment_ids, order=order,
                     mesh=self.mesh, collect=collect)


def layer(w: Weights, x, cfg: ModelConfig, choice: AttentionChoice = UNPLANNED,
          segment_ids=None, order=None, mesh=None, cache=None, collect: bool = False):
    """The layer as a function of its weights: x [B, S, D] -> [B, S, D] in the compute dtype
    (with `cache`: (out, new cache)). With a mesh of more than one 'seq' device the sequence is
    split over them in the choice's layout's order (order: the batch's original indices, required by
    'balanced'). collect: the tokens of segment 0 are each row's prompt, the rest padding
    after it; returns (out, the LinearCache a decoder continues the prompts from). With
    cfg.linear_chunk, training runs each device's tokens a piece at a time
    (model/mixers/recurrent.py says which way a call runs)."""
    return recurrent.run(w, x, recurrence(cfg), w.conv.astype(F32), None, cfg, choice,
                         segment_ids, order, mesh, cache, collect)


def recurrence(cfg: ModelConfig) -> Recurrence:
    """The layer as parallel/recurrent/'s strategies see it: q | k | v channels by key
    head, the value heads grouped by key head, the gated delta rule, the projections in and
    out."""
    la, dtype = cfg.linear_attention, cfg.compute_dtype
    hk, hv, dk, dv = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
    group = hv // hk

    def project(w: Weights, x):  # -> mixed [b, n, C], g, beta [b, n, Hv], z [b, n, Hv, dv]
        b, s, _ = x.shape
        x = x.astype(dtype)
        qkvz = jnp.dot(x, w.qkvz.astype(dtype)).reshape(b, s, hk, 2 * dk + 2 * group * dv)
        q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
        v = qkvz[..., 2 * dk:2 * dk + group * dv]
        z = qkvz[..., 2 * dk + group * dv:].reshape(b, s, hv, dv)
        mixed = jnp.concatenate([t.reshape(b, s, -1) for t in (q, k, v)], axis=-1).astype(F32)
        ba = jnp.dot(x, w.ba.astype(dtype)).reshape(b, s, hk, 2 * group).astype(F32)
        beta = jax.nn.sigmoid(ba[..., :group].reshape(b, s, hv))
        a = ba[..., group:].reshape(b, s, hv)
        g = -jnp.exp(w.a_log.astype(F32)) * jax.nn.softplus(a + w.dt_bias.astype(F32))
        return mixed, g, beta, z

    def finish(w: Weights, o, z):  # o [b, n, Hv, dv] -> [b, n, D]
        b, s = o.shape[:2]
        o = rms_norm(o, w.norm, cfg.norm_eps, F32) * jax.nn.silu(z.astype(F32))
        return jnp.dot(o.reshape(b, s, hv * dv).astype(dtype), w.out.astype(dtype))

    return Recurrence(
        widths=(dk, dk, group * dv), groups=hk, heads=hv, chunk=la.chunk_size,
        rule=gated_delta_rule, heads_of=lambda mixed, groups: (*_heads(mixed, la, groups), None),
        conv=causal_conv, project=project, finish=finish)


def _heads(mixed, la, key_heads: int | None = None):
    """The convolution's output [B, S, C] of `key_heads` key heads (default: all) -> q
    (l2-normalised, / sqrt dk), k (l2-normalised), each repeated over its key head's value
    heads, and v: [B, S, Hv', dk or dv]."""
    b, s, _ = mixed.shape
    hk = key_heads or la.num_key_heads
    hv = hk * (la.num_value_heads // la.num_key_heads)
    dk, dv = la.key_head_dim, la.value_head_dim
    q = mixed[..., :hk * dk].reshape(b, s, hk, dk)
    k = mixed[..., hk * dk:2 * hk * dk].reshape(b, s, hk, dk)
    v = mixed[..., 2 * hk * dk:].reshape(b, s, hv, dv)
    q = jnp.repeat(l2_normalize(q) * dk ** -0.5, hv // hk, axis=2)
    return q, jnp.repeat(l2_normalize(k), hv // hk, axis=2), v


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (the layer's q and k)."""
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


class GatedDeltaNetKind(Mixer):
    name = "gated_deltanet"
    layer_types = (LINEAR,)
    module = GatedDeltaNet

    def check(self, m) -> None:
        if not LinearAttentionConfig.from_config(m.linear_attention).enabled:
            raise ValueError("model.layer_types has 'linear_attention' layers but "
                             "model.linear_attention.num_key_heads is 0: give the Gated "
                             "DeltaNet layers' heads (model.linear_attention)")

    def init_cache(self, cfg, batch: int, max_len: int) -> LinearCache:
        """Its state per value head and the convolution's last inputs: no length in it."""
        la = cfg.linear_attention
        return LinearCache(
            jnp.zeros((batch, la.num_value_heads, la.key_head_dim, la.value_head_dim), F32),
            jnp.zeros((batch, la.conv_kernel - 1, la.conv_channels), F32))

    def matrix_params(self, m) -> int:
        """qkvz d (2 Hk dk + 2 Hv dv), ba d 2 Hv, out Hv dv d."""
        la = LinearAttentionConfig.from_config(m.linear_attention)
        values = la.num_value_heads * la.value_head_dim
        return m.d_model * (la.conv_channels + values + 2 * la.num_value_heads) + values * m.d_model

    def vector_params(self, m) -> int:
        """The convolution (replicated: a vector here), dt_bias and a_log, the norm."""
        la = LinearAttentionConfig.from_config(m.linear_attention)
        return la.conv_kernel * la.conv_channels + 2 * la.num_value_heads + la.value_head_dim

    def recurrent(self, m) -> RecurrentShape:
        la = LinearAttentionConfig.from_config(m.linear_attention)
        return RecurrentShape(la.num_value_heads, la.key_head_dim, la.value_head_dim,
                              la.conv_channels, la.conv_kernel, la.num_key_heads, la.chunk_size,
                              solves=True)


GATED_DELTANET = GatedDeltaNetKind()
