"""What a kernel is: the work on one (query block, key block) pair on one device.

A strategy (parallel/strategies) decides which key blocks meet a device's query block; a kernel
computes one such meeting. Arrays are head-major, the order the matmuls want (the strategy
transposes once per call, not per tile):

    q, do, out, dq   [b, H, n, d]     H = h * g query heads; query head i uses KV head i // g
    k, v, dk, dv     [b, h, m, d]     m = n, or fewer keys (a halo: strategies/halo.py)
    lse, delta       [b, H, n]        float32
    q_pos, k_pos     [b, n], [b, m]   original token indices of each block, increasing per row
    q_seg, k_seg     [b, n], [b, m]   segment (document) ids, or None

Contract:
- forward returns the block pair's own softmax result: out (float32, normalised over this key
  block only), lse (float32 log-sum-exp of the scaled scores), and the number of tiles it
  computed. A query row that sees nothing in this block gets out 0 and lse -inf. The strategy
  merges block results in float32.
- backward takes the GLOBAL lse and delta = rowsum(dO * O) of the GLOBAL output, so the
  probabilities it recomputes, exp(scale * s - lse), are final; it returns this block pair's
  float32 contributions to dq, dk and dv.
- Masks: key j is visible to query i iff tiles.mask (parallel/mask.py: causal, a window) lets
  (q_pos[i], k_pos[j]) through and, with segment ids, q_seg[i] == k_seg[j]. A block pair with
  no visible pair never reaches a kernel.
- Soft cap: with tiles.soft_cap the softmax runs on c tanh(scale s / c) (`logits`), and the
  backward multiplies dS by that function's slope (`probabilities`).
- Sinks never reach a kernel or a strategy: parallel/attention.py folds them into the merged
  result.

A new kernel is one file with a `Kernel` subclass and its `KERNEL` instance, and one entry in
`parallel/kernels/__init__.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from parallel.mask import as_mask
from parallel.strategy_cost import TileGrid


class Kernel:
    """One implementation of the block-pair work. Instances are stateless singletons."""

    name: str = ""
    platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")  # jax backends it runs on
    # Platforms where it is a compiled, fused kernel: 'auto' picks it there. On the other
    # platforms of `platforms` it runs interpreted (TileSpec.interpret), for tests.
    fused_on: tuple[str, ...] = ()
    # (tile_q, tile_k) upper bounds of the default tiles: the largest divisors of the block up to
    # these (parallel.spec.default_tile). Large tiles suit XLA and the TPU's big VMEM; a GPU
    # program keeps its tiles in registers and shared memory.
    max_tiles: tuple[int, int] = (512, 512)
    # How its grid pays a tile's fixed cost, for the planner (parallel/strategy_cost.py): the
    # default, once per live tile over every row and head (one loop step of einsums).
    grid: TileGrid = TileGrid()

    def interpreted_on(self, platform: str) -> bool:
        """True where a Pallas kernel runs in interpret mode: a platform it is not fused on."""
        return bool(self.fused_on) and platform not in self.fused_on

    def check_tiles(self, tile_q: int, tile_k: int, interpret: bool) -> None:
        """Raises a one-line ValueError for tiles this kernel cannot compile (none by default)."""

    def forward(self, q, k, v, q_pos, k_pos, q_seg, k_seg, tiles):
        """-> (out f32 [b,H,n,d], lse f32 [b,H,n], tiles computed: int32 scalar)."""
        raise NotImplementedError

    def backward(self, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles):
        """-> (dq f32 [b,H,n,d], dk f32 [b,h,n,d], dv f32 [b,h,n,d])."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"


class InterpretableKernel(Kernel):
    """A Pallas kernel: module functions forward(..., interpret=) and backward(...,
    interpret=), run compiled where the kernel is fused and interpreted elsewhere
    (TileSpec.interpret)."""

    def __init__(self, forward, backward):
        self._forward, self._backward = forward, backward

    def forward(self, q, k, v, q_pos, k_pos, q_seg, k_seg, tiles):
        return self._forward(q, k, v, q_pos, k_pos, q_seg, k_seg, tiles,
                             interpret=tiles.interpret)

    def backward(self, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles):
        return self._backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles,
                              interpret=tiles.interpret)


