"""Mamba2 layers: the blocks of model.layer_types 'mamba' (Granite 4.0's hybrids), token mixing
by the SSD rule (model/rules/ssd.py) instead of softmax.

    x [B, S, D] -> in_proj: z [I], x | B | C [I + 2 G N], dt [H]          (I = H P)
      x | B | C -> causal depthwise conv (conv_kernel taps, + bias, silu)
      dt = softplus(dt + dt_bias), per head, float32; A = -exp(a_log)
      o = SSD: S <- exp(dt A) S + B (dt x)^T; o = S^T C; + D x               [B, S, H, P]
      out = (groupnorm(o silu(z)) norm) W_out, the norm over G groups of I / G   [B, S, D]

Each group of H / G heads shares its B and C. Over the 'seq' devices the layer is split as a
Gated DeltaNet layer is (parallel/recurrent/: parallel.linear_strategy 'state' passes
states, 'heads' splits the groups); documents reset the state and the convolution. Decoding:
the cache is a LinearCache (model/mixers/cache.py) (the state [B, H, N, P] and the convolution's last inputs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

import parallel
from model.mixers import recurrent
from model.config import MambaConfig, ModelConfig
from model.layers import dense
from model.mixers.base import Mixer
from model.mixers.cache import LinearCache
from model.rules.short_conv import causal_conv
from model.rules.ssd import ssd_rule
from parallel.choice import UNPLANNED, AttentionChoice
from parallel.recurrent import Recurrence, RecurrentShape

UNIT = "Mamba2 layers' groups"  # what the 'heads' strategy splits, for its errors

F32 = jnp.float32
MAMBA = "mamba"  # its layer type


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:
    """One layer's parameters as arrays (ours are [in, out]): in_proj [D, I + C + H] (z, then
    x | B | C, then dt), conv [K, C], conv_bias [C] or None, dt_bias, a_log, d [H], norm [I],
    out [I, D]."""

    in_proj: jax.Array
    conv: jax.Array
    conv_bias: jax.Array | None
    dt_bias: jax.Array
    a_log: jax.Array
    d: jax.Array
    norm: jax.Array
    out: jax.Array


class Mamba2(nnx.Module):
    """A Mamba2 layer with Block's attention interface: (x, positions, segment_ids, order,
    cache=, collect=, kind=) -> out [B, S, D] (positions unused)."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice):
        self.cfg, self.mesh, self.choice = cfg, mesh, choice
        mc = cfg.mamba
        self.in_proj = dense(cfg, cfg.d_model, mc.inner + mc.conv_channels + mc.num_heads, rngs)
        bound = mc.conv_kernel ** -0.5  # a depthwise conv's fan-in is its kernel
        self.conv = nnx.Param(jax.random.uniform(rngs.params(), (mc.conv_kernel, mc.conv_channels),
                                                 cfg.weights_dtype, -bound, bound),
                              out_sharding=(None, None))
        if mc.conv_bias:
            self.conv_bias = nnx.Param(jnp.zeros((mc.conv_channels,), cfg.weights_dtype),
                                       out_sharding=(None,))
        # Mamba's ranges: steps softplus(dt_bias) from 0.001 to 0.1, decay rates 1 to 16;
        # float32 and no weight decay (training/optim.py), as D and the norm's scale
        dt = jnp.exp(jax.random.uniform(rngs.params(), (mc.num_heads,), F32, jnp.log(1e-3),
                                        jnp.log(0.1)))
        self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)), out_sharding=(None,))
        self.a_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (mc.num_heads,), F32,
                                                          1.0, 16.0)), out_sharding=(None,))
        self.d = nnx.Param(jnp.ones((mc.num_heads,), F32), out_sharding=(None,))
        self.norm = nnx.Param(jnp.ones((mc.inner,), F32), out_sharding=(None,))
        self.out = dense(cfg, mc.inner, cfg.d_model, rngs, scale=1.0 / cfg.num_layers)

    def weights(self) -> Weights:
        bias = self.conv_bias[...] if hasattr(self, "conv_bias") else None
        return Weights(self.in_proj.kernel[...], self.conv[...], bias, self.dt_bias[...],
                       self.a_log[...], self.d[...], self.norm[...], self.out.kernel[...])

    def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                 collect: bool = False, kind: str = MAMBA):
        """As GatedDeltaNet.__call__ (model/mixers/gated_deltanet.py)."""
        del positions, kind
        if cache is not None:
            return layer(self.weights(), x, self.cfg, cache=cache)
        return layer(self.weights(), x, self.cfg, self.choice, segment_ids=segment_ids,
                     order=order, mesh=self.mesh, collect=collect)


