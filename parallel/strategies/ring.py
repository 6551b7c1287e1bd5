"""`ring`: key/value blocks travel around the 'seq' axis with `lax.ppermute`, N steps.

Each device keeps its query block; on step s device d holds the key/value block (KV heads only,
head-major, with its segment ids and original positions) that started on device
(d - s) mod N. The next hop is issued before the step's compute so that the transfer can overlap
it; the forward's last step sends nothing.

The backward is a second ring pass: dK and dV accumulate in float32 and follow their K and V
blocks one step behind (so that both transfers overlap the step's kernel), arriving home after
N hops; dQ stays local. Residuals are the local q, k, v, the output
and the float32 log-sum-exp: O(S / N) per device whatever N.

`ring_forward` and `ring_backward` are the two passes on head-major blocks over any ring of
devices (`Hops`); `usp` runs them over the Ulysses groups. Under a sliding window that leaves
most blocks unseen, a device receives only the keys its window reaches (strategies/halo.py).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel import strategy_cost
from parallel.layouts import get_layout
from parallel.mesh import SEQ
from parallel.strategies import base, halo
from parallel.strategies.latent_codec import LatentCodec
from parallel.kernels.base import varying


@dataclasses.dataclass(frozen=True)
class Hops:
    """A ring over the 'seq' axis: `steps` devices, each sending to `pairs`' destination.
    Every 'seq' index is in one ring; `stride` apart: device i sends to i + stride (mod N)."""

    steps: int
    stride: int = 1

    @property
    def pairs(self):
        n = self.steps * self.stride
        return [(i, (i + self.stride) % n) for i in range(n)]

    def send(self, tree):
        """Moves every array in `tree` one hop along the ring: arrays of one shape and dtype
        (K and V; positions and segment ids; dK and dV) stacked into one transfer, as the TPU
        compiler keeps only a few transfers in flight across a kernel call."""
        return self.send_before(tree, None)[0]

    def send_before(self, tree, inputs):
        """(tree one hop on, inputs): the transfer's operands are built before anything that
        reads `inputs` (the step's kernel) may run, so that the compiler can start the hop
        first and hide it behind the kernel; its schedule otherwise may build and send them
        after the kernel, exposing the hop (seen in XLA:TPU's schedule of the forward)."""
        if self.steps == 1:
            return tree, inputs
        leaves, treedef = jax.tree.flatten(tree)
        groups = {}
        for i, x in enumerate(leaves):
            groups.setdefault((x.shape, x.dtype), []).append(i)
        stacks = [jnp.stack([leaves[i] for i in members]) for members in groups.values()]
        stacks, inputs = lax.optimization_barrier((stacks, inputs))
        moved = [None] * len(leaves)
        for members, stack in zip(groups.values(), stacks):
            both = lax.ppermute(stack, SEQ, self.pairs)
            for j, i in enumerate(members):
                moved[i] = both[j]
        return jax.tree.unflatten(treedef, moved), inputs


def ring_forward(spec, hops, qh, q_pos, q_seg, block, sinks=None, codec=base.PLAIN):
    """The query block (head-major) against every block of the ring, starting with `block`
    (this device's key_block, or what `codec` expands to one) and from `sinks` of qh's heads
    (base.empty_result): (out f32, lse f32 [b, H, n], tiles int32 [hops.steps])."""
    step = functools.partial(base.forward_step, spec, qh, q_pos, q_seg, codec=codec)

    def body(s, carry):
        block, acc, counts = carry
        arriving, block = hops.send_before(block, block)  # issued first: overlaps this step
        acc, count = step(block, acc)
        return arriving, acc, counts.at[s].set(count)

    counts = varying(jnp.zeros((hops.steps,), jnp.int32), spec.tiles)
    acc = base.empty_result(qh, spec.tiles, sinks)
    if hops.steps > 1:  # (one step: no loop to compile)
        block, acc, counts = lax.fori_loop(0, base.trip_count(hops.steps - 1), body,
                                           (block, acc, counts))
    (out, lse), count = step(block, acc)  # the last step: nothing left to send
    return out, lse, counts.at[hops.steps - 1].set(count)


def ring_backward(spec, hops, qh, doh, lse, delta, q_pos, q_seg, block, codec=base.PLAIN):
    """The second pass: (dq float32 head-major, the gradients of this device's block as
    `codec` pulls them back (dK, dV float32 head-major for a plain block), what the codec
    keeps on this device summed over every block met (nothing for a plain block)).

    dK and dV run one step behind their K and V so that both transfers overlap a kernel: step
    s sends the K/V block on, and the dK/dV sums of the block this device held at step s - 1
    (every earlier device's share plus its own) to the device that holds that block now, which
    adds its share at the end of step s. A last hop after the loop brings each block's sums
    home: N hops, as many as if they travelled with K and V, N - 1 of them hidden."""
    add = functools.partial(jax.tree.map, jnp.add)

    def body(s, carry):
        block, dq, pending, kept = carry
        # Both issued first: they overlap the kernel.
        (arriving, partial), block = hops.send_before((block, pending), block)
        k_s, v_s, seg_s, k_pos = codec.expand(block)
        ddq, ddk, ddv = base.pair_backward(spec, qh, k_s, v_s, doh, lse, delta, q_pos, k_pos,
                                           q_seg, seg_s)
        travels, stays = codec.pull(block, ddk, ddv)
        return arriving, dq + ddq, add(partial, travels), add(kept, stays)

    dq = varying(jnp.zeros(qh.shape, jnp.float32), spec.tiles)
    pending, kept = varying(codec.zeros(block), spec.tiles)
    # `steps` identical steps: step 0 sends zeros as its 'pending' sums and the last step sends
    # K/V nobody reads, so the backward kernel is traced and compiled once, not twice.
    _, dq, pending, kept = lax.fori_loop(0, base.trip_count(hops.steps), body,
                                         (block, dq, pending, kept))
    return dq, hops.send(pending), kept  # the sums of the block that started here, home


def _halo_plan(spec, block):
    """The halo exchange that replaces the full ring under a window (strategies/halo.py), or
    None."""
    return halo.plan(spec.layout, spec.num_shards, block, spec.tiles.mask, spec.tiles.tile_k)


def _halo_cost(shape, net, steps, shifts, kv_per_token, dkv_per_token):
    """The ring's cost terms under a halo plan: step 0 (the own block) overlaps every halo's
    transfer, the halos' steps follow; backward likewise, then the halos' dK/dV go home."""
    tokens = max(halo.received_tokens(shifts, shape.num_shards, shape.block))
    kv, dkv = tokens * kv_per_token, tokens * dkv_per_token
    later = sum(float(steps[s.distance]) for s in shifts)
    forward = net.hop(float(steps[0]), kv) + later
    backward = net.hop(2 * float(steps[0]), kv) + 2 * later + net.collective(dkv)
    return {"forward_s": forward, "backward_s": backward, "bytes_sent": 2 * kv + dkv,
            "buffer_bytes": 2 * (kv + dkv), "compute_s": float(steps.sum())}


class Ring(base.Strategy):
    name = "ring"

    def kv_tokens_received(self, layout, num_shards, block, mask, tile_k, kv_heads):
        """N - 1 blocks, or under a window the halo (strategies/halo.py)."""
        shifts = halo.plan(layout, num_shards, block, mask, tile_k)
        return halo.received_tokens(shifts, num_shards, block).astype(np.float64)

    def forward(self, spec, q, k, v, seg, order, sinks=None):
        qh = base.to_heads(q)
        q_pos = base.positions(spec, order, *q.shape[:2])
        block = base.key_block(k, v, seg, q_pos)
        shifts = _halo_plan(spec, q.shape[1])
        if shifts is None:
            out, lse, counts = ring_forward(spec, Hops(spec.num_shards), qh, q_pos, seg, block,
                                            sinks)
        else:
            out, lse, counts = halo.halo_forward(spec, shifts, qh, q_pos, seg, block, sinks)
        return base.from_heads(out).astype(q.dtype), lse, counts

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        q_pos = base.positions(spec, order, *q.shape[:2])
        args = (base.to_heads(q), base.to_heads(dout), lse, base.delta_rows(out, dout), q_pos,
                seg, base.key_block(k, v, seg, q_pos))
        shifts = _halo_plan(spec, q.shape[1])
        if shifts is None:
            dq, (dk, dv), _ = ring_backward(spec, Hops(spec.num_shards), *args)
        else:
            dq, dk, dv = halo.halo_backward(spec, shifts, *args)
        return (base.from_heads(dq).astype(q.dtype), base.from_heads(dk).astype(k.dtype),
                base.from_heads(dv).astype(v.dtype))

    passes_latents = True

    def latent_forward(self, spec, shape, q, c, k_rope, kv_b, seg, order):
        q_pos = base.positions(spec, order, *q.shape[:2])
        codec = LatentCodec(kv_b, shape, spec.tiles.precision)
        out, lse, _ = ring_forward(spec, Hops(spec.num_shards), base.to_heads(q), q_pos, seg,
                                   (c, k_rope, seg, q_pos), codec=codec)
        return base.from_heads(out).astype(q.dtype), lse

    def latent_backward(self, spec, shape, q, c, k_rope, kv_b, seg, order, out, lse, dout):
        q_pos = base.positions(spec, order, *q.shape[:2])
        codec = LatentCodec(kv_b, shape, spec.tiles.precision)
        dq, (dc, d_rope), d_kv_b = ring_backward(
            spec, Hops(spec.num_shards), base.to_heads(q), base.to_heads(dout), lse,
            base.delta_rows(out, dout), q_pos, seg, (c, k_rope, seg, q_pos), codec)
        return base.from_heads(dq).astype(q.dtype), dc, d_rope, d_kv_b

    def cost(self, shape, net, degree, documents=None, step_counts=None):
        """Devices wait at every hop: step s costs the busiest device's tiles on it. Under a
        window with a halo plan, the halos travel at once while the own block computes, then
        their tiles follow; dK and dV of the halos go back after the backward's."""
        _, kv, dkv = strategy_cost.block_bytes(shape, shape.kv_heads)
        counts = strategy_cost.step_counts(shape, documents, given=step_counts)
        steps = strategy_cost.step_seconds(shape, net, counts, shape.pair_tiles)
        steps = steps.max(axis=1).mean(axis=0)
        shifts = halo.plan(get_layout(shape.layout), shape.num_shards, shape.block, shape.mask,
                           shape.tiles[1])
        if shifts is not None:
            return _halo_cost(shape, net, steps, shifts, kv / shape.block, dkv / shape.block)
        forward, backward = strategy_cost.ring_seconds(steps.tolist(), kv, dkv, net)
        n = shape.num_shards
        return {"forward_s": forward, "backward_s": backward,
                "bytes_sent": (n - 1) * kv + n * (kv + dkv), "buffer_bytes": 2 * (kv + dkv),
                "compute_s": float(steps.sum())}


STRATEGY = Ring()
