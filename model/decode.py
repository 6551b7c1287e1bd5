"""Autoregressive decoding with a KV cache, through the trained Transformer's own modules.

Training attention is sequence-parallel over a layout; decoding appends one token at a time, so
the attention layer takes a cache of every past key and value (natural order) and attends to it
densely (model/mixers/cache.py). Everything else (embedding, norms, projections, RoPE, the MLP, the
output head) is the same code the training forward runs:

    cache = init_cache(cfg, batch, max_len)         a KVCache per layer: k, v [B, max_len, K, Dh]
    logits, cache = prefill(model, prompt, cache)   prompt [B, P]: one pass fills cache[:, :P]
    logits, cache = extend(model, tokens, cache, start)   tokens [B, T] at start .. start+T-1

`extend` with T = 1 is one decoding step: each new token costs one pass over the cache, the
prompt is never recomputed. Positions are natural (0, 1, 2, ...) as in training without
per-document resets.

A prompt longer than one device holds is prefilled sequence-parallel (`generate_sharded`): the
prompts (ragged: each row its own length) are padded, laid out in the model's attention layout
over the mesh's 'seq' axis and run through the training forward, which also hands back every
layer's keys and values where they were computed (a ShardedCache per layer, 1/N of the prompt's
cache on each device). Decoding then attends to those shards, combined exactly by log-sum-exp,
and to the tokens it has added.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import parallel
from model.mixers import init_cache
from model.mixers.cache import LinearCache, ShardedCache

__all__ = ["init_cache", "prefill", "extend", "sample_token", "generate", "lay_out_prompts",
           "generate_sharded", "cache_bytes_per_device"]


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


def lay_out_prompts(prompts, layout: str, num_shards: int) -> dict[str, np.ndarray]:
    """Ragged prompts (a list of id lists) -> the prefill's fields in the layout's order, [B, S]:
    'inputs', 'positions', 'segment_ids' (1 marks the padding after a prompt), 'order', and
    'lengths' [B]. S is the shortest length >= the longest prompt that the layout splits over
    num_shards devices."""
    lengths = np.array([len(p) for p in prompts], np.int32)
    if not len(lengths) or lengths.min() < 1:
        raise ValueError("every prompt needs at least one token")
    size = int(lengths.max())
    while True:
        try:
            parallel.check_divisible(layout, size, num_shards)
            break
        except ValueError:
            size += 1
    tokens = np.zeros((len(prompts), size), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, :len(prompt)] = prompt
    positions = np.broadcast_to(np.arange(size, dtype=np.int32), tokens.shape)
    segment_ids = (positions >= lengths[:, None]).astype(np.int32)
    order = np.asarray(parallel.row_order(layout, segment_ids, num_shards), np.int32)
    take = lambda x: np.take_along_axis(x, order, axis=1)  # noqa: E731
    return {"inputs": take(tokens), "positions": take(positions),
            "segment_ids": take(segment_ids), "order": order, "lengths": lengths}


def cache_bytes_per_device(caches) -> tuple[int, int]:
    """(bytes the first device holds, bytes in all) of a list of caches."""
    leaves = jax.tree.leaves(caches)
    first = jax.devices()[0]
    held = sum(s.data.nbytes for x in leaves for s in x.addressable_shards if s.device == first)
    return held, sum(x.nbytes for x in leaves)


def generate_sharded(graphdef, params, prompts, max_new_tokens: int, mesh, *,
                     temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                     eos_id: int | None = None, report=None):
    """Ragged prompts (lists of ids) -> each row's prompt + new tokens (a list of numpy arrays),
    the prompts prefilled sequence-parallel over mesh's 'seq' axis in the model's layout and
    decoded against the sharded cache. report(prefill_caches): called once after the prefill
    (sample.py prints the cache size per device)."""
    layout = nnx.merge(graphdef, params).choice.layout
    fields = lay_out_prompts(prompts, layout, mesh.shape[parallel.SEQ])
    lengths = fields.pop("lengths")
    sharding = jax.NamedSharding(mesh, jax.P(parallel.DATA, parallel.SEQ))
    laid = {k: jax.device_put(v, sharding) for k, v in fields.items()}
    batch = len(prompts)

    @jax.jit
    def first(params, laid, lengths):
        model = nnx.merge(graphdef, params)
        hidden, kv = model.prefill(laid["inputs"], laid["positions"], laid["segment_ids"],
                                   laid["order"])
        last = jnp.argmax(laid["order"] == (lengths[:, None] - 1), axis=1)  # each row's slot
        logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1))[:, 0]
        slots = jnp.where(laid["segment_ids"] == 0, laid["positions"], -1)
        tail = lambda x: jnp.zeros((batch, max(max_new_tokens, 1), *x.shape[2:]),  # noqa: E731
                                   x.dtype)  # the keys' and values' own heads and widths
        # a Gated DeltaNet layer's cache is its state after the prompt (LinearCache) as it is
        caches = [c if isinstance(c, LinearCache) else
                  ShardedCache(c.k, c.v, slots, tail(c.k), tail(c.v), lengths) for c in kv]
        return logits, caches

    @functools.partial(jax.jit, donate_argnums=2)  # the caches: updated in place, not copied
    def step(params, token, caches, index, lengths):
        positions = lengths[:, None] + index
        logits, caches = nnx.merge(graphdef, params)(token[:, None], positions, cache=caches)
        return logits[:, -1], caches

    pick = jax.jit(lambda logits, rng: sample_token(logits, rng, temperature, top_k))
    with jax.set_mesh(mesh):
        logits, caches = first(params, laid, jnp.asarray(lengths))
        if report is not None:
            report(caches)
        rng, new, done = jax.random.key(seed), [], np.zeros(batch, bool)
        for i in range(max_new_tokens):
            rng, key = jax.random.split(rng)
            token = pick(logits, key)
            new.append(np.asarray(token))
            if eos_id is not None:
                done |= new[-1] == eos_id
                if done.all():
                    break
            if i + 1 < max_new_tokens:
                logits, caches = step(params, token, caches, i, jnp.asarray(lengths))
    added = np.stack(new, axis=1) if new else np.zeros((batch, 0), np.int32)
    return [np.concatenate([np.asarray(p, np.int32), added[row]])
            for row, p in enumerate(prompts)]
