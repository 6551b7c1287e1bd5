"""A recurrent layer's rule over the 'seq' devices (Gated DeltaNet's, Mamba2's): the two
strategies of parallel.linear_strategy (a run's AttentionChoice.linear_strategy;
planner/linear_strategy.py prices them for 'auto'). A layer describes itself by a `Recurrence`:
its convolution's channels laid out by group (Gated DeltaNet: key heads; Mamba2: groups), its
heads, its rule (gated_delta.gated_delta_rule, ssd.ssd_rule) and how the convolution's output
becomes q, k, v.

    'state'  each device scans its contiguous block of the row from a zero state and the devices
             pass states (pass_states below: an all-gather of H (dk^2 + dk dv) numbers a
             row per device, whatever the length); the convolution's first taps read the
             previous piece's last conv_kernel - 1 inputs (a halo). Zigzag's devices hold two
             contiguous halves each: they pass the states of 2N pieces in place. Where that
             costs more than moving the tokens (short blocks), and for striped and balanced,
             the tokens go to contiguous blocks and back (parallel/contiguous.py: a ppermute
             of each token once for a static layout, padded all-to-alls for balanced).
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
import numpy as np
from jax import lax

import parallel
from model.rules.gated_delta import block_summary
from model.rules.short_conv import causal_conv, last_inputs
from parallel.contiguous import from_blocks, local_positions, to_blocks
from parallel.layouts import get_layout

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
    pieces = pieces_in_place(layout, block, count, *numbers(rec))

    def local(mixed, g, beta, seg, conv, bias, order):
        if pieces is None:  # not contiguous enough: to contiguous blocks and back after
            mixed, g, beta, seg = (to_blocks(t, layout, order, block)
                                   for t in (mixed, g, beta, seg))
        places = np.arange(count)[:, None] if pieces is None else pieces
        p, b = places.shape[1], mixed.shape[0]
        split = lambda x: jnp.moveaxis(  # noqa: E731  [b, n, ...] -> [P, b, n / P, ...]
            x.reshape(b, p, block // p, *x.shape[2:]), 1, 0)
        mixed, g, beta, seg = (split(t) for t in (mixed, g, beta, seg))
        before = piece_halos(mixed, seg, conv.shape[0] - 1, places)
        rows = lambda x: x.reshape(p * b, *x.shape[2:])  # noqa: E731  pieces as rows
        mixed = causal_conv(rows(mixed), conv, rows(seg), before=before, bias=bias)
        q, k, v, skip = rec.heads_of(mixed, rec.groups)
        pieced = lambda x: x.reshape(p, b, *x.shape[1:])  # noqa: E731
        o, final = pass_states(*(pieced(x) for x in (q, k, v)), g, beta, seg, rec.chunk,
                               rec.rule, places)
        o = rows(o) if skip is None else rows(o) + skip
        o = jnp.moveaxis(o.reshape(p, b, *o.shape[1:]), 0, 1).reshape(b, block, *o.shape[2:])
        return (from_blocks(o, layout, order, block) if pieces is None else o), final

    return _over_devices(local, mesh, bias, order)(mixed, g, beta, seg, conv, bias, order)


def pieces_in_place(layout: str, block: int, count: int, summary: int, token: int):
    """Where each device's tokens of a static layout are a few contiguous pieces (ring: one
    block; zigzag: two halves), [N, P] ints, each (device, piece)'s place among the row's N P
    pieces, when all-gathering the pieces' summaries (`summary` numbers each: H dk (dk + dv))
    moves fewer numbers than sending the block's tokens to contiguous blocks and back (`token`
    numbers each: the convolution's inputs, g, beta, the segment id there, the output back);
    None otherwise (striped: pieces of one token; balanced: its placement comes with the
    batch). The planner prices the same choice (planner/linear_strategy.py)."""
    if get_layout(layout).data_dependent:
        return None
    pos = np.stack([get_layout(layout).positions(d, block, count, xp=np) for d in range(count)])
    p = len(np.flatnonzero(np.diff(pos[0]) != 1)) + 1
    if block % p:
        return None
    length = block // p
    runs = pos.reshape(count, p, length)
    if not (np.diff(runs, axis=-1) == 1).all():
        return None  # the devices' pieces differ in length
    in_place = p == 1 or count * p * summary <= block * token
    return runs[:, :, 0] // length if in_place else None


def state_widths(rec: Recurrence) -> tuple[int, int]:
    """(dk, dv) of the layer's state per head: the widths of the q and v its heads_of makes."""
    q, _, v, _ = jax.eval_shape(lambda m: rec.heads_of(m, rec.groups),
                                jax.ShapeDtypeStruct((1, 1, rec.groups * sum(rec.widths)),
                                                     jnp.float32))
    return q.shape[-1], v.shape[-1]


def numbers(rec: Recurrence) -> tuple[int, int]:
    """(a piece's summary, a token's move) in numbers, pieces_in_place's: H dk (dk + dv), and
    C + 2 H + 1 + H dv."""
    dk, dv = state_widths(rec)
    return (rec.heads * dk * (dk + dv),
            rec.groups * sum(rec.widths) + 2 * rec.heads + 1 + rec.heads * dv)


