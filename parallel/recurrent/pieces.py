"""A recurrent layer (Gated DeltaNet, Mamba2) in training, a piece of each device's tokens at a
time (model.linear_chunk): what its step holds grows with the piece, not with the block (the
recurrent layers' counterpart of parallel/chunks.py).

Run whole, a recurrent layer's projections, convolution, rule and gates each make [b, n, C]
float32 arrays of a device's n tokens, and autodiff keeps tens of them; at a million tokens on
a few devices that is tens of GB a device, more than the softmax layers' ring holds. Here the
layer runs in a lax.scan over pieces of P tokens, each piece a jax.checkpoint (the backward
recomputes its arrays), carrying what the next piece needs: the state, and the convolution's
last K - 1 inputs with their documents.

    one 'seq' device    pieces from a zero state
    'state' strategy    pass 1: each device summarises its block, S_out = T S_in + R, piece by
                        piece from the start [0 | I] (block_summary's widened values, outputs
                        unused); the devices fold the gathered (T, R) into the state each
                        block starts from (state.incoming_state); pass 2: the pieces
                        again from that state, now with outputs. Zigzag's two halves run as
                        two rows, their states passed in place where that is cheaper
                        (state.pieces_in_place)
    (the 'heads' strategy runs whole: its all-to-alls move whole rows)

    by_pieces(w, x [B, S, D], seg, order, conv, bias, rec, piece, layout, mesh) -> out [B, S, D]

Exact: the same sums as the whole layer (tests/model/test_linear_attention.py, tests/model/test_mamba.py).
Pass 1 costs one more projection and rule a token; what the step keeps is the layer's input and
output and a state a piece.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from parallel.chunks import check_chunk, join_local, split_local, splits
from parallel.contiguous import from_blocks, to_blocks
from parallel.mesh import DATA, SEQ
from parallel.recurrent.base import F32, RecurrentStrategy, numbers, state_widths
from parallel.recurrent.state import incoming_state, piece_halos, pieces_in_place

ROWS = jax.P(DATA, SEQ, None)


def in_pieces(piece: int, strategy: RecurrentStrategy, x, mesh) -> bool:
    """Whether a training call runs the layer a piece at a time: `piece` tokens (the model's
    linear_chunk) cut each device's block of x [B, S, D] and the strategy runs in pieces."""
    count = 1 if mesh is None else mesh.shape[SEQ]
    block = x.shape[1] // count
    if not splits(piece, block):
        return False
    check_chunk(piece, block, "model.linear_chunk")
    return count == 1 or strategy.in_pieces()


