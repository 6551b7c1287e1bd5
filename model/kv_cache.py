"""The attention layer's decoding path: dense attention against a cache of past keys and values.

Training attends over a whole sequence sharded over the 'seq' axis (parallel.attention, in a
layout's order). Decoding appends a few tokens at a time to one sequence per row, in natural
order, so each new query attends densely to every cached key before it; the layer writes the new
keys and values into its cache and returns the updated cache:

    cache = init_cache(cfg, batch=2, max_len=64)      # one KVCache per layer, zeros
    logits, cache = model(tokens, positions, cache=cache)   # positions [B, T]: where they go

Slot l of a cache holds the token at position l, so positions are natural (0, 1, 2, ...), shared
by every row (rows decode in lock step), and RoPE rotates q and k by them as in training.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """One layer's past keys and values, each [B, max_len, kv_heads, head_dim]."""
    k: jax.Array
    v: jax.Array


def init_cache(cfg, batch: int, max_len: int) -> list[KVCache]:
    """Zeros for every layer's keys and values, in the compute dtype."""
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return [KVCache(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))
            for _ in range(cfg.num_layers)]


def attend_cached(q, k, v, positions, cache: KVCache):
    """Writes k, v [B, T, K, Dh] into the cache at positions[0] and attends q [B, T, H, Dh] to
    the cache: query t sees slots 0 .. positions[:, t]. Softmax in float32.
    Returns (out [B, T, H, Dh] in q's dtype, the updated cache)."""
    start = positions[0, 0]
    cache = KVCache(*(jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), start, 1)
                      for c, x in ((cache.k, k), (cache.v, v))))
    b, t, heads, dim = q.shape
    kv_heads = cache.k.shape[2]
    grouped = q.reshape(b, t, kv_heads, heads // kv_heads, dim)  # GQA: query heads per kv head
    s = jnp.einsum("bthgd,blhd->bhgtl", grouped, cache.k,
                   preferred_element_type=jnp.float32) * dim ** -0.5
    visible = jnp.arange(cache.k.shape[1]) <= positions[:, :, None]  # [B, T, L]
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bhgtl,blhd->bthgd", p.astype(cache.v.dtype), cache.v,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, t, heads, dim).astype(q.dtype), cache