def layer(w: Weights, x, cfg: ModelConfig, choice: AttentionChoice = UNPLANNED,
          segment_ids=None, order=None, mesh=None, cache=None, collect: bool = False):
    """The layer as a function of its weights: x [B, S, D] -> [B, S, D] in the compute dtype
    (with `cache`: (out, new cache); with `collect`: (out, the cache after each row's prompt,
    segment 0)), split over the mesh's 'seq' devices in the choice's layout's order (order: the
    batch's original indices, required by 'balanced'); with cfg.linear_chunk, training a piece of
    each device's tokens at a time (model/mixers/recurrent.py says which way a call runs)."""
    bias = None if w.conv_bias is None else w.conv_bias.astype(F32)
    return recurrent.run(w, x, recurrence(cfg, w.d), w.conv.astype(F32), bias, cfg, choice,
                         segment_ids, order, mesh, cache, collect)


def recurrence(cfg: ModelConfig, d) -> Recurrence:
    """The layer as parallel/recurrent/'s strategies see it: x | B | C channels by group,
    the SSD rule, q = C and k = B repeated over each group's heads, v = x, and D x beside the
    rule, the projections in and out. d [H]: the skip's weights (the strategy 'heads' takes its
    own heads' inside its shard_map, by the device's index)."""
    mc, dtype = cfg.mamba, cfg.compute_dtype
    per_group = mc.num_heads // mc.num_groups

    def project(w: Weights, x):  # -> mixed [b, n, C], g, beta [b, n, H], z [b, n, I]
        proj = jnp.dot(x.astype(dtype), w.in_proj.astype(dtype))
        z = proj[..., :mc.inner]
        mixed = proj[..., mc.inner:mc.inner + mc.conv_channels].astype(F32)
        dt = jax.nn.softplus(proj[..., mc.inner + mc.conv_channels:].astype(F32)
                             + w.dt_bias.astype(F32))  # [b, n, H]
        return mixed, -jnp.exp(w.a_log.astype(F32)) * dt, dt, z

    def finish(w: Weights, o, z):  # o [b, n, H, P] -> [b, n, D]
        b, s = o.shape[:2]
        y = o.reshape(b, s, mc.inner).astype(F32) * jax.nn.silu(z.astype(F32))
        y = y.reshape(b, s, mc.num_groups, -1)  # the norm over each group's I / G channels
        y = y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + cfg.norm_eps)
        y = y.reshape(b, s, mc.inner) * w.norm.astype(F32)
        return jnp.dot(y.astype(dtype), w.out.astype(dtype))

    def heads_of(mixed, groups: int):
        b, s, _ = mixed.shape
        width, n, p = groups * per_group * mc.head_dim, mc.state_size, mc.head_dim
        x = mixed[..., :width].reshape(b, s, groups * per_group, p)
        k = jnp.repeat(mixed[..., width:width + groups * n].reshape(b, s, groups, n),
                       per_group, axis=2)
        q = jnp.repeat(mixed[..., width + groups * n:].reshape(b, s, groups, n), per_group,
                       axis=2)
        mine = d.astype(F32)
        if groups != mc.num_groups:  # inside by_heads' shard_map: this device's heads
            mine = lax.dynamic_slice_in_dim(mine, lax.axis_index(parallel.SEQ) * groups
                                            * per_group, groups * per_group)
        return q, k, x, mine[:, None] * x

    return Recurrence(widths=(per_group * mc.head_dim, mc.state_size, mc.state_size),
                      groups=mc.num_groups, heads=mc.num_heads, chunk=mc.chunk_size,
                      rule=ssd_rule, heads_of=heads_of, unit=UNIT,
                      conv=causal_conv, project=project, finish=finish)


class Mamba2Kind(Mixer):
    name = "mamba2"
    layer_types = (MAMBA,)
    module = Mamba2

    def check(self, m) -> None:
        if not MambaConfig.from_config(m.mamba).enabled:
            raise ValueError("model.layer_types has 'mamba' layers but model.mamba.num_heads is "
                             "0: give the Mamba2 layers' heads (model.mamba)")

    def init_cache(self, cfg, batch: int, max_len: int) -> LinearCache:
        """Its state [H, N, P] and the convolution's last inputs: no length in it."""
        mc = cfg.mamba
        return LinearCache(jnp.zeros((batch, mc.num_heads, mc.state_size, mc.head_dim), F32),
                           jnp.zeros((batch, mc.conv_kernel - 1, mc.conv_channels), F32))

    def matrix_params(self, m) -> int:
        """in_proj d (I + I + 2 G N + H), out_proj I d (I = H P)."""
        mc = MambaConfig.from_config(m.mamba)
        return m.d_model * (mc.inner + mc.conv_channels + mc.num_heads) + mc.inner * m.d_model

    def vector_params(self, m) -> int:
        """The convolution (and its bias), a_log, dt_bias, D, the norm."""
        mc = MambaConfig.from_config(m.mamba)
        return (mc.conv_kernel + mc.conv_bias) * mc.conv_channels + 3 * mc.num_heads + mc.inner

    def recurrent(self, m) -> RecurrentShape:
        mc = MambaConfig.from_config(m.mamba)
        return RecurrentShape(mc.num_heads, mc.state_size, mc.head_dim, mc.conv_channels,
                              mc.conv_kernel, mc.num_groups, mc.chunk_size, solves=False,
                              unit=UNIT)


MAMBA2 = Mamba2Kind()
