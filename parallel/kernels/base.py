"""What a kernel is: the work on one (query block, key block) pair on one device.

A strategy (parallel/strategies) decides which key blocks meet a device's query block; a kernel
computes one such meeting. Arrays are head-major, the order the matmuls want (the strategy
transposes once per call, not per tile):

    q, do, out, dq   [b, H, n, d]     H = h * g query heads; query head i uses KV head i // g
    k, v, dk, dv     [b, h, n, d]
    lse, delta       [b, H, n]        float32
    q_pos, k_pos     [n]              original token indices of each block, increasing
    q_seg, k_seg     [b, n] or None   segment (document) ids

Contract:
- forward returns the block pair's own softmax result: out (float32, normalised over this key
  block only), lse (float32 log-sum-exp of the scaled scores), and the number of tiles it
  computed. A query row that sees nothing in this block gets out 0 and lse -inf. The strategy
  merges block results in float32.
- backward takes the GLOBAL lse and delta = rowsum(dO * O) of the GLOBAL output, so the
  probabilities it recomputes, exp(scale * s - lse), are final; it returns this block pair's
  float32 contributions to dq, dk and dv.
- Masks: key j is visible to query i iff (not causal or k_pos[j] <= q_pos[i]) and, with
  segment ids, q_seg[i] == k_seg[j]. A block pair with no visible pair never reaches a kernel.

A new kernel is one file with a `Kernel` subclass and its `KERNEL` instance, and one entry in
`parallel/kernels/__init__.py`.
"""

from __future__ import annotations

import jax
from jax import lax


class Kernel:
    """One implementation of the block-pair work. Instances are stateless singletons."""

    name: str = ""
    platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")  # jax backends it runs on
    # Platforms where it is a compiled, fused kernel: 'auto' picks it there. On the other
    # platforms of `platforms` it runs interpreted (TileSpec.interpret), for tests.
    fused_on: tuple[str, ...] = ()

    def forward(self, q, k, v, q_pos, k_pos, q_seg, k_seg, tiles):
        """-> (out f32 [b,H,n,d], lse f32 [b,H,n], tiles computed: int32 scalar)."""
        raise NotImplementedError

    def backward(self, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles):
        """-> (dq f32 [b,H,n,d], dk f32 [b,h,n,d], dv f32 [b,h,n,d])."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"


def varying(x, tiles):
    """Marks freshly created arrays as varying over the kernel's mesh axes: inside shard_map
    with check_vma, a loop carry must have one type on the way in and out."""
    def cast(a):
        missing = tuple(ax for ax in tiles.varying_axes if ax not in jax.typeof(a).mat.varying)
        return lax.pcast(a, missing, to="varying") if missing else a

    return jax.tree.map(cast, x)
