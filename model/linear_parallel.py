"""A recurrent layer's rule over the 'seq' devices (Gated DeltaNet's, Mamba2's): the two
strategies of parallel.linear_strategy (a run's AttentionChoice.linear_strategy;
planner/linear_strategy.py prices them for 'auto'). A layer describes itself by a `Recurrence`:
its convolution's channels laid out by group (Gated DeltaNet: key heads; Mamba2: groups), its
heads, its rule (gated_delta.gated_delta_rule, ssd.ssd_rule) and how the convolution's output
becomes q, k, v.

    'state'  each device scans its contiguous block of the row from a zero state and the devices
             pass states (gated_delta.pass_states: an all-gather of H (dk^2 + dk dv) numbers a
             row per device, whatever the length); the convolution's first taps read the
             previous device's last conv_kernel - 1 inputs (a halo). A layout whose devices do
             not hold contiguous blocks (striped, zigzag, balanced) reaches them and comes back
             (parallel/contiguous.py: ppermutes of each token once for a static layout, padded
             all-to-alls for balanced).
    'heads'  an all-to-all gives each device the whole row for groups / N groups (their
             channels, their heads' decays and betas: Ulysses for the recurrence), which it
             scans alone in the original order; one all-to-all brings the outputs back. What
             moves grows with the length; the groups cap the degree.

Both take the convolution's inputs `mixed` [B, S, C], g, beta [B, S, H], segment ids [B, S] and
the batch's order, in the layout's order and sharded ('data', 'seq'), and return (o [B, S, H, P]
in the layout's order, the state after each whole row [B, H, N, P]): exact, forward and backward
(tests/test_linear_attention.py, tests/test_mamba.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

import parallel
from model.gated_delta import pass_states
from model.short_conv import causal_conv, halo, last_inputs
from parallel.contiguous import from_blocks, local_positions, to_blocks

TOKENS = jax.P(parallel.DATA, parallel.SEQ)
CHANNELS = jax.P(parallel.DATA, parallel.SEQ, None)
OUT = (jax.P(parallel.DATA, parallel.SEQ, None, None), jax.P(parallel.DATA))


@dataclasses.dataclass(frozen=True)
class Recurrence:
    """What the strategies need of one recurrent layer."""

    widths: tuple[int, ...]  # a group's channels in each part of the convolution's input, in
    # order (Gated DeltaNet: q dk, k dk, v group dv; Mamba2: x heads/G P, B N, C N)
    groups: int  # what 'heads' splits over the devices (key heads; Mamba2's groups)
    heads: int  # g and beta are one per head, the heads grouped in order
    chunk: int
    rule: Callable  # (q, k, v, g, beta, chunk, initial_state, segment_ids) -> (o, state)
    # (the convolution's output [b, n, C] of `groups` groups, groups) -> q, k, v [b, n, H', *]
    # and what o adds besides the rule (Mamba2's D x) or None
    heads_of: Callable
    unit: str = "Gated DeltaNet layers' key heads"  # what `groups` counts, for errors
    # The layer's two ends (model/linear_pieces.py runs them a piece at a time):
    # project(weights, x [b, n, D]) -> (the convolution's inputs [b, n, C] float32, g, beta
    # [b, n, H] float32, what finish needs besides o: Gated DeltaNet's and Mamba2's gate z);
    # finish(weights, o [b, n, H, P], that) -> out [b, n, D]
    project: Callable | None = None
    finish: Callable | None = None

    def split(self, count: int) -> "Recurrence":
        return dataclasses.replace(self, groups=self.groups // count,
                                   heads=self.heads // count)


def check_heads(groups: int, num_shards: int,
                unit: str = "Gated DeltaNet layers' key heads") -> None:
    """ValueError, one line, where 'heads' cannot split the layers' groups evenly."""
    if groups % num_shards:
        *what, noun = unit.split("' ")
        raise ValueError(
            f"parallel.linear_strategy='heads' splits the {what[0]}' {groups} {noun} over "
            f"{num_shards} 'seq' devices, which does not divide them: set "
            f"parallel.linear_strategy='state' (or 'auto')")


