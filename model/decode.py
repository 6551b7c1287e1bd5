"""Autoregressive decoding with a KV cache, on the trained Transformer's own parameters.

Training attention is sequence-parallel over a layout; decoding appends one token at a time, so it
uses plain dense attention against a cache of every past key and value (natural order):

    cache = init_cache(cfg, batch, max_len)         k, v per layer: [B, max_len, K, Dh]
    logits, cache = prefill(model, prompt, cache)   prompt [B, P]: one pass fills cache[:, :P]
    logits, cache = extend(model, tokens, cache, start)   tokens [B, T] at positions start..start+T-1

`extend` with T = 1 is one decoding step: each new token costs one pass over the cache, the
prompt is never recomputed. Positions are natural (0, 1, 2, ...) as in training without
per-document resets, and RoPE rotates q and k by them exactly as the training model does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.layers import rope


def init_cache(cfg, batch: int, max_len: int):
    """Zeros for every layer's keys and values: a list of (k, v), each [B, max_len, K, Dh]."""
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return [(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))
            for _ in range(cfg.num_layers)]


def _attend(q, k_cache, v_cache, q_positions, scale):
    """Dense causal attention of new queries against the cache.

    q [B, T, H, Dh]; caches [B, L, K, Dh]; query t (position q_positions[t]) sees cache slots
    0..q_positions[t]. Softmax in float32. Returns [B, T, H, Dh].
    """
    b, t, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    q = q.reshape(b, t, kv_heads, heads // kv_heads, dim)
    s = jnp.einsum("bthgd,blhd->bhgtl", q, k_cache, preferred_element_type=jnp.float32) * scale
    visible = jnp.arange(k_cache.shape[1])[None, :] <= q_positions[:, None]  # [T, L]
    s = jnp.where(visible, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bhgtl,blhd->bthgd", p.astype(v_cache.dtype), v_cache,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, t, heads, dim).astype(q.dtype)


def _block(block, x, positions, cache, start):
    """One transformer block on new tokens x [B, T, D]; writes their k, v into the cache."""
    attn, cfg = block.attention, block.attention.cfg
    b, t, _ = x.shape
    h = block.attention_norm(x)
    pos = jnp.broadcast_to(positions[None], (b, t))
    q = rope(attn.q(h).reshape(b, t, cfg.num_heads, cfg.head_dim), pos, cfg.rope_theta)
    k = rope(attn.k(h).reshape(b, t, cfg.num_kv_heads, cfg.head_dim), pos, cfg.rope_theta)
    v = attn.v(h).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    k_cache = jax.lax.dynamic_update_slice_in_dim(cache[0], k.astype(cache[0].dtype), start, 1)
    v_cache = jax.lax.dynamic_update_slice_in_dim(cache[1], v.astype(cache[1].dtype), start, 1)
    out = _attend(q, k_cache, v_cache, positions, cfg.head_dim ** -0.5)
    x = x + attn.o(out.reshape(b, t, cfg.num_heads * cfg.head_dim))
    x = x + block.mlp(block.mlp_norm(x))
    return x, (k_cache, v_cache)


def extend(model, tokens, cache, start):
    """Runs tokens [B, T] at positions start .. start+T-1; returns (logits [B, T, V] f32, cache)."""
    positions = start + jnp.arange(tokens.shape[1])
    x = model.embed(tokens)
    new_cache = []
    for block, layer_cache in zip(model.layers(), cache):
        x, layer_cache = _block(block, x, positions, layer_cache, start)
        new_cache.append(layer_cache)
    return model.logits(model.final_norm(x)), new_cache


def prefill(model, prompt, cache):
    """The whole prompt in one pass: (logits [B, P, V], cache with slots 0..P-1 filled)."""
    return extend(model, prompt, cache, 0)


def sample_token(logits, rng, temperature: float, top_k: int):
    """Next token [B] from logits [B, V]: greedy when temperature == 0, else softmax(logits / T)
    restricted to the top_k most likely tokens (top_k <= 0: all)."""
    if temperature <= 0:
        return jnp.argmax(logits, axis=-1)
    logits = logits / temperature
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1)


def generate(graphdef, params, prompt, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0, eos_id: int | None = None):
    """prompt [B, P] int -> [B, P + max_new_tokens] int (numpy), with a KV cache.

    The prompt is prefilled in one pass; then each step feeds only the newest token. Stops early
    when every row has produced eos_id.
    """
    import numpy as np
    from flax import nnx

    prompt = jnp.asarray(prompt, jnp.int32)
    batch, length = prompt.shape
    cfg = nnx.merge(graphdef, params).cfg

    @jax.jit
    def first(params, prompt, cache):
        logits, cache = prefill(nnx.merge(graphdef, params), prompt, cache)
        return logits[:, -1], cache

    @jax.jit
    def step(params, token, cache, index):
        logits, cache = extend(nnx.merge(graphdef, params), token[:, None], cache, index)
        return logits[:, -1], cache

    pick = jax.jit(lambda logits, rng: sample_token(logits, rng, temperature, top_k))
    cache = init_cache(cfg, batch, length + max_new_tokens)
    logits, cache = first(params, prompt, cache)
    rng = jax.random.key(seed)
    out = [np.asarray(prompt)]
    done = np.zeros(batch, bool)
    for i in range(max_new_tokens):
        rng, key = jax.random.split(rng)
        token = pick(logits, key)
        out.append(np.asarray(token)[:, None])
        if eos_id is not None:
            done |= out[-1][:, 0] == eos_id
            if done.all():
                break
        if i + 1 < max_new_tokens:
            logits, cache = step(params, token, cache, length + i)
    return np.concatenate(out, axis=1)
