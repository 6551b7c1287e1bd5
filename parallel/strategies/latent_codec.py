"""The latent block of parallel/latent.py as the strategies meet it: a `Codec`
(strategies/base.py) that expands a travelling latent block into the kernel's keys and values
and pulls their gradients back into the latent's."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from parallel.strategies import base

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class LatentShape:
    """A latent attention layer's head widths; `width` the one the kernel tiles (max(qk, v):
    the narrower side padded with zeros, as parallel.attention pads it)."""

    heads: int
    nope: int
    rope: int
    v: int

    @property
    def width(self) -> int:
        return max(self.nope + self.rope, self.v)


class LatentCodec(base.Codec):
    """A block (c [b, m, R], k_rope [b, m, r], segment ids, positions) expanded through kv_b
    [R, h (nope + v)] for the h heads this device computes."""

    def __init__(self, kv_b, shape: LatentShape, precision=None):
        self.kv_b, self.shape, self.precision = kv_b, shape, precision
        self.heads = kv_b.shape[1] // (shape.nope + shape.v)

    def _pad(self, x):
        return jnp.pad(x, [(0, 0)] * 3 + [(0, self.shape.width - x.shape[-1])])

    def expand(self, block):
        c, k_rope, seg, pos = block
        s = self.shape
        kv = jnp.dot(c, self.kv_b.astype(c.dtype), precision=self.precision)
        kv = kv.reshape(*c.shape[:2], self.heads, s.nope + s.v)
        k_rope = jnp.broadcast_to(k_rope[:, :, None].astype(kv.dtype),
                                  (*c.shape[:2], self.heads, s.rope))
        k = jnp.concatenate([kv[..., :s.nope], k_rope], axis=-1)
        return (base.to_heads(self._pad(k)), base.to_heads(self._pad(kv[..., s.nope:])),
                seg, pos)

    def pull(self, block, ddk, ddv):
        c, s = block[0], self.shape
        ddk, ddv = base.from_heads(ddk), base.from_heads(ddv)  # [b, m, h, width] float32
        d_kv = jnp.concatenate([ddk[..., :s.nope], ddv[..., :s.v]], axis=-1)
        d_kv = d_kv.reshape(*d_kv.shape[:2], -1)  # [b, m, h (nope + v)]
        dc = jnp.dot(d_kv, self.kv_b.astype(F32).T, precision=self.precision)
        d_rope = jnp.sum(ddk[..., s.nope:s.nope + s.rope], axis=2)
        d_kv_b = jnp.einsum("bmr,bmo->ro", c.astype(F32), d_kv, precision=self.precision)
        return (dc, d_rope), d_kv_b

    def zeros(self, block):
        return ((jnp.zeros(block[0].shape, F32), jnp.zeros(block[1].shape, F32)),
                jnp.zeros(self.kv_b.shape, F32))