def for_prefill(mixed, g, beta, seg, order, width: int):
    """A sequence-parallel prefill's inputs (segment 0: each row's prompt, padding after it):
    the padding neither decays nor writes, so the final state is the prompt's. Returns (g,
    beta, segment ids all 0, the convolution's last `width` prompt inputs [B, width, C]: the
    decoding cache's)."""
    prompt = seg == 0
    g, beta = jnp.where(prompt[..., None], g, 0.0), jnp.where(prompt[..., None], beta, 0.0)
    return g, beta, jnp.zeros_like(seg), last_inputs(mixed, prompt, order, width)


def by_state(mixed, g, beta, seg, order, conv, bias, rec: Recurrence, layout: str, mesh):
    """'state' (module docstring): conv [K, C] and bias [C] (or None) the convolution's."""
    count = mesh.shape[parallel.SEQ]
    block = mixed.shape[1] // count
    reorder = layout != "ring"

    def local(mixed, g, beta, seg, conv, bias, order):
        if reorder:
            mixed, g, beta, seg = (to_blocks(t, layout, order, block)
                                   for t in (mixed, g, beta, seg))
        mixed = causal_conv(mixed, conv, seg, before=halo(mixed, seg, conv.shape[0] - 1),
                            bias=bias)
        q, k, v, skip = rec.heads_of(mixed, rec.groups)
        o, final = pass_states(q, k, v, g, beta, seg, rec.chunk, rec.rule)
        o = o if skip is None else o + skip
        return (from_blocks(o, layout, order, block) if reorder else o), final

    return _over_devices(local, mesh, bias, order)(mixed, g, beta, seg, conv, bias, order)


def by_heads(mixed, g, beta, seg, order, conv, bias, rec: Recurrence, layout: str, mesh):
    """'heads' (module docstring)."""
    count = mesh.shape[parallel.SEQ]
    check_heads(rec.groups, count, rec.unit)
    mine = rec.split(count)
    per_group, width = rec.heads // rec.groups, sum(rec.widths)
    block = mixed.shape[1] // count

    def local(mixed, g, beta, seg, conv, bias, order):
        b, n, _ = mixed.shape
        packed = jnp.concatenate([by_group(mixed, rec.widths, rec.groups),
                                  g.reshape(b, n, rec.groups, per_group),
                                  beta.reshape(b, n, rec.groups, per_group)], axis=-1)
        packed = lax.all_to_all(packed, parallel.SEQ, 2, 1, tiled=True)  # [b, S, G / N, w]
        pos = lax.all_gather(local_positions(layout, order, block, count), parallel.SEQ,
                             axis=1, tiled=True)  # [b or 1, S]: each slot's original index
        seg = lax.all_gather(seg, parallel.SEQ, axis=1, tiled=True)
        if layout != "ring":  # the original order (ring's already is)
            slots = _inverse(pos)  # each original index's slot
            packed, seg = _take(packed, slots), _take(seg, slots)
        s = packed.shape[1]
        first = lax.axis_index(parallel.SEQ) * mine.groups

        def my_groups(x):  # the convolution's taps or bias [..., C] -> this device's groups
            x = lax.dynamic_slice_in_dim(by_group(x, rec.widths, rec.groups), first,
                                         mine.groups, x.ndim - 1)
            return from_groups(x, rec.widths)

        mixed = causal_conv(from_groups(packed[..., :width], rec.widths), my_groups(conv), seg,
                            bias=None if bias is None else my_groups(bias))
        q, k, v, skip = mine.heads_of(mixed, mine.groups)
        o, final = rec.rule(q, k, v, packed[..., width:width + per_group].reshape(b, s, -1),
                            packed[..., width + per_group:].reshape(b, s, -1), rec.chunk,
                            None, seg)
        o = o if skip is None else o + skip
        o = o if layout == "ring" else _take(o, pos)  # back in the layout's order
        o = lax.all_to_all(o, parallel.SEQ, 1, 2, tiled=True)  # [b, n, H, P]
        return o, lax.all_gather(final, parallel.SEQ, axis=1, tiled=True)

    return _over_devices(local, mesh, bias, order)(mixed, g, beta, seg, conv, bias, order)


def _over_devices(local, mesh, bias, order):
    return jax.shard_map(
        local, mesh=mesh, check_vma=False,
        in_specs=(CHANNELS, CHANNELS, CHANNELS, TOKENS, jax.P(),
                  None if bias is None else jax.P(), None if order is None else TOKENS),
        out_specs=OUT)


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
    tests/test_linear_attention.py checks this once at full optimisation)."""
    index = jnp.broadcast_to(index, x.shape[:2])
    rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], index.shape)
    return x[rows, index]
