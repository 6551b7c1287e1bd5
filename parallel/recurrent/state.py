"""'state': each device scans its contiguous block of the row from a zero state and the devices
pass states: an all-gather of H (dk^2 + dk dv) numbers a row per device, whatever the length.

The rule is linear in (values, start state) together, so one run from zero with dk more value
columns summarises a block: S_out = T S_in + R (block_summary). The devices all-gather the
blocks' (T, R) and the documents at their ends, and each folds the blocks before its own into
the state it starts from (incoming_state) and adds what that state reads. The convolution's
first taps read the previous piece's last conv_kernel - 1 inputs (a halo, piece_halos).

Zigzag's devices hold two contiguous halves each: they pass the states of 2N pieces in place.
Where that costs more than moving the tokens (short blocks), and for striped and balanced, the
tokens go to contiguous blocks and back (parallel/contiguous.py: a ppermute of each token once
for a static layout, padded all-to-alls for balanced); pieces_in_place decides, and `cost`
prices the same choice.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel.contiguous import from_blocks, to_blocks
from parallel.layouts import get_layout
from parallel.mesh import SEQ
from parallel.recurrent.base import (F32, Recurrence, RecurrentShape, RecurrentStrategy,
                                     numbers, over_devices)

BACKWARD = 2.0  # the backward's FLOPs against the forward's
BYTES = 4  # float32


class State(RecurrentStrategy):
    name = "state"

    def run(self, mixed, g, beta, seg, order, conv, bias, rec: Recurrence, layout: str, mesh):
        count = mesh.shape[SEQ]
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
            mixed = rec.conv(rows(mixed), conv, rows(seg), before=before, bias=bias)
            q, k, v, skip = rec.heads_of(mixed, rec.groups)
            pieced = lambda x: x.reshape(p, b, *x.shape[1:])  # noqa: E731
            o, final = pass_states(*(pieced(x) for x in (q, k, v)), g, beta, seg, rec.chunk,
                                   rec.rule, places)
            o = rows(o) if skip is None else rows(o) + skip
            o = jnp.moveaxis(o.reshape(p, b, *o.shape[1:]), 0, 1).reshape(b, block,
                                                                          *o.shape[2:])
            return (from_blocks(o, layout, order, block) if pieces is None else o), final

        return over_devices(local, mesh, bias, order)(mixed, g, beta, seg, conv, bias, order)

    def cost(self, x: RecurrentShape, layout: str, seq_len: int, num_shards: int,
             rows: int = 1) -> dict:
        """The rule over the device's n = S / N tokens, every head, its values widened by dk
        columns (block_summary), and the fold of the N blocks' summaries; the all-gather of
        (T, R) and the convolution's halo; zigzag's halves passed in place (2N summaries)
        where that is fewer bytes than moving its tokens to contiguous blocks and back, which
        striped (the tokens that leave a device, at most n) and balanced (N - 1 padded blocks
        of n each way) always do. Backward moves it all again (the transposed collectives)."""
        count, n = num_shards, seq_len // num_shards
        h, dk, dv = x.heads, x.key_dim, x.value_dim
        fold = count * h * 2.0 * dk * dk * (dk + dv)
        flops = rows * (n * x.rule_flops(dv + dk) + fold) * (1 + BACKWARD)
        sent = rows * BYTES * ((count - 1) * h * (dk * dk + dk * dv)
                               + (x.conv_kernel - 1) * (x.conv_channels + 1))
        pieces = pieces_in_place(layout, n, count, x.summary_numbers(), x.token_numbers())
        if pieces is not None:  # zigzag's halves pass their states in place: N (P - 1) more
            sent += rows * BYTES * count * (pieces.shape[1] - 1) * h * (dk * dk + dk * dv)
        elif layout != "ring":  # to contiguous blocks and back (parallel/contiguous.py)
            moved = (count - 1) * n if get_layout(layout).data_dependent else n
            sent += rows * BYTES * moved * x.token_numbers()
        return {"flops": flops, "bytes": 2 * sent,
                "collectives": 4 + (4 if layout != "ring" else 0)}


def pieces_in_place(layout: str, block: int, count: int, summary: int, token: int):
    """Where each device's tokens of a static layout are a few contiguous pieces (ring: one
    block; zigzag: two halves), [N, P] ints, each (device, piece)'s place among the row's N P
    pieces, when all-gathering the pieces' summaries (`summary` numbers each: H dk (dk + dv))
    moves fewer numbers than sending the block's tokens to contiguous blocks and back (`token`
    numbers each: the convolution's inputs, g, beta, the segment id there, the output back);
    None otherwise (striped: pieces of one token; balanced: its placement comes with the
    batch)."""
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
    tails = [lax.all_gather(t, SEQ).reshape(-1, *t.shape[1:])[in_row] for t in tails]
    mine = jnp.asarray(places, jnp.int32)[lax.axis_index(SEQ)]  # [P]
    previous = jnp.maximum(mine - 1, 0)
    present = jnp.broadcast_to((mine > 0)[:, None, None], (p, b, width))
    return tuple(x.reshape(p * b, *x.shape[2:]) for x in (tails[0][previous],
                                                         tails[1][previous], present))


def block_summary(q, k, v, g, beta, chunk: int, segment_ids, rule):
    """One block from a zero state, and what the state it really starts from would add:
    (o [B, n, H, dv], reads [B, n, H, dk], R [B, H, dk, dv], T [B, H, dk, dk]) with

        o_true = o + reads . S_in        S_out = T S_in + R      (S_in: the state before it)

    The rule is linear in (values, start state) together, so both come from one run with dk more
    value columns: values [v | 0], start state [0 | I]; the extra columns carry d S / d S_in
    (zeroed, as the state is, at a document's start: T and reads then vanish past it)."""
    b, _, h, dk = k.shape
    ones = jnp.broadcast_to(jnp.eye(dk, dtype=F32), (b, h, dk, dk))
    start = jnp.concatenate([jnp.zeros((b, h, dk, v.shape[-1]), F32), ones], axis=-1)
    wide = jnp.concatenate([v.astype(F32), jnp.zeros((*v.shape[:-1], dk), F32)], axis=-1)
    out, state = rule(q, k, wide, g, beta, chunk, start, segment_ids)
    dv = v.shape[-1]
    return out[..., :dv], out[..., dv:], state[..., :dv], state[..., dv:]


def pass_states(q, k, v, g, beta, seg, chunk: int, rule, pieces=None):
    """The rule inside a shard_map over 'seq' whose devices each hold P contiguous pieces of the
    row (the local [P, B, L, ...] arrays, seg [P, B, L]; `pieces` [N, P] static ints: the place
    of device d's piece p among the row's N P pieces, default each device one block in device
    order): each piece is scanned from a zero state (block_summary), the devices all-gather the
    pieces' (T, R) and the documents at their ends, and each folds the pieces before its own
    into their incoming states and adds what those states read. What travels is N P H (dk^2 +
    dk dv) numbers a row, whatever the length. Returns (o [P, B, L, H, dv] in v's dtype, the
    state after the whole row [B, H, dk, dv], the same on every device)."""
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
    count = lax.axis_size(SEQ)
    pieces = np.arange(count)[:, None] if pieces is None else np.asarray(pieces)
    ends = jnp.stack([seg[..., 0], seg[..., -1]], axis=-1)  # [P, B, 2]: first, last documents
    in_row = np.argsort(pieces.reshape(-1))  # the (device, piece) at each place of the row
    r_all, t_all, ends_all = (
        lax.all_gather(x, SEQ).reshape(-1, *x.shape[1:])[in_row]
        for x in (r, t, ends))  # [N P, ...] in the row's order

    def fold(state, c):  # the state after piece c, from the state before it
        carried = (ends_all[c, :, 0] == jnp.where(c > 0, ends_all[c - 1, :, 1], -1)) | (c == 0)
        state = jnp.where(carried[:, None, None, None], state, 0.0)
        after = jnp.einsum("bhkj,bhjv->bhkv", t_all[c], state,
                           precision=lax.Precision.HIGHEST) + r_all[c]
        return after, state  # (into the next piece, the state piece c started from)

    final, before = lax.scan(fold, jnp.zeros_like(r[0]), jnp.arange(r_all.shape[0]))
    mine = jnp.asarray(pieces, jnp.int32)[lax.axis_index(SEQ)]  # [P]
    # a document that starts at a piece's first token does not see the state before it
    previous_last = jnp.where(mine[:, None] > 0, ends_all[jnp.maximum(mine - 1, 0), :, 1], -1)
    incoming = jnp.where((seg[..., 0] == previous_last)[..., None, None, None], before[mine],
                         0.0)
    return incoming, final


STRATEGY = State()