def piece_halos(mixed, seg, width: int, places):
    """Each piece's convolution taps before it ([P b, width, C], segment ids, present): the
    last `width` inputs of the piece before it in the row, from whichever device holds it
    (an all-gather of every piece's tails: N P width tokens)."""
    p, b = seg.shape[:2]
    if mixed.shape[2] < width:
        raise ValueError(f"a device's piece of {mixed.shape[2]} tokens is shorter than the "
                         f"convolution's {width + 1} taps: use fewer 'seq' devices")
    tails = (mixed[:, :, mixed.shape[2] - width:], seg[:, :, seg.shape[2] - width:])
    in_row = np.argsort(places.reshape(-1))
    tails = [lax.all_gather(t, parallel.SEQ).reshape(-1, *t.shape[1:])[in_row] for t in tails]
    mine = jnp.asarray(places, jnp.int32)[lax.axis_index(parallel.SEQ)]  # [P]
    previous = jnp.maximum(mine - 1, 0)
    present = jnp.broadcast_to((mine > 0)[:, None, None], (p, b, width))
    return tuple(x.reshape(p * b, *x.shape[2:]) for x in (tails[0][previous],
                                                         tails[1][previous], present))


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


def pass_states(q, k, v, g, beta, seg, chunk: int = 64, rule=None, pieces=None):
    """The rule inside a shard_map over 'seq' whose devices each hold P contiguous pieces of the
    row (the local [P, B, L, ...] arrays, seg [P, B, L]; `pieces` [N, P] static ints: the place
    of device d's piece p among the row's N P pieces, default each device one block in device
    order): each piece is scanned from a zero state (block_summary), the devices all-gather the
    pieces' (T, R) and the documents at their ends, and each folds the pieces before its own
    into their incoming states and adds what those states read. What travels is N P H (dk^2 +
    dk dv) numbers a row, whatever the length. Returns (o [P, B, L, H, dv] in v's dtype, the
    state after the whole row [B, H, dk, dv], the same on every device). rule: block_summary's."""
    p, b = seg.shape[:2]
    merged = lambda x: x.reshape(p * b, *x.shape[2:])  # noqa: E731  (pieces as rows)
    out, reads, r, t = block_summary(*(merged(x) for x in (q, k, v, g, beta)), chunk,
                                     merged(seg), rule)
    split = lambda x: x.reshape(p, b, *x.shape[1:])  # noqa: E731
    incoming, final = incoming_state(split(r), split(t), seg, pieces)
    extra = jnp.einsum("pbshk,pbhkv->pbshv", split(reads), incoming,
                       precision=lax.Precision.HIGHEST)
    return (split(out) + extra).astype(v.dtype), final


def incoming_state(r, t, seg, pieces=None):
    """Inside a shard_map over 'seq': this device's P pieces of the row, each summarised by S_out
    = T S_in + R (block_summary; r [P, B, H, dk, dv], t [P, B, H, dk, dk]) and its segment ids
    seg [P, B, L]; pieces [N, P] static: each (device, piece)'s place in the row (default: one
    block a device, in device order). The devices all-gather the summaries and the documents at
    the pieces' ends, and each folds the pieces before its own. Returns (the states this
    device's pieces start from [P, B, H, dk, dv], zero where a piece's first token starts a
    document; the state after the whole row, the same on every device)."""
    count = jax.lax.axis_size(parallel.SEQ)
    pieces = np.arange(count)[:, None] if pieces is None else np.asarray(pieces)
    ends = jnp.stack([seg[..., 0], seg[..., -1]], axis=-1)  # [P, B, 2]: first, last documents
    in_row = np.argsort(pieces.reshape(-1))  # the (device, piece) at each place of the row
    r_all, t_all, ends_all = (
        jax.lax.all_gather(x, parallel.SEQ).reshape(-1, *x.shape[1:])[in_row]
        for x in (r, t, ends))  # [N P, ...] in the row's order

    def fold(state, c):  # the state after piece c, from the state before it
        carried = (ends_all[c, :, 0] == jnp.where(c > 0, ends_all[c - 1, :, 1], -1)) | (c == 0)
        state = jnp.where(carried[:, None, None, None], state, 0.0)
        after = jnp.einsum("bhkj,bhjv->bhkv", t_all[c], state,
                           precision=lax.Precision.HIGHEST) + r_all[c]
        return after, state  # (into the next piece, the state piece c started from)

    final, before = lax.scan(fold, jnp.zeros_like(r[0]), jnp.arange(r_all.shape[0]))
    mine = jnp.asarray(pieces, jnp.int32)[jax.lax.axis_index(parallel.SEQ)]  # [P]
    # a document that starts at a piece's first token does not see the state before it
    previous_last = jnp.where(mine[:, None] > 0, ends_all[jnp.maximum(mine - 1, 0), :, 1], -1)
    incoming = jnp.where((seg[..., 0] == previous_last)[..., None, None, None], before[mine],
                         0.0)
    return incoming, final
