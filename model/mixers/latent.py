"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-V3, Kimi K2, Moonlight), as functions of
its weights; the layer that holds them, and the ring that passes the latent, build on these.

A token's keys and values are made from a latent c [kv_lora_rank] (RMS-normalised) and one RoPE
key k_r [qk_rope_head_dim] that every head shares:

    x [B, S, D] --kv_a--> [c | k_r]                 c = RMSNorm(c); k_r rotated by position
    c --kv_b--> per head [k_nope (qk_nope_head_dim) | v (v_head_dim)]
    k = [k_nope | k_r]  (qk_nope + qk_rope wide), v (v_head_dim wide: not the keys' width)
    q = x --q--> or x --q_a--> RMSNorm --q_b--> per head [q_nope | q_r], q_r rotated

The latent plus the RoPE key (kv_lora_rank + qk_rope_head_dim values a token: 576 for
DeepSeek-V3) is what a ring can pass instead of the expanded keys and values (heads x (qk + v):
40,960). The softmax scale is qk_head_dim^-0.5, times mscale^2 under DeepSeek's YaRN
(0.1 mscale_all_dim ln(factor) + 1), as transformers computes it. DeepSeek lays RoPE's pairs
out interleaved, (x0, x1), (x2, x3), ...; `rope_interleave` reads them so (the halves
convention of model/layers.rope otherwise). The latent norms' epsilon is 1e-6, DeepSeek's own,
not the model's rms_norm_eps.

Weights, [in, out] like every dense kernel here: q [D, H x qk] (or q_a [D, Rq], q_a_norm [Rq],
q_b [Rq, H x qk]), kv_a [D, R + qk_rope], kv_a_norm [R], kv_b [R, H x (qk_nope + v)],
o [H x v, D].
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

import parallel
from model.config import FULL, SLIDING, MLAConfig, ModelConfig
from model.layers import RMSNorm, dense, rms_norm, rope
from model.mixers.attention import Attention
from model.mixers.base import Mixer
from model.mixers.cache import KVCache
from model.rope import RopeScaling
from parallel.choice import AttentionChoice

LATENT_NORM_EPS = 1e-6


def softmax_scale(mla: MLAConfig, scaling: RopeScaling) -> float:
    """qk_head_dim^-0.5, times mscale^2 where YaRN gives mscale_all_dim (DeepSeek's rule)."""
    scale = mla.qk_head_dim ** -0.5
    if scaling.rope_type != "default" and scaling.mscale_all_dim and scaling.factor > 1:
        mscale = 0.1 * scaling.mscale_all_dim * math.log(scaling.factor) + 1.0
        scale *= mscale * mscale
    return scale


def rotate(x, positions, theta: float, scaling: RopeScaling, interleave: bool):
    """RoPE of x [..., S, heads, d] by position; with `interleave`, the pairs are (2i, 2i+1).
    The result lays each pair out as halves either way: q and k get the same layout, so their
    dot products are the interleaved rotation's."""
    if interleave:
        x = jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    return rope(x, positions, theta, scaling)


def queries(w, x, mla: MLAConfig, num_heads: int, dtype):
    """(q_nope [B, S, H, qk_nope], q_rope [B, S, H, qk_rope]) before RoPE."""
    if mla.q_lora_rank:
        q = jnp.dot(rms_norm(jnp.dot(x, w["q_a"]), w["q_a_norm"], LATENT_NORM_EPS, dtype),
                    w["q_b"])
    else:
        q = jnp.dot(x, w["q"])
    q = q.reshape(*x.shape[:-1], num_heads, mla.qk_head_dim)
    return q[..., :mla.qk_nope_head_dim], q[..., mla.qk_nope_head_dim:]


def latent(w, x, mla: MLAConfig, dtype):
    """(c [B, S, kv_lora_rank] normalised, k_rope [B, S, 1, qk_rope] before RoPE): what a token
    keeps of its keys and values."""
    c_and_k = jnp.dot(x, w["kv_a"])
    c = rms_norm(c_and_k[..., :mla.kv_lora_rank], w["kv_a_norm"], LATENT_NORM_EPS, dtype)
    return c, c_and_k[..., None, mla.kv_lora_rank:]


def expand(kv_b, c, k_rope, mla: MLAConfig, num_heads: int):
    """(k [B, S, H, qk_head_dim], v [B, S, H, v_head_dim]) from the latent and the rotated RoPE
    key: the up-projection every device applies to the blocks it holds or receives."""
    kv = jnp.dot(c, kv_b).reshape(*c.shape[:-1], num_heads,
                                  mla.qk_nope_head_dim + mla.v_head_dim)
    k_nope, v = kv[..., :mla.qk_nope_head_dim], kv[..., mla.qk_nope_head_dim:]
    k_rope = jnp.broadcast_to(k_rope, (*k_nope.shape[:-1], mla.qk_rope_head_dim))
    return jnp.concatenate([k_nope, k_rope.astype(k_nope.dtype)], axis=-1), v


def mla_attention(w, x, positions, mla: MLAConfig, num_heads: int, theta: float,
                  scaling: RopeScaling, attend, dtype=jnp.float32):
    """x [B, S, D] -> [B, S, D]. attend(q, k, v, scale) -> [B, S, H, v_head_dim] is the
    attention itself (causal; parallel.attention, or a dense one in a test)."""
    x = x.astype(dtype)
    q_nope, q_rope = queries(w, x, mla, num_heads, dtype)
    c, k_rope = latent(w, x, mla, dtype)
    q_rope = rotate(q_rope, positions, theta, scaling, mla.rope_interleave)
    k_rope = rotate(k_rope, positions, theta, scaling, mla.rope_interleave)
    k, v = expand(w["kv_b"], c, k_rope, mla, num_heads)
    q = jnp.concatenate([q_nope, q_rope], axis=-1)
    out = attend(q, k, v, softmax_scale(mla, scaling))
    return jnp.dot(out.reshape(*x.shape[:-1], num_heads * mla.v_head_dim), w["o"])


class LatentAttention(Attention):
    """The MLA layer: Attention's training, prefill and decoding paths (model/mixers/attention.py) over
    the keys and values its latent expands to; parameters as the module docstring lists them
    (q or q_a, q_a_norm, q_b; kv_a, kv_a_norm, kv_b; o), sharded as every dense kernel is."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice):
        self.cfg, self.mesh, self.choice = cfg, mesh, choice
        mla, heads, d = cfg.mla, cfg.num_heads, cfg.d_model
        if mla.q_lora_rank:
            self.q_a = dense(cfg, d, mla.q_lora_rank, rngs)
            self.q_a_norm = RMSNorm(cfg, rngs, dim=mla.q_lora_rank, eps=LATENT_NORM_EPS)
            self.q_b = dense(cfg, mla.q_lora_rank, heads * mla.qk_head_dim, rngs)
        else:
            self.q = dense(cfg, d, heads * mla.qk_head_dim, rngs)
        self.kv_a = dense(cfg, d, mla.latent_width, rngs)
        self.kv_a_norm = RMSNorm(cfg, rngs, dim=mla.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.kv_b = dense(cfg, mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                          rngs)
        self.o = dense(cfg, heads * mla.v_head_dim, d, rngs, scale=1.0 / cfg.num_layers)

    def weights(self) -> dict:
        """The layer's matrices and norm scales by the names the functions above take."""
        names = (("q_a", "q_b") if self.cfg.mla.q_lora_rank else ("q",)) + ("kv_a", "kv_b", "o")
        w = {name: getattr(self, name).kernel[...].astype(self.cfg.compute_dtype)
             for name in names}
        norms = ("q_a_norm", "kv_a_norm") if self.cfg.mla.q_lora_rank else ("kv_a_norm",)
        return w | {name: getattr(self, name).scale[...] for name in norms}

    def options(self, kind: str) -> dict:
        _, scaling = self.cfg.rope_for(kind)
        return dict(super().options(kind), scale=softmax_scale(self.cfg.mla, scaling))

    def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                 collect: bool = False, kind: str = FULL):
        """Attention's, but for training with the latent exchange (the run's attention says
        mla_exchange 'latent'): the devices pass each token's latent and RoPE key
        (parallel.latent_attention), not the keys and values the other paths expand here."""
        if cache is not None or collect or self.choice.mla_exchange != "latent":
            return super().__call__(x, positions, segment_ids, order, cache, collect, kind)
        b, s, _ = x.shape
        q, c, k_rope, w = self._latent(x, positions, kind)
        kwargs = self.choice.attention_kwargs()
        out = parallel.latent_attention(q, c, k_rope[:, :, 0], w["kv_b"], mesh=self.mesh,
                                        segment_ids=segment_ids, order=order,
                                        scale=self.options(kind)["scale"], **kwargs)
        return self.o(out.reshape(b, s, -1))

    def _latent(self, x, positions, kind: str):
        """(q [B, S, H, qk_head_dim], c [B, S, R], k_rope [B, S, 1, r], the weights), RoPE
        applied."""
        cfg, w = self.cfg, self.weights()
        theta, scaling = cfg.rope_for(kind)
        x = x.astype(cfg.compute_dtype)
        q_nope, q_rope = queries(w, x, cfg.mla, cfg.num_heads, cfg.compute_dtype)
        c, k_rope = latent(w, x, cfg.mla, cfg.compute_dtype)
        q_rope = rotate(q_rope, positions, theta, scaling, cfg.mla.rope_interleave)
        k_rope = rotate(k_rope, positions, theta, scaling, cfg.mla.rope_interleave)
        q = jnp.concatenate([q_nope, q_rope.astype(q_nope.dtype)], axis=-1)
        return q, c, k_rope.astype(c.dtype), w

    def project(self, x, positions, kind: str):
        """x [B, S, D] -> q, k [B, S, H, qk_head_dim], v [B, S, H, v_head_dim], RoPE applied,
        and no output gate (None)."""
        q, c, k_rope, w = self._latent(x, positions, kind)
        k, v = expand(w["kv_b"], c, k_rope, self.cfg.mla, self.cfg.num_heads)
        return q, k, v, None


