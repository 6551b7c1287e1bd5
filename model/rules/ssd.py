"""Mamba2's state space duality (SSD) rule, computed in chunks: the recurrence of its layers
(model/mixers/mamba2.py) written as gated linear attention with a scalar decay per head.

Per head a state S [N, P] (N: the state size, P: the head's width) decays, is written and read:

    S <- exp(g_t) S + k_t (beta_t v_t)^T      g_t = dt_t A <= 0, beta_t = dt_t
    o_t = S^T q_t                               q = C, k = B, v = x (Mamba2's names)

A chunk of C tokens from state S0, with G_t the decay summed over the chunk up to t, is matmuls
alone (no triangular system: the state is only added to):

    O   = (exp(G) Q) S0 + (L * Q K^T) (beta V),   L[t, s] = exp(G_t - G_s) for s <= t
    S_C = exp(G_C) S0 + (exp(G_C - G) K)^T (beta V)

Documents: with segment ids a token reads and writes only its own document's state (pairs across
documents are masked), as if the state were reset at each document's start.

    ssd_rule(q, k, v, g, beta, chunk=64, initial_state=None, segment_ids=None)
        -> (o [B, S, H, P], final state [B, H, N, P])

the signature of gated_delta.gated_delta_rule, so that parallel/recurrent/state.py's pass_states passes states
for either over the 'seq' devices. q, k [B, S, H, N] (one per head: Mamba2's groups repeated),
v [B, S, H, P], g, beta [B, S, H]; float32 inside.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from model.rules.gated_delta import scan_in_chunks

F32 = jnp.float32
HIGHEST = lax.Precision.HIGHEST


def ssd_rule(q, k, v, g, beta, chunk: int = 64, initial_state=None, segment_ids=None):
    """(o [B, S, H, P] in v's dtype, the final state [B, H, N, P] float32): the module
    docstring's recurrence, chunk tokens at a time (S padded to a multiple of chunk: padded
    tokens neither decay nor write). initial_state [B, H, N, P]: the state before token 0, of
    token 0's document; segment_ids [B, S] ints."""
    written = v.astype(F32) * beta.astype(F32)[..., None]

    def step(state, x):
        q, k, written, g, seg, before = x
        cum = jnp.cumsum(g, axis=-1)  # [B, H, C]
        c = cum.shape[-1]
        same = seg[:, None, :, None] == seg[:, None, None, :]
        decay = jnp.exp(jnp.where(same & jnp.tril(jnp.ones((c, c), bool)),
                                  cum[..., :, None] - cum[..., None, :], -jnp.inf))
        carries = (seg == before)[:, None, :, None]  # tokens of the state's document
        scores = decay * jnp.einsum("bhtn,bhsn->bhts", q, k, precision=HIGHEST)
        out = (jnp.einsum("bhtn,bhnp->bhtp", jnp.exp(cum)[..., None] * carries * q, state,
                          precision=HIGHEST)
               + jnp.einsum("bhts,bhsp->bhtp", scores, written, precision=HIGHEST))
        last = seg[:, -1:]
        to_end = jnp.where((seg == last)[:, None, :], jnp.exp(cum[..., -1:] - cum), 0.0)
        keep = jnp.where(last == before, jnp.exp(cum[..., -1]), 0.0)[..., None, None]
        state = keep * state + jnp.einsum("bhtn,bhtp->bhnp", to_end[..., None] * k, written,
                                          precision=HIGHEST)
        return state, out

    return scan_in_chunks(step, (q, k, written, g), v, chunk, initial_state, segment_ids)
