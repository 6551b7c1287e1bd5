"""What a strategy is: how key/value blocks meet a device's query block across the 'seq' shards.

A strategy runs inside `jax.shard_map` on one device's shard, in the order the public API uses
([b, n, heads, d], seq-major, n = S / N):

    forward(spec, q, k, v, seg, order, sinks)           -> out [b,n,H,d] (q.dtype),
                                                           lse f32 [b,H,n], tiles int32 [N]
                                                           (tiles computed per step)
    backward(spec, q, k, v, seg, order, out, lse, dout) -> dq, dk, dv in the input dtypes

seg and order are [b, n] or None; `positions` turns order (or, without it, the layout's formula)
into the original index of every local token. The strategy calls the kernel on block pairs
through `pair_forward` / `pair_backward`, which skip a pair with nothing visible, and merges
results with `merge`. A new strategy is one file with a
`Strategy` subclass (its forward, backward and cost) and its `STRATEGY` instance, and one entry in
`parallel/strategies/__init__.py`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel.kernels.base import varying
from parallel.mesh import SEQ

F32 = jnp.float32


def trip_count(steps: int):
    """A strategy loop's trip count as a traced value, for lax.fori_loop: the loop is then a
    while loop rather than a scan. With a constant count, the TPU compile of a rematerialised
    step held the all-gather forward's float32 output once per key block (a stacked
    [N - 1, b, H, n, d] buffer: 3.75 GiB a chip for llama2-7b at 262,144 tokens on 16 chips,
    BENCHMARKS.md); as a while loop it holds one. The optimization barrier keeps XLA from
    folding the count back in: with a count of 1 (N = 2) it would inline the loop and lay out
    buffers differently from every other N."""
    return lax.optimization_barrier(jnp.int32(steps))


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One way of moving keys and values to queries. The registry holds one instance of each;
    `configured` returns it as it runs on a mesh, its own options set (a frozen value: equal
    configurations hash alike, so a jitted call compiles once)."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()  # the keyword options `configured` takes
    degree: int = 1  # devices per head all-to-all group: 1 for a strategy without one

    def configured(self, num_shards: int, q_heads: int, **options) -> "Strategy":
        """This strategy on `num_shards` 'seq' devices with `q_heads` query heads and its
        options (None: not given; parallel.strategies.configured has refused any it does not
        take). A strategy with options overrides this to check and set them."""
        return self

    def label(self, degree: int, num_shards: int | None = None) -> str:
        """How tables, calibration files and run names show it at `degree` on `num_shards`
        'seq' devices: its name ('ring', 'allgather'); a strategy with a degree of its own
        adds it ('ulysses 64', 'usp 4x16'; without num_shards 'ulysses', 'usp 4')."""
        return self.name

    def degree_in(self, rest: str) -> int:
        """The degree a label's text after the name stands for (label's inverse)."""
        if rest:
            raise ValueError(f"strategy {self.name!r} has no degree: write {self.name!r}, "
                             f"not {self.name + ' ' + rest!r}")
        return 1

    def option_values(self, degree: int) -> dict:
        """Its options at `degree`, as parallel.attention and parallel.choose take them (and
        as parallel.* config fields): {} for a strategy without options."""
        return {}

    def degrees(self, num_shards, q_heads) -> list[int]:
        """The Ulysses degrees this strategy runs with on this mesh and head count (what the
        planner prices): [1] unless the strategy overrides it."""
        return [1]

    def cost(self, shape, net, degree, documents=None, step_counts=None) -> dict:
        """One attention layer on one device (parallel/strategy_cost.py: LayerShape, Network
        and the helpers): {'forward_s', 'backward_s', 'bytes_sent', 'buffer_bytes',
        'compute_s'}. Every strategy prices itself here, so that the planner and
        strategy='auto' know it from its registry line alone."""
        raise NotImplementedError(f"strategy {self.name!r} has no cost model")

    def kv_tokens_received(self, layout, num_shards: int, block: int, mask, tile_k: int,
                           kv_heads: int):
        """float64 [N]: the key/value tokens each of the N 'seq' devices receives in one forward
        of `layout` (a Layout) under `mask` (parallel.mask.Mask), counted in tokens of every KV
        head (a strategy that shards heads receives a share of each token's heads: a fraction
        of a token). What attention_with_stats reports and the cost model prices. Default:
        every other device's block."""
        return np.full(num_shards, (num_shards - 1) * block, np.float64)

    def forward(self, spec, q, k, v, seg, order, sinks=None):
        """sinks: None, or float32 [H] for every query head (replicated): the merge starts from
        them (`empty_result`)."""
        raise NotImplementedError

    # Latent attention (parallel/latent.py): the same passes over a latent block
    # (strategies/latent_codec.py), for a strategy that sets passes_latents:
    #   latent_forward(spec, shape, q, c, k_rope, kv_b, seg, order) -> out, lse
    #   latent_backward(spec, shape, q, c, k_rope, kv_b, seg, order, out, lse, dout)
    #       -> dq, dc, d_rope (float32), this device's share of d kv_b (float32)
    passes_latents: ClassVar[bool] = False

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Strategy({self.name!r}" + (f", degree={self.degree})" if self.degree > 1 else ")")


def to_heads(x):
    """[b, n, heads, d] -> head-major [b, heads, n, d], the kernels' order (once per call)."""
    return None if x is None else jnp.swapaxes(x, 1, 2)


