"""'heads': an all-to-all gives each device the whole row for groups / N groups (their
channels, their heads' decays and betas: Ulysses for the recurrence), which it scans alone in
the original order; one all-to-all brings the outputs back. What moves grows with the length;
the groups (Gated DeltaNet's key heads, Mamba2's groups) cap the degree.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from parallel.contiguous import local_positions
from parallel.mesh import SEQ
from parallel.recurrent.base import (GATED_DELTANET_UNIT, Recurrence, RecurrentShape,
                                     RecurrentStrategy, over_devices)

BACKWARD = 2.0  # the backward's FLOPs against the forward's
BYTES = 4  # float32


class Heads(RecurrentStrategy):
    name = "heads"

    def check(self, groups: int, num_shards: int, unit: str = GATED_DELTANET_UNIT) -> None:
        if groups % num_shards:
            *what, noun = unit.split("' ")
            raise ValueError(
                f"parallel.linear_strategy='heads' splits the {what[0]}' {groups} {noun} over "
                f"{num_shards} 'seq' devices, which does not divide them: set "
                f"parallel.linear_strategy='state' (or 'auto')")

    def in_pieces(self) -> bool:
        return False  # its all-to-alls move whole rows

    def run(self, mixed, g, beta, seg, order, conv, bias, rec: Recurrence, layout: str, mesh):
        count = mesh.shape[SEQ]
        self.check(rec.groups, count, rec.unit)
        mine = rec.split(count)
        per_group, width = rec.heads // rec.groups, sum(rec.widths)
        block = mixed.shape[1] // count

        def local(mixed, g, beta, seg, conv, bias, order):
            b, n, _ = mixed.shape
            packed = jnp.concatenate([by_group(mixed, rec.widths, rec.groups),
                                      g.reshape(b, n, rec.groups, per_group),
                                      beta.reshape(b, n, rec.groups, per_group)], axis=-1)
            packed = lax.all_to_all(packed, SEQ, 2, 1, tiled=True)  # [b, S, G / N, w]
            pos = lax.all_gather(local_positions(layout, order, block, count), SEQ,
                                 axis=1, tiled=True)  # [b or 1, S]: each slot's original index
            seg = lax.all_gather(seg, SEQ, axis=1, tiled=True)
            if layout != "ring":  # the original order (ring's already is)
                slots = _inverse(pos)  # each original index's slot
                packed, seg = _take(packed, slots), _take(seg, slots)
            s = packed.shape[1]
            first = lax.axis_index(SEQ) * mine.groups

            def my_groups(x):  # the convolution's taps or bias [..., C] -> this device's groups
                x = lax.dynamic_slice_in_dim(by_group(x, rec.widths, rec.groups), first,
                                             mine.groups, x.ndim - 1)
                return from_groups(x, rec.widths)

            mixed = rec.conv(from_groups(packed[..., :width], rec.widths), my_groups(conv), seg,
                             bias=None if bias is None else my_groups(bias))
            q, k, v, skip = mine.heads_of(mixed, mine.groups)
            o, final = rec.rule(q, k, v, packed[..., width:width + per_group].reshape(b, s, -1),
                                packed[..., width + per_group:].reshape(b, s, -1), rec.chunk,
                                None, seg)
            o = o if skip is None else o + skip
            o = o if layout == "ring" else _take(o, pos)  # back in the layout's order
            o = lax.all_to_all(o, SEQ, 1, 2, tiled=True)  # [b, n, H, P]
            return o, lax.all_gather(final, SEQ, axis=1, tiled=True)

        return over_devices(local, mesh, bias, order)(mixed, g, beta, seg, conv, bias, order)

    def cost(self, x: RecurrentShape, layout: str, seq_len: int, num_shards: int,
             rows: int = 1) -> dict:
        """The rule over all S tokens for H / N heads (no widening); an all-to-all of the inputs
        (q, k, v channels, g, beta) and one of the outputs, (N - 1) / N of n tokens each, and
        the segment ids' and order's all-gathers; backward moves it all again."""
        count, n, h = num_shards, seq_len // num_shards, x.heads
        flops = rows * seq_len * x.rule_flops() / count * (1 + BACKWARD)
        sent = rows * BYTES * ((count - 1) / count * n * (x.conv_channels + 2 * h
                                                          + h * x.value_dim)
                               + (count - 1) * n * 2)
        return {"flops": flops, "bytes": 2 * sent, "collectives": 6}


def by_group(x, widths, groups: int):
    """Channels laid out part after part, each [groups, width] ([..., sum(widths) groups]:
    the convolution's inputs, taps, bias) -> per group [..., groups, sum(widths)]."""
    lead, parts, at = x.shape[:-1], [], 0
    for width in widths:
        parts.append(x[..., at:at + groups * width].reshape(*lead, groups, width))
        at += groups * width
    return jnp.concatenate(parts, axis=-1)


def from_groups(x, widths):
    """by_group undone: [..., groups, sum(widths)] -> [..., sum(widths) groups]."""
    lead, parts, at = x.shape[:-2], [], 0
    for width in widths:
        parts.append(x[..., at:at + width].reshape(*lead, -1))
        at += width
    return jnp.concatenate(parts, axis=-1)


def _inverse(pos):
    """The inverse of permutations pos [b, S] (each original index's slot), by a scatter."""
    rows = jnp.broadcast_to(jnp.arange(pos.shape[0])[:, None], pos.shape)
    slots = jnp.broadcast_to(jnp.arange(pos.shape[1]), pos.shape)
    return jnp.zeros_like(pos).at[rows, pos].set(slots, unique_indices=True)


def _take(x, index):
    """x [b, S, ...] at index [b or 1, S] along the sequence, a gather by (row, position):
    jnp.take_along_axis's form of it came out wrong from XLA:CPU's optimised compile of this
    shard_map where a device held one row (outputs 150% off; tests compile unoptimised, so
    tests/model/test_linear_attention.py checks this once at full optimisation)."""
    index = jnp.broadcast_to(index, x.shape[:2])
    rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], index.shape)
    return x[rows, index]


STRATEGY = Heads()