def varying(x, tiles):
    """Marks freshly created arrays as varying over the kernel's mesh axes: inside shard_map
    with check_vma, a loop carry must have one type on the way in and out."""
    def cast(a):
        missing = tuple(ax for ax in tiles.varying_axes if ax not in jax.typeof(a).mat.varying)
        return lax.pcast(a, missing, to="varying") if missing else a

    return jax.tree.map(cast, x)


# The rules every kernel computes the same way, on tiles of any leading shape [..., rows, keys].

def visible(q_pos, k_pos, q_seg, k_seg, causal):
    """The contract's mask from positions and segment ids [..., rows] and [..., keys] (leading
    axes, such as the KV slots of a group, broadcast): [..., rows, keys]; None when every pair
    is visible (bidirectional, no window, no documents). causal: a bool or a `Mask`."""
    return visible_pairs(q_pos[..., :, None], k_pos[..., None, :],
                         None if q_seg is None else q_seg[..., :, None],
                         None if k_seg is None else k_seg[..., None, :], causal)


def visible_pairs(q_pos, k_pos, q_seg, k_seg, causal):
    """The same rule on arrays already shaped to broadcast against each other: q_pos [rows, 1]
    with k_pos [1, keys] gives [rows, keys]; q_pos [1, rows] with k_pos [keys, 1] gives the
    transposed [keys, rows] (Pallas TPU kernels keep every value 2-D)."""
    mask = as_mask(causal).visible(q_pos, k_pos)
    if q_seg is not None:
        same = q_seg == k_seg
        mask = same if mask is None else mask & same
    return mask


def exponent_scale(tiles) -> float:
    """The scale the softmax applies inside its exponent (softmax_fold, softmax_result): the
    score scale, or 1 once a soft cap has spent it on the logits."""
    return tiles.scale if tiles.soft_cap is None else 1.0


def logits(s, tiles):
    """Raw scores q.k -> the logits the softmax folds with `exponent_scale`: s itself (the scale
    stays inside the exponent, exp(scale * (s - max))), or with cap c, c tanh(scale s / c)."""
    if tiles.soft_cap is None:
        return s
    return tiles.soft_cap * jnp.tanh(s * (tiles.scale / tiles.soft_cap))


def probabilities(s, lse, tiles):
    """The backward's final probabilities exp(logit - lse) from raw scores s [..., rows, keys]
    and the global lse [..., rows, 1] (broadcast), and the soft cap's slope d logit / d(scale s)
    = 1 - tanh^2 that dS is multiplied by (None without a cap)."""
    if tiles.soft_cap is None:
        return jnp.exp(s * tiles.scale - lse), None
    t = jnp.tanh(s * (tiles.scale / tiles.soft_cap))
    return jnp.exp(tiles.soft_cap * t - lse), 1.0 - t * t


def dscores(p, slope, dp_minus_delta):
    """dS with respect to the raw scores (before the score scale, which the kernels apply to
    dQ and dK at the end): p (dP - D), times the soft cap's slope when there is one."""
    ds = p * dp_minus_delta
    return ds if slope is None else ds * slope


def softmax_fold(m, l, s, masked, scale):
    """Folds raw scores s [..., rows, keys] (-inf where masked) into the running max m and sum
    l [..., rows]: -> (p, alpha, m, l), where the caller adds p @ v to its output scaled by
    alpha. m is a max of RAW scores, so exp(scale * (s - m)) is the numerator (scale > 0).
    With `masked`, a row with nothing visible yet keeps m = -inf and is shifted by 0: no NaN.
    m and l may also be columns [..., rows, 1] (then alpha is one too), as Pallas TPU wants."""
    column = m.ndim == s.ndim
    rows = (lambda x: x) if column else (lambda x: x[..., None])
    m_new = jnp.maximum(m, s.max(axis=-1, keepdims=column))
    m_ref = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked else m_new
    p = jnp.exp((s - rows(m_ref)) * scale)
    alpha = jnp.exp((m - m_ref) * scale)
    return p, alpha, m_new, alpha * l + p.sum(axis=-1, keepdims=column)


def softmax_result(o, m, l, scale):
    """The block's normalised output and float32 lse from the running state; a row that saw
    nothing in this block gets out 0 and lse -inf. m, l: [..., rows] or columns [..., rows, 1]."""
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    per_row = l_safe if l.ndim == o.ndim else l_safe[..., None]
    return o / per_row, jnp.where(seen, m * scale + jnp.log(l_safe), -jnp.inf)
