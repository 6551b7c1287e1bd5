"""The mixers' decoding caches (KVCache, ShardedCache; a recurrent layer's LinearCache) and the
attention layer's decoding path: dense attention against a cache of past keys and values.

Training attends over a whole sequence sharded over the 'seq' axis (parallel.attention, in a
layout's order). Decoding appends a few tokens at a time to one sequence per row, in natural
order, so each new query attends densely to every cached key before it; the layer writes the new
keys and values into its cache and returns the updated cache:

    cache = init_cache(cfg, batch=2, max_len=64)      # one per layer, zeros (model.mixers)
    logits, cache = model(tokens, positions, cache=cache)   # positions [B, T]: where they go

Slot l of a cache holds the token at position l, so positions are natural (0, 1, 2, ...), shared
by every row (rows decode in lock step), and RoPE rotates q and k by them as in training.

A prompt too long for one device is prefilled sequence-parallel instead (model/decode.py): its
keys and values stay where the training layout put them, sharded over 'seq', in a
`ShardedCache`. A new token attends to each device's shard there (partial softmax statistics,
combined across 'seq' by log-sum-exp: exact) and to the tokens decoded so far (a small tail,
natural order, on every device), and its own key and value go into that tail.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

import parallel


class KVCache(NamedTuple):
    """One layer's past keys and values, each [B, max_len, kv_heads, head_dim]."""
    k: jax.Array
    v: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LinearCache:
    """A recurrent layer's decoding cache (model/mixers/gated_deltanet.py, model/mixers/mamba2.py): the state
    S [B, H, dk, dv] (Mamba2's [B, H, N, P]) float32 after the tokens so far, and the convolution's last K - 1 inputs [B, K - 1,
    C] (zeros before the first token). Its size does not depend on the length."""

    state: jax.Array
    conv: jax.Array


def _scores(q, k, scale, logit_soft_cap):
    """Float32 scores [B, K, G, T, L] of q [B, T, H, Dh] against k [B, L, K, Dh] (GQA: G query
    heads per KV head): scaled (1 / sqrt(Dh) by default), soft-capped when asked, as
    parallel.attention scores them."""
    b, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(b, t, kv_heads, heads // kv_heads, dim)
    s = jnp.einsum("bthgd,blhd->bhgtl", grouped, k, preferred_element_type=jnp.float32)
    s = s * (dim ** -0.5 if scale is None else scale)
    if logit_soft_cap:
        s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
    return s


def _in_window(query_pos, key_pos, window):
    """Whether keys at key_pos are inside the sliding window of queries at query_pos (both
    broadcast; causality is checked by the caller): query - key < window."""
    return True if window is None else query_pos - key_pos < window


def _sink_stats(sinks, kv_heads):
    """The sinks [H] as a partial softmax of one key with no value: (max, sum, out) in the
    [B, K, G, T] layout `_partial` returns, to merge with the keys' own."""
    m = sinks.astype(jnp.float32).reshape(1, kv_heads, -1, 1)
    return m, jnp.ones_like(m), jnp.zeros((*m.shape, 1), jnp.float32)


def attend_cached(q, k, v, positions, cache: KVCache, window=None, sinks=None,
                  logit_soft_cap=None, scale=None):
    """Writes k, v [B, T, K, Dh] into the cache at positions[0] and attends q [B, T, H, Dh] to
    the cache: query t sees slots 0 .. positions[:, t] (those inside `window` of it, with one).
    Softmax in float32, with the layer's sinks, soft cap and scale (parallel.attention's
    meanings). Returns (out [B, T, H, Dh] in q's dtype, the updated cache)."""
    start = positions[0, 0]
    cache = KVCache(*(jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), start, 1)
                      for c, x in ((cache.k, k), (cache.v, v))))
    b, t, heads, dim = q.shape
    slots = jnp.arange(cache.k.shape[1])
    query = positions[:, :, None]
    visible = (slots <= query) & _in_window(query, slots, window)  # [B, T, L]
    stats = _partial(q, cache.k, cache.v, visible, scale, logit_soft_cap)
    if sinks is not None:
        stats = _merge(stats, _sink_stats(sinks, cache.k.shape[2]))
    _, l, out = stats
    out = out / l[..., None]  # [B, K, G, T, Dh]
    return jnp.moveaxis(out, 3, 1).reshape(b, t, heads, -1).astype(q.dtype), cache


