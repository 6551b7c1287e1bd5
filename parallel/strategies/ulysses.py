"""`ulysses`: all-to-all from sequence shards to head shards, attention over the whole sequence
for a share of the heads, all-to-all back.

On a group of u consecutive 'seq' devices (u = N for `ulysses`; `usp` chooses u and runs a ring
over the N / u groups), one device's forward:

    q [b, n, H, d], k/v [b, n, h, d]   sequence-sharded: n = S / N tokens, every head
      | all_to_all over the group: split heads, concatenate the group's blocks
    q [b, H/u, u n, d], k/v [b, h/u, u n, d]   head-sharded: the group's u n tokens
      | sort the tokens by original index (skipped where the layout's blocks already are)
      | ring_forward over the N / u groups (for `ulysses`, one step: one dense block pair,
      |   with the kernel's causal and document tile skipping)
      | unsort, all_to_all back: split the sequence, concatenate heads
    out [b, n, H, d], lse [b, H, n]

Why sort: the kernels' tile skipping needs original indices increasing along a block, and the
concatenation of u blocks of striped or zigzag is not. Sorted, a striped or zigzag group of u
devices is one block of the same layout over N / u devices, so usp keeps its balance.

GQA: query head i uses KV head i // g, and the all-to-all gives a device H/u consecutive query
heads, so it needs their KV heads, h/u of them. When u does not divide h, every KV head is
repeated u / gcd(h, u) times first (as many copies as needed, no more); the backward sums the
copies' dK and dV. Query heads must be divisible by u.

Backward: q, k, v, dO, and (lse, D = rowsum(dO O)) go through the same all-to-all and sort;
ring_backward; dQ, dK, dV come back. Residuals are the local q, k, v, out and lse: O(S / N).
Tile counts per step (`attention_with_stats`) count tiles of H/u heads; steps past N / u are 0.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel import cost, strategy_cost
from parallel.mesh import SEQ
from parallel.strategies import base
from parallel.strategies.latent_codec import LatentCodec
from parallel.strategies.ring import Hops, ring_backward, ring_forward


def check_heads(degree, q_heads, num_shards):
    """ValueError unless the q_heads query heads split evenly over `degree` devices."""
    if q_heads % degree:
        fits = [u for u in range(1, num_shards + 1) if num_shards % u == 0 and q_heads % u == 0]
        raise ValueError(
            f"query heads ({q_heads}) are not divisible by the Ulysses degree {degree}: choose "
            f"strategy='usp' with ulysses_degree in {fits}, or 'ring' / 'allgather'")


class _Group:
    """This device's Ulysses group: u consecutive 'seq' shards. Moves head-major arrays between
    sequence sharding and head sharding, the group's tokens sorted by original index."""

    def __init__(self, spec, degree, pos, seg, sort):
        n_shards = spec.num_shards
        self.degree = degree
        self.groups = None if degree == n_shards else [
            list(range(g * degree, (g + 1) * degree)) for g in range(n_shards // degree)]
        pos = self._gather(pos)
        self.perm = jnp.argsort(pos, axis=1) if sort else None
        self.inverse = None if self.perm is None else jnp.argsort(self.perm, axis=1)
        self.pos = self._sort(pos, self.perm, 1)
        self.seg = self._sort(self._gather(seg), self.perm, 1)

    def _gather(self, x):
        """[b, n] -> [b, u n]: the group's blocks in device order."""
        if x is None or self.degree == 1:
            return x
        return lax.all_gather(x, SEQ, axis=1, tiled=True, axis_index_groups=self.groups)

    @staticmethod
    def _sort(x, perm, axis):
        """x with its `axis` (the group's tokens) taken in the order perm [b, u n], per row."""
        if x is None or perm is None:
            return x
        return jax.vmap(lambda xr, pr: jnp.take(xr, pr, axis=axis - 1))(x, perm)

    def own_heads(self, x):
        """[H] per query head -> [H/u]: the heads this device holds after `to_heads` (the
        all-to-all gives group member j the j-th of u equal slices). None stays None."""
        if x is None or self.degree == 1:
            return x
        size = x.shape[0] // self.degree
        return lax.dynamic_slice_in_dim(x, (lax.axis_index(SEQ) % self.degree) * size, size)

    def to_heads(self, x):
        """[b, H, n, ...] -> [b, H/u, u n, ...], sorted."""
        if self.degree > 1:
            x = lax.all_to_all(x, SEQ, 1, 2, tiled=True, axis_index_groups=self.groups)
        return self._sort(x, self.perm, 2)

    def gather_tokens(self, x):
        """A per-token array [b, n, X] -> the group's tokens [b, u n, X], sorted (each member
        holds all of them)."""
        return self._sort(self._gather(x), self.perm, 1)

    def sum_tokens(self, dx):
        """gather_tokens' transpose: [b, u n, X] on every member (its share of each token's
        gradient) -> [b, n, X], this device's tokens summed over the group."""
        dx = self._sort(dx, self.inverse, 1)
        if self.degree == 1:
            return dx
        dx = dx.reshape(dx.shape[0], self.degree, -1, *dx.shape[2:])
        return jnp.sum(lax.all_to_all(dx, SEQ, 1, 1, tiled=True,
                                      axis_index_groups=self.groups), axis=1)

    def to_seq(self, x):
        """The inverse of to_heads: [b, H/u, u n, ...] -> [b, H, n, ...]."""
        x = self._sort(x, self.inverse, 2)
        if self.degree == 1:
            return x
        return lax.all_to_all(x, SEQ, 2, 1, tiled=True, axis_index_groups=self.groups)


def _needs_sort(spec, degree, order, block) -> bool:
    """Whether the concatenated blocks of a group can fail to increase: always with a caller's
    `order`; for a static layout, checked on its formula (a ring layout never needs it)."""
    if degree == 1:
        return False
    if order is not None or spec.layout.data_dependent:
        return True
    n_shards = spec.num_shards
    pos = np.stack([np.asarray(spec.layout.positions(d, block, n_shards))
                    for d in range(n_shards)]).reshape(n_shards // degree, -1)
    return bool((np.diff(pos, axis=1) <= 0).any())


def _kv_copies(kv_heads, degree):
    """How many times each KV head is repeated so that the degree divides their number."""
    return degree // math.gcd(kv_heads, degree)


class Ulysses(base.Strategy):
    name = "ulysses"

    def configured(self, num_shards, q_heads, ulysses_degree=None, **options):
        """The degree is the whole 'seq' axis: a ulysses_degree of anything else is an error."""
        if ulysses_degree not in (None, num_shards):
            raise ValueError(
                f"strategy 'ulysses' spreads heads over all {num_shards} 'seq' shards, not "
                f"{ulysses_degree}: use strategy='usp' with ulysses_degree={ulysses_degree}, or "
                f"drop it")
        check_heads(num_shards, q_heads, num_shards)
        return dataclasses.replace(self, degree=num_shards)

    def label(self, degree, num_shards=None):
        return self.name + (f" {num_shards}" if num_shards else "")

    def degree_in(self, rest):
        return int(rest)

    def _setup(self, spec, q, seg, order):
        degree = self.degree
        pos = base.positions(spec, order, *q.shape[:2])
        group = _Group(spec, degree, pos, seg, _needs_sort(spec, degree, order, q.shape[1]))
        return group, Hops(spec.num_shards // degree, stride=degree)

    def _kv_to_heads(self, group, x):
        x = base.to_heads(x)
        return group.to_heads(jnp.repeat(x, _kv_copies(x.shape[1], group.degree), axis=1))

    def forward(self, spec, q, k, v, seg, order, sinks=None):
        group, hops = self._setup(spec, q, seg, order)
        qh = group.to_heads(base.to_heads(q))
        block = (self._kv_to_heads(group, k), self._kv_to_heads(group, v), group.seg, group.pos)
        out, lse, counts = ring_forward(spec, hops, qh, group.pos, group.seg, block,
                                        group.own_heads(sinks))
        out = group.to_seq(out.astype(q.dtype))  # cast first: the all-to-all moves q's dtype
        lse = group.to_seq(lse[..., None])[..., 0]
        counts = jnp.zeros((spec.num_shards,), jnp.int32).at[:hops.steps].set(counts)
        return base.from_heads(out), lse, counts

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        group, hops = self._setup(spec, q, seg, order)
        rows = group.to_heads(jnp.stack([lse, base.delta_rows(out, dout)], axis=-1))
        qh, doh = group.to_heads(base.to_heads(q)), group.to_heads(base.to_heads(dout))
        block = (self._kv_to_heads(group, k), self._kv_to_heads(group, v), group.seg, group.pos)
        dq, (dk, dv), _ = ring_backward(spec, hops, qh, doh, rows[..., 0], rows[..., 1],
                                        group.pos, group.seg, block)
        return (base.from_heads(group.to_seq(dq.astype(q.dtype))),
                self._kv_from_heads(group, dk, k), self._kv_from_heads(group, dv, v))

    passes_latents = True

    def _latent_setup(self, spec, shape, q, c, k_rope, kv_b, seg, order):
        """(group, hops, the group's latent block, a codec of this device's heads' kv_b)."""
        group, hops = self._setup(spec, q, seg, order)
        heads = shape.heads // group.degree
        per_head = kv_b.reshape(kv_b.shape[0], shape.heads, -1)
        own = lax.dynamic_slice_in_dim(per_head, (lax.axis_index(SEQ) % group.degree) * heads,
                                       heads, axis=1).reshape(kv_b.shape[0], -1)
        block = (group.gather_tokens(c), group.gather_tokens(k_rope), group.seg, group.pos)
        return group, hops, block, LatentCodec(own, shape, spec.tiles.precision)

    def latent_forward(self, spec, shape, q, c, k_rope, kv_b, seg, order):
        """The queries by all-to-all as ever; the group's latents gathered, each device
        expanding its own heads (strategies/latent_codec.py); the ring over the groups."""
        group, hops, block, codec = self._latent_setup(spec, shape, q, c, k_rope, kv_b, seg,
                                                       order)
        out, lse, _ = ring_forward(spec, hops, group.to_heads(base.to_heads(q)), group.pos,
                                   group.seg, block, codec=codec)
        out = group.to_seq(out.astype(q.dtype))
        return base.from_heads(out), group.to_seq(lse[..., None])[..., 0]

    def latent_backward(self, spec, shape, q, c, k_rope, kv_b, seg, order, out, lse, dout):
        group, hops, block, codec = self._latent_setup(spec, shape, q, c, k_rope, kv_b, seg,
                                                       order)
        rows = group.to_heads(jnp.stack([lse, base.delta_rows(out, dout)], axis=-1))
        qh, doh = group.to_heads(base.to_heads(q)), group.to_heads(base.to_heads(dout))
        dq, (dc, d_rope), own = ring_backward(spec, hops, qh, doh, rows[..., 0], rows[..., 1],
                                              group.pos, group.seg, block, codec)
        heads = shape.heads // group.degree
        d_kv_b = lax.dynamic_update_slice_in_dim(
            jnp.zeros((kv_b.shape[0], shape.heads, own.shape[1] // heads), jnp.float32),
            own.reshape(kv_b.shape[0], heads, -1), (lax.axis_index(SEQ) % group.degree) * heads,
            axis=1)
        return (base.from_heads(group.to_seq(dq.astype(q.dtype))), group.sum_tokens(dc),
                group.sum_tokens(d_rope), d_kv_b.reshape(kv_b.shape))

    @staticmethod
    def _kv_from_heads(group, dx, like):
        """dK or dV back to sequence sharding, the copies of each KV head summed (float32)."""
        dx = group.to_seq(dx)
        copies = dx.shape[1] // like.shape[2]
        dx = dx.reshape(dx.shape[0], like.shape[2], copies, *dx.shape[2:]).sum(axis=2)
        return base.from_heads(dx.astype(like.dtype))

    def degrees(self, num_shards, q_heads):
        return [num_shards] if num_shards > 1 and q_heads % num_shards == 0 else []

    def kv_tokens_received(self, layout, num_shards, block, mask, tile_k, kv_heads):
        """The all-to-all brings the group's other u - 1 blocks for h'/u of the h' (repeated)
        KV heads; the ring over the N / u groups then N / u - 1 blocks of u n tokens of them."""
        u, copies = self.degree, _kv_copies(kv_heads, self.degree)
        share = kv_heads * copies / u / kv_heads  # of a token's KV heads that a device holds
        tokens = (u - 1) * block + (num_shards // u - 1) * u * block
        return np.full(num_shards, tokens * share, np.float64)

    def cost(self, shape, net, degree, documents=None, step_counts=None):
        """All-to-alls in and out (none overlaps compute: each feeds or drains the whole
        attention) around the ring over the N / u groups, whose blocks are u n tokens of h'/u
        KV heads (h' = lcm(h, u)) and whose tiles span H / u heads."""
        kv_heads = math.lcm(shape.kv_heads, degree)
        q, kv, dkv = strategy_cost.block_bytes(shape, kv_heads)
        share = (degree - 1) / degree
        counts = cost.group_tile_counts(shape.layout, shape.num_shards, degree, shape.block,
                                        shape.tiles, documents, shape.mask)
        pair = strategy_cost.pair_tiles(degree * shape.block, shape.tiles)  # a group's blocks
        steps = strategy_cost.step_seconds(shape, net, counts, pair, 1 / degree)
        steps = steps.max(axis=1).mean(axis=0)
        forward, backward = strategy_cost.ring_seconds(steps.tolist(), kv, dkv, net)
        rows_f32 = 8 * shape.rows * shape.block * shape.q_heads  # lse and D
        a2a = [share * (q + kv), share * q, share * (2 * q + kv + rows_f32), share * (q + kv)]
        rounds = shape.num_shards // degree
        return {"forward_s": forward + net.collective(a2a[0]) + net.collective(a2a[1]),
                "backward_s": backward + net.collective(a2a[2]) + net.collective(a2a[3]),
                "bytes_sent": sum(a2a) + (rounds - 1) * kv + rounds * (kv + dkv) * (rounds > 1),
                "buffer_bytes": 3 * q + rows_f32 + 2 * (kv + dkv),
                "compute_s": float(steps.sum())}


STRATEGY = Ulysses()
