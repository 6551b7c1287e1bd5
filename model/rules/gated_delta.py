"""The gated delta rule (Gated DeltaNet: Qwen3-Next's linear-attention layers), computed in chunks.

Per value head, a state S [dk, dv] is decayed, corrected towards each token's value and read by
its query, one token after the other:

    S <- exp(g_t) S                      g_t <= 0: the decay, in log space
    u_t = beta_t (v_t - S^T k_t)         the part of v_t the state does not predict yet
    S <- S + k_t u_t^T                   o_t = S^T q_t

A chunk of C tokens starting from state S0 is a few matmuls. With G_t the decay summed over the
chunk up to t, the written vectors U [C, dv] solve a unit lower-triangular system (inverted by
matmuls: unit_lower_inverse):

    (I + A) U = beta V - (beta exp(G) K) S0,   A[t, s] = beta_t exp(G_t - G_s) k_t.k_s  (s < t)
    O = (exp(G) Q) S0 + M U,                   M[t, s] = exp(G_t - G_s) q_t.k_s         (s <= t)
    S_C = exp(G_C) S0 + (exp(G_C - G) K)^T U

so U = Wv - Wk S0 and the chunk's end state is affine in its start state: S_C = T S0 + R, with
T = exp(G_C) I - (exp(G_C - G) K)^T Wk [dk, dk] and R = (exp(G_C - G) K)^T Wv [dk, dv]. That is
what a device summarises its whole block by for the devices after it (issue 63's state passing).

Documents: with segment ids, a token reads and updates only its own document's state, as if the
state were reset at each document's start (pairs across documents are masked, not decayed by a
huge factor: exact in float32).

    gated_delta_rule(q, k, v, g, beta, chunk=64) -> (o [B, S, H, dv], final state [B, H, dk, dv])
A block's (T, R) come from one run of the rule from zero with dk more value columns, and
passing them between the 'seq' devices (the collectives) is parallel/recurrent/state.py's
(block_summary, pass_states).

The layer around it (projections, convolution, norms): model/mixers/gated_deltanet.py.

q, k [B, S, H, dk] (already one per value head, normalised and scaled as the layer wants them),
v [B, S, H, dv], g, beta [B, S, H]; float32 inside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


F32 = jnp.float32


def gated_delta_rule(q, k, v, g, beta, chunk: int = 64, initial_state=None, segment_ids=None):
    """(o [B, S, H, dv] in v's dtype, the final state [B, H, dk, dv] float32): the recurrence of
    the module docstring, chunk tokens at a time (S padded to a multiple of chunk: padded tokens
    neither decay nor write). initial_state: [B, H, dk, dv] (zeros by default), the state before
    token 0, which belongs to token 0's document; segment_ids [B, S] ints: documents."""

    def step(state, x):
        q, k, v, g, beta, seg, before = x
        out, state = _chunk(q, k, v, g, beta, seg, before, state)
        return state, out

    return scan_in_chunks(step, (q, k, v, g, beta), v, chunk, initial_state, segment_ids)


def scan_in_chunks(step, per_token, v, chunk: int, initial_state=None, segment_ids=None):
    """A chunked rule's scan (gated_delta_rule's, ssd.ssd_rule's): the per-token inputs
    [B, S, H, ...] (q and k first, v [B, S, H, dv] among them) padded to whole chunks and laid
    out heads first, [N, B, H, C, ...] float32, each chunk's segment ids [B, C] and the document
    of the state before it [B, 1] appended; step(state, chunk's inputs) -> (state, o [B, H, C,
    dv]). Each chunk's matrices are recomputed in the backward from its inputs and start state
    (jax.checkpoint): what the scan keeps is a state a chunk. Returns (o [B, S, H, dv] in v's
    dtype, the final state [B, H, dk, dv])."""
    b, s, h, dk = per_token[1].shape
    dv = v.shape[-1]
    pad = -s % chunk
    seg = jnp.zeros((b, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def chunks(x, mode="constant"):  # [B, S, ...] -> [N, B, C, ...] (padded)
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), mode=mode)
        return jnp.moveaxis(x.reshape(b, -1, chunk, *x.shape[2:]), 1, 0)

    inputs = tuple(jnp.moveaxis(chunks(x.astype(F32)), 3, 2) for x in per_token)
    seg = chunks(seg, mode="edge")  # [N, B, C]: padding joins the last document (nothing written)
    first = seg[:1, :, :1]  # token 0's document owns the initial state
    previous = jnp.concatenate([first, seg[:-1, :, -1:]], axis=0)  # [N, B, 1]: before each chunk
    state = jnp.zeros((b, h, dk, dv), F32) if initial_state is None else initial_state.astype(F32)
    state, out = lax.scan(jax.checkpoint(step), state, (*inputs, seg, previous))
    out = jnp.moveaxis(out, 2, 3).reshape(-1, b, chunk, h, dv)  # [N, B, C, H, dv]
    out = jnp.moveaxis(out, 0, 1).reshape(b, -1, h, dv)[:, :s]
    return out.astype(v.dtype if v.dtype != F32 else F32), state


def _chunk(q, k, v, g, beta, seg, before, state):
    """One chunk, heads first: q, k [B, H, C, dk], v [B, H, C, dv], g, beta [B, H, C], seg [B, C]
    and `before` [B, 1] (the document of the state), state [B, H, dk, dv] -> (o [B, H, C, dv],
    the state after the chunk's last token, of its document)."""
    c = q.shape[2]
    cum = jnp.cumsum(g, axis=-1)  # G_t
    same = seg[:, None, :, None] == seg[:, None, None, :]  # [B, 1, C, C]
    lower = jnp.tril(jnp.ones((c, c), bool), -1)
    # exp(G_t - G_s) where s <= t in one document; 0 elsewhere (masked before the exp)
    gap = jnp.where(same & jnp.tril(jnp.ones((c, c), bool)), cum[..., :, None] - cum[..., None, :],
                    -jnp.inf)
    decay = jnp.exp(gap)  # [B, H, C, C]
    carries = (seg == before)[:, None, :, None]  # [B, 1, C, 1]: tokens of the state's document
    from_start = jnp.exp(cum)[..., None] * carries  # exp(G_t), for the tokens the state reaches
    kk = jnp.einsum("bhtd,bhsd->bhts", k, k, precision=lax.Precision.HIGHEST)
    system = jnp.eye(c, dtype=F32) + jnp.where(lower, beta[..., None] * decay * kk, 0.0)
    rhs = jnp.concatenate([beta[..., None] * v, beta[..., None] * from_start * k], axis=-1)
    solved = jnp.einsum("bhts,bhsd->bhtd", unit_lower_inverse(system), rhs,
                        precision=lax.Precision.HIGHEST)
    w_v, w_k = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]
    u = w_v - jnp.einsum("bhtk,bhkv->bhtv", w_k, state, precision=lax.Precision.HIGHEST)
    qk = jnp.einsum("bhtd,bhsd->bhts", q, k, precision=lax.Precision.HIGHEST)
    out = (jnp.einsum("bhtk,bhkv->bhtv", from_start * q, state, precision=lax.Precision.HIGHEST)
           + jnp.einsum("bhts,bhsv->bhtv", decay * qk, u, precision=lax.Precision.HIGHEST))
    # the state of the chunk's last token: its document's tokens, decayed to the end
    last = seg[:, -1:]  # [B, 1]
    to_end = jnp.where((seg == last)[:, None, :], jnp.exp(cum[..., -1:] - cum), 0.0)  # [B, H, C]
    keep = jnp.where(last == before, jnp.exp(cum[..., -1]), 0.0)[..., None, None]  # [B, H, 1, 1]
    state = keep * state + jnp.einsum("bhtk,bhtv->bhkv", to_end[..., None] * k, u,
                                      precision=lax.Precision.HIGHEST)
    return out, state