class Latent(Mixer):
    """Softmax attention's layer types where model.mla gives a latent."""

    name = "latent"
    layer_types = (FULL, SLIDING)
    module = LatentAttention

    def serves(self, m) -> bool:
        return MLAConfig.from_config(getattr(m, "mla", None)).enabled

    def init_cache(self, cfg, batch: int, max_len: int) -> KVCache:
        """The expanded keys and values of every head: keys qk_head_dim wide, values
        v_head_dim."""
        mla, dtype = cfg.mla, cfg.compute_dtype
        return KVCache(jnp.zeros((batch, max_len, cfg.num_heads, mla.qk_head_dim), dtype),
                       jnp.zeros((batch, max_len, cfg.num_heads, mla.v_head_dim), dtype))

    def matrix_params(self, m) -> int:
        """q (or q_a, q_b), kv_a, kv_b, o."""
        mla, heads = MLAConfig.from_config(m.mla), m.num_heads
        qk = mla.qk_head_dim
        queries = (m.d_model * mla.q_lora_rank + mla.q_lora_rank * heads * qk if mla.q_lora_rank
                   else m.d_model * heads * qk)
        return (queries + m.d_model * mla.latent_width
                + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
                + heads * mla.v_head_dim * m.d_model)

    def vector_params(self, m) -> int:
        """The latents' norms."""
        mla = MLAConfig.from_config(m.mla)
        return mla.kv_lora_rank + mla.q_lora_rank

    def head_widths(self, m) -> tuple[int, int]:
        mla = MLAConfig.from_config(m.mla)
        return mla.qk_head_dim, mla.v_head_dim

    def kernel_heads(self, m) -> tuple[int, int]:
        """Every head its own keys and values, as wide as the wider of the two."""
        return m.num_heads, max(self.head_widths(m))

    def exchanged_width(self, m, mla_exchange: str) -> int:
        latent = mla_exchange == "latent"
        return MLAConfig.from_config(m.mla).latent_width if latent else 0


LATENT = Latent()