def by_pieces(w, x, seg, order, conv, bias, rec, piece: int, layout: str, mesh):
    """The layer (its Recurrence rec, weights w, convolution taps conv [K, C] and bias) over x
    [B, S, D] in the layout's order, segment ids seg [B, S] -> out [B, S, D], a piece of
    `piece` tokens at a time (module docstring)."""
    if mesh is None or mesh.shape[SEQ] == 1:
        b = x.shape[0]
        start = jnp.zeros((b, rec.heads, *state_widths(rec)), F32)
        return _pieces(w, x, seg, conv, bias, rec, piece, start, _nothing_before(x, conv))
    count = mesh.shape[SEQ]
    block = x.shape[1] // count
    places = pieces_in_place(layout, block, count, *numbers(rec))
    if places is not None and (block // places.shape[1]) % piece:
        places = None  # the pieces of the layer do not cut zigzag's halves: reorder

    def local(w, x, seg, conv, bias, order):
        if places is None:  # contiguous blocks in device order, and back after
            x, seg = to_blocks(x, layout, order, block), to_blocks(seg, layout, order, block)
        where = np.arange(count)[:, None] if places is None else places
        p, b = where.shape[1], x.shape[0]
        rows = lambda t: jnp.moveaxis(  # noqa: E731  [b, n, ...] -> [P b, n / P, ...]
            t.reshape(b, p, block // p, *t.shape[2:]), 1, 0).reshape(p * b, block // p,
                                                                     *t.shape[2:])
        x, seg = rows(x), rows(seg)
        width = conv.shape[0] - 1
        tail = rec.project(w, x[:, x.shape[1] - width:])[0]  # each piece's last conv inputs
        before = piece_halos(tail.reshape(p, b, width, -1),
                              seg[:, seg.shape[1] - width:].reshape(p, b, width), width, where)
        dk, dv = state_widths(rec)
        widened = jnp.concatenate([jnp.zeros((p * b, rec.heads, dk, dv), F32),
                                   jnp.broadcast_to(jnp.eye(dk, dtype=F32),
                                                    (p * b, rec.heads, dk, dk))], axis=-1)
        summary = _pieces(w, x, seg, conv, bias, rec, piece, widened, before, widen=dk)
        summary = summary.reshape(p, b, *summary.shape[1:])
        incoming, _ = incoming_state(summary[..., :dv], summary[..., dv:],
                                     seg.reshape(p, b, -1), where)
        out = _pieces(w, x, seg, conv, bias, rec, piece,
                      incoming.reshape(p * b, *incoming.shape[2:]), before)
        out = jnp.moveaxis(out.reshape(p, b, *out.shape[1:]), 0, 1).reshape(
            b, block, *out.shape[2:])
        return from_blocks(out, layout, order, block) if places is None else out

    return jax.shard_map(
        local, mesh=mesh, check_vma=False,
        in_specs=(jax.tree.map(lambda _: jax.P(), w), ROWS, jax.P(DATA, SEQ),
                  jax.P(), None if bias is None else jax.P(),
                  None if order is None else jax.P(DATA, SEQ)),
        out_specs=ROWS)(w, x, seg, conv, bias, order)


def _pieces(w, x, seg, conv, bias, rec, piece: int, state, before, widen: int = 0):
    """The layer over one block x [b, n, D] (segment ids seg [b, n]) from `state` [b, H, dk,
    dv'] (of seg[:, 0]'s document) and the convolution's `before` (inputs, segment ids,
    present: the K - 1 tokens before the block), piece tokens at a time. Returns out [b, n, D];
    with `widen` (dk), the rule's values get dk zero columns, and what comes back is the state
    after the block (block_summary's: its first dv columns R, the others T), not outputs."""
    width = conv.shape[0] - 1

    def step(carry, inputs):
        state, before, last = carry
        x, seg = inputs
        mixed, g, beta, z = rec.project(w, x)
        q, k, v, skip = rec.heads_of(rec.conv(mixed, conv, seg, before=before, bias=bias),
                                     rec.groups)
        if widen:
            v = jnp.concatenate([v, jnp.zeros((*v.shape[:-1], widen), v.dtype)], axis=-1)
        # the state is the previous token's document's: nothing of it where a document starts
        state = jnp.where((seg[:, 0] == last)[:, None, None, None], state, 0.0)
        o, state = rec.rule(q, k, v, g, beta, rec.chunk, state, seg)
        n = x.shape[1]
        carry = (state, (mixed[:, n - width:], seg[:, n - width:],
                         jnp.ones((x.shape[0], width), bool)), seg[:, -1])
        if widen:
            return carry, None
        return carry, rec.finish(w, o if skip is None else o + skip, z)

    check_chunk(piece, x.shape[1], "model.linear_chunk")
    carry, out = lax.scan(jax.checkpoint(step), (state.astype(F32), before, seg[:, 0]),
                          (split_local(x, piece), split_local(seg, piece)))
    return carry[0] if widen else join_local(out)


def _nothing_before(x, conv):
    """The convolution's `before` at the start of a row: K - 1 absent tokens."""
    b, width = x.shape[0], conv.shape[0] - 1
    return (jnp.zeros((b, width, conv.shape[1]), F32), jnp.zeros((b, width), jnp.int32),
            jnp.zeros((b, width), bool))