def unit_lower_inverse(a):
    """The inverse of unit lower-triangular matrices a [..., C, C], by matmuls alone: the
    inverses of the diagonal blocks of size 1, 2, 4, ... are joined in pairs,

        [[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]],

    log2 C levels (C padded to a power of two with the identity). Not lax's triangular solve:
    on XLA:CPU its LAPACK call stalls a program of 4 devices that runs collectives beside it
    (seen: a train step that never finished), and matmuls are what TPUs and GPUs run fastest."""
    c = a.shape[-1]
    size = 1 << max(c - 1, 0).bit_length()
    lead = a.shape[:-2]
    if size != c:  # the identity below and right of a: the inverse's top-left block is a's
        a = jnp.pad(a, [(0, 0)] * len(lead) + [(0, size - c)] * 2)
        a = a + jnp.diag(jnp.arange(size) >= c).astype(a.dtype)
    inverse = jnp.broadcast_to(jnp.eye(size, dtype=a.dtype), a.shape)
    block = 1
    while block < size:
        n = size // (2 * block)  # pairs of blocks at this level
        pairs = a.reshape(*lead, n, 2, block, n, 2, block)
        inv = inverse.reshape(*lead, n, 2, block, n, 2, block)
        below = jnp.einsum("...iaib->...iab", pairs[..., :, 1, :, :, 0, :])  # B [.., n, b, b]
        first = jnp.einsum("...iaib->...iab", inv[..., :, 0, :, :, 0, :])  # A^-1
        second = jnp.einsum("...iaib->...iab", inv[..., :, 1, :, :, 1, :])  # D^-1
        corner = -jnp.einsum("...iab,...ibc,...icd->...iad", second, below, first,
                             precision=lax.Precision.HIGHEST)
        joined = jnp.stack([jnp.stack([first, jnp.zeros_like(first)], -3),
                            jnp.stack([corner, second], -3)], -4)  # [.., n, 2, 2, b, b]
        eye = jnp.eye(n, dtype=a.dtype)
        inverse = jnp.einsum("...ixyab,ij->...ixajyb", joined, eye).reshape(a.shape)
        block *= 2
    return inverse[..., :c, :c]