class ShardedCache(NamedTuple):
    """One layer's cache after a sequence-parallel prefill. k, v [B, S, K, Dh] and
    slot_positions [B, S] (each slot's original position; -1 for padding) are in the layout's
    order, sharded over 'seq'; tail_k, tail_v [B, max_new, K, Dh] hold the decoded tokens,
    slot i the token at position lengths[b] + i; lengths [B] are the prompts' lengths."""
    k: jax.Array
    v: jax.Array
    slot_positions: jax.Array
    tail_k: jax.Array
    tail_v: jax.Array
    lengths: jax.Array


def _partial(q, k, v, visible, scale=None, logit_soft_cap=None):
    """Softmax statistics of q [B, T, H, Dh] over keys k, v [B, L, K, Dh] where visible
    [B, T, L]: (max [B, K, G, T], sum of exp [B, K, G, T], unnormalised out [B, K, G, T, Dh]),
    float32; an all-hidden row has max -inf, sum 0, out 0."""
    s = _scores(q, k, scale, logit_soft_cap)
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)[..., None])
    out = jnp.einsum("bhgtl,blhd->bhgtd", p.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return m, jnp.sum(p, axis=-1), out


def _merge(a, b):
    """Two partial softmaxes over disjoint keys -> one (exact)."""
    (ma, la, oa), (mb, lb, ob) = a, b
    m = jnp.maximum(ma, mb)
    safe = jnp.where(jnp.isfinite(m), m, 0.0)
    wa, wb = jnp.exp(ma - safe), jnp.exp(mb - safe)
    return m, la * wa + lb * wb, oa * wa[..., None] + ob * wb[..., None]


def attend_sharded(q, k, v, positions, cache: ShardedCache, mesh, window=None, sinks=None,
                   logit_soft_cap=None, scale=None):
    """New tokens q, k, v [B, T, ...] at positions [B, T] (each row's lengths[b] + i ..) against
    the prompt's sharded keys and the decoded tail; their k, v go into the tail at i. window,
    sinks, soft cap and scale as attend_cached. Returns (out [B, T, H, Dh], the updated
    cache)."""
    index = positions[0, 0] - cache.lengths[0]  # the same tail slot in every row (lock step)
    tail_k, tail_v = (jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), index, 1)
                      for c, x in ((cache.tail_k, k), (cache.tail_v, v)))
    cache = cache._replace(tail_k=tail_k, tail_v=tail_v)
    rows, seq = jax.P(parallel.DATA), jax.P(parallel.DATA, parallel.SEQ)

    @jax.shard_map(mesh=mesh, in_specs=(rows, seq, seq, seq, rows, rows), out_specs=rows)
    def prompt_part(q, k, v, slot_positions, lengths, positions):
        valid = (slot_positions >= 0) & (slot_positions < lengths[:, None])  # [B, s]
        visible = valid[:, None] & _in_window(positions[:, :, None], slot_positions[:, None],
                                               window)
        m, l, out = _partial(q, k, v, jnp.broadcast_to(visible, (*q.shape[:2], valid.shape[1])),
                             scale, logit_soft_cap)
        top = jax.lax.pmax(m, parallel.SEQ)
        w = jnp.exp(m - jnp.where(jnp.isfinite(top), top, 0.0))
        return (top, jax.lax.psum(l * w, parallel.SEQ),
                jax.lax.psum(out * w[..., None], parallel.SEQ))

    b, t, heads, dim = q.shape
    slots = jnp.arange(cache.tail_k.shape[1])[None, None]
    query = index + jnp.arange(t)[None, :, None]  # the tail slot of each new token
    decoded = (slots <= query) & _in_window(query, slots, window)
    stats = _merge(prompt_part(q, cache.k, cache.v, cache.slot_positions, cache.lengths,
                               positions),
                   _partial(q, tail_k, tail_v, jnp.broadcast_to(decoded, (b, t, slots.shape[-1])),
                            scale, logit_soft_cap))
    if sinks is not None:
        stats = _merge(stats, _sink_stats(sinks, cache.k.shape[2]))
    _, l, out = stats
    out = out / l[..., None]  # [B, K, G, T, Dh]
    return jnp.moveaxis(out, 3, 1).reshape(b, t, heads, -1).astype(q.dtype), cache
