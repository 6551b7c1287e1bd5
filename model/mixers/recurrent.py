"""A recurrent layer (Gated DeltaNet's, Mamba2's) as a function of its weights and its
`Recurrence` (parallel/recurrent/base.py): what to run for a call, in one place for both layers,
which differ only in their Recurrence (gated_deltanet.recurrence, mamba2.recurrence).

    training, one 'seq' device          the rule over the row
    training, several                   parallel.linear_strategy's way (parallel/recurrent/)
    with model.linear_chunk             a piece of each device's tokens at a time
                                        (parallel/recurrent/pieces.py)
    collect (a sequence-parallel prefill)  + the LinearCache after each row's prompt
    cache (decoding)                    the convolution from the cache's last inputs, the rule
                                        from its state
"""

from __future__ import annotations

import jax.numpy as jnp

import parallel
from model.mixers.cache import LinearCache
from model.rules.short_conv import causal_conv, last_inputs
from parallel.recurrent import Recurrence, get_recurrent_strategy
from parallel.recurrent.pieces import by_pieces, in_pieces


def run(w, x, rec: Recurrence, conv, bias, cfg, choice, segment_ids=None, order=None,
        mesh=None, cache=None, collect: bool = False):
    """x [B, S, D] -> [B, S, D] in the compute dtype (with `cache` or `collect`: (out, the
    LinearCache after it)); conv [K, C] and bias [C] (or None) the convolution's, float32.
    Training splits the sequence over the mesh's 'seq' devices in the run's layout's order by its
    recurrent strategy (choice: its parallel.AttentionChoice; order: the batch's original
    indices, required by 'balanced'). collect: segment 0 is each row's
    prompt, the rest padding after it. cache: tokens in natural order from where it ends."""
    b, s, _ = x.shape
    seg = jnp.zeros((b, s), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    strategy = get_recurrent_strategy(choice.linear_strategy)
    if cache is None and not collect and in_pieces(cfg.linear_chunk, strategy, x, mesh):
        return by_pieces(w, x, seg, order, conv, bias, rec, cfg.linear_chunk, choice.layout, mesh)
    mixed, g, beta, z = rec.project(w, x)
    if collect:
        g, beta, seg, history = for_prefill(mixed, g, beta, seg, order, conv.shape[0] - 1)
    if cache is not None:
        o, cache = _decode(mixed, g, beta, conv, bias, cache, rec)
    elif mesh is None or mesh.shape[parallel.SEQ] == 1:
        q, k, v, skip = rec.heads_of(causal_conv(mixed, conv, seg, bias=bias), rec.groups)
        o, state = rec.rule(q, k, v, g, beta, rec.chunk, segment_ids=seg)
        o = o if skip is None else o + skip
    else:
        o, state = strategy.run(mixed, g, beta, seg, order, conv, bias, rec, choice.layout, mesh)
    if collect:
        cache = LinearCache(state, history)
    out = rec.finish(w, o, z)
    return out if cache is None else (out, cache)


def for_prefill(mixed, g, beta, seg, order, width: int):
    """A sequence-parallel prefill's inputs (segment 0: each row's prompt, padding after it):
    the padding neither decays nor writes, so the final state is the prompt's. Returns (g,
    beta, segment ids all 0, the convolution's last `width` prompt inputs [B, width, C]: the
    decoding cache's)."""
    prompt = seg == 0
    g, beta = jnp.where(prompt[..., None], g, 0.0), jnp.where(prompt[..., None], beta, 0.0)
    return g, beta, jnp.zeros_like(seg), last_inputs(mixed, prompt, order, width)


def _decode(mixed, g, beta, conv, bias, cache: LinearCache, rec: Recurrence):
    """Tokens [B, T] in natural order after the cache: the convolution continues from the
    cache's last inputs, the rule from its state. Returns (o [B, T, H, P], new cache)."""
    b, t, _ = mixed.shape
    width = conv.shape[0] - 1
    out = causal_conv(mixed, conv, before=(cache.conv, jnp.zeros((b, width), jnp.int32),
                                           jnp.ones((b, width), bool)), bias=bias)
    q, k, v, skip = rec.heads_of(out, rec.groups)
    o, state = rec.rule(q, k, v, g, beta, min(rec.chunk, t), initial_state=cache.state)
    history = jnp.concatenate([cache.conv, mixed], axis=1)[:, -width:] if width else cache.conv
    return (o if skip is None else o + skip), LinearCache(state, history)
