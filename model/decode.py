"""Autoregressive decoding with a KV cache, through the trained Transformer's own modules.

Training attention is sequence-parallel over a layout; decoding appends one token at a time, so
the attention layer takes a cache of every past key and value (natural order) and attends to it
densely (model/kv_cache.py). Everything else (embedding, norms, projections, RoPE, the MLP, the
output head) is the same code the training forward runs:

    cache = init_cache(cfg, batch, max_len)         a KVCache per layer: k, v [B, max_len, K, Dh]
    logits, cache = prefill(model, prompt, cache)   prompt [B, P]: one pass fills cache[:, :P]
    logits, cache = extend(model, tokens, cache, start)   tokens [B, T] at start .. start+T-1

`extend` with T = 1 is one decoding step: each new token costs one pass over the cache, the
prompt is never recomputed. Positions are natural (0, 1, 2, ...) as in training without
per-document resets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.kv_cache import init_cache

__all__ = ["init_cache", "prefill", "extend", "sample_token", "generate"]


def extend(model, tokens, cache, start):
    """Runs tokens [B, T] at positions start .. start+T-1; returns (logits [B, T, V] f32, cache)."""
    positions = jnp.broadcast_to(start + jnp.arange(tokens.shape[1]), tokens.shape)
    return model(tokens, positions, cache=cache)


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