def from_heads(x):
    """[b, heads, n, d] -> [b, n, heads, d]."""
    return jnp.swapaxes(x, 1, 2)


def positions(spec, order, batch, n):
    """int32 [b, n]: the original index of every token of this device's block. `order` (the
    caller's, per row) when given, else the layout's formula for this shard, the same in every
    row."""
    if order is not None:
        return order.astype(jnp.int32)
    pos = spec.layout.positions(lax.axis_index(SEQ), n, spec.num_shards, xp=jnp)
    return varying(jnp.broadcast_to(pos, (batch, n)), spec.tiles)


def pair_may_meet(q_pos, k_pos, q_seg, k_seg, mask):
    """False when no (query, key) pair of the two blocks can be visible: no batch row where the
    mask (a `Mask`: causal, window) lets some pair of the blocks' position ranges through and
    the segment-id ranges overlap. Positions [b, n], increasing along each row."""
    meet = jnp.broadcast_to(mask.may_meet(q_pos[:, 0], q_pos[:, -1], k_pos[:, 0], k_pos[:, -1]),
                            q_pos.shape[:1])
    if q_seg is not None:
        meet = meet & ((q_seg.min(axis=1) <= k_seg.max(axis=1))
                       & (k_seg.min(axis=1) <= q_seg.max(axis=1)))
    return meet.any()


def pair_forward(spec, q, k, v, q_pos, k_pos, q_seg, k_seg):
    """The kernel's forward on one block pair (head-major), or nothing if it is empty:
    (out f32 [b,H,n,d], lse f32 [b,H,n], tiles int32)."""
    tiles = spec.tiles

    def empty():
        return varying((jnp.zeros(q.shape, F32), jnp.full(q.shape[:3], -jnp.inf, F32),
                        jnp.zeros((), jnp.int32)), tiles)

    def run():
        return spec.kernel.forward(q, k, v, q_pos, k_pos, q_seg, k_seg, tiles)

    return lax.cond(pair_may_meet(q_pos, k_pos, q_seg, k_seg, tiles.mask), run, empty)


def key_block(k, v, seg, pos):
    """What travels to the queries: K and V head-major, segment ids and original positions."""
    return to_heads(k), to_heads(v), seg, pos


class Codec:
    """How a travelling key block becomes the kernel's keys and values, and how their gradients
    become the block's. This one: the block is (K, V, segment ids, positions) itself, and its
    gradients dK, dV. parallel/latent.py's passes a latent instead and expands it on arrival."""

    def expand(self, block):
        """block -> (K, V head-major, segment ids, positions) for the kernel."""
        return block

    def pull(self, block, ddk, ddv):
        """The kernel's dK, dV (float32, head-major) of one block -> (what travels home with
        the block's sums, what stays on this device: summed there over every block met)."""
        return (ddk, ddv), ()

    def zeros(self, block):
        """pull's two parts as float32 zeros (a backward loop's starting sums)."""
        return (jnp.zeros(block[0].shape, F32), jnp.zeros(block[1].shape, F32)), ()


PLAIN = Codec()


def forward_step(spec, qh, q_pos, q_seg, block, acc, codec: Codec = PLAIN):
    """The query block against one key block, merged into acc: (acc, tiles computed)."""
    k_s, v_s, seg_s, k_pos = codec.expand(block)
    out, lse, count = pair_forward(spec, qh, k_s, v_s, q_pos, k_pos, q_seg, seg_s)
    return merge(acc, out, lse), count


def pair_backward(spec, q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg):
    """The kernel's backward on one block pair, or zeros if it is empty: dq, dk, dv f32."""
    tiles = spec.tiles

    def empty():
        return varying((jnp.zeros(q.shape, F32), jnp.zeros(k.shape, F32),
                        jnp.zeros(v.shape, F32)), tiles)

    def run():
        return spec.kernel.backward(q, k, v, do, lse, delta, q_pos, k_pos, q_seg, k_seg, tiles)

    return lax.cond(pair_may_meet(q_pos, k_pos, q_seg, k_seg, tiles.mask), run, empty)


def empty_result(q, tiles, sinks=None):
    """The merge's starting point, head-major: out 0 and lse -inf (nothing seen), or with
    sinks [H] (this device's query heads) lse = the head's sink: a sink is a key of its own
    with logit sinks[h] and no value, so the merge that starts from it adds exp(sinks[h]) to
    every row's softmax denominator, whichever blocks follow."""
    lse = (jnp.full(q.shape[:3], -jnp.inf, F32) if sinks is None else
           jnp.broadcast_to(sinks.astype(F32)[None, :, None], q.shape[:3]))
    return varying((jnp.zeros(q.shape, F32), lse), tiles)


def merge(acc, out_b, lse_b):
    """Combines two softmax results over disjoint key sets, in float32.

    lse = log(e^lse_a + e^lse_b); out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse). Rows
    with lse = -inf on both sides stay (0, -inf) instead of producing NaN from -inf - -inf.
    """
    out_a, lse_a = acc
    lse = jnp.logaddexp(lse_a, lse_b)
    ref = jnp.where(lse == -jnp.inf, 0.0, lse)
    out = (out_a * jnp.exp(lse_a - ref)[..., None] + out_b * jnp.exp(lse_b - ref)[..., None])
    return out, lse


def delta_rows(out, dout):
    """D = rowsum(dO * O) of the global output, float32, head-major [b, H, n]."""
    return jnp.einsum("bnhd,bnhd->bhn", dout.astype(F32), out.astype(F32))
