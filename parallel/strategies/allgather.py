"""`allgather`: every device gathers the whole key/value sequence, then attends to it by blocks.

Forward: one `all_gather` over 'seq' brings every device's K, V (KV heads only, head-major),
segment ids and original positions; the device then runs its query block against the N blocks
in the ring's order: on step s the block that started on device (d - s) mod N, its own first.
So the kernel, its tile skipping and the tile counts per step are exactly the ring's; only the
transport differs (one collective of (N - 1) / N of the sequence instead of N - 1 hops). Its own
block comes from the gathered arrays too, inside the one loop: computing it first from the
local K/V, while the gather ran, overlapped 1 / N of the work but held that step's result and
inputs beside the gathered sequence (0.19 GB a chip more for llama2-7b at 32k on a v5p-128).

Backward: K/V are gathered again (not kept: residuals stay O(S / N)) and met in the same order,
in C passes over key chunks (C = N where the tiles allow: one block's worth of keys per pass): pass
c computes this device's dK/dV for the c-th chunk of every block, float32, into a [2, N, b, h,
n / C, d] buffer, and one `psum_scatter` over 'seq' sums the N devices' shares and hands each its
own block's chunk, while the next pass computes. An all-gather's plain transpose would hold the
whole sequence's dK/dV at once (8 b S h d bytes, twice the gathered K/V: on a v5p at 262,144
tokens over 16 chips, 8.6 GB a layer for llama2-7b); in chunks it is 1 / C of that. dQ stays
local.

Memory: the gathered K/V (2 b S h d in the input dtype, plus ids): O(S) per device, against the
ring's O(S / N); dK/dV O(S / C).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from parallel import strategy_cost
from parallel.kernels.base import varying
from parallel.mesh import SEQ
from parallel.strategies import base
from parallel.strategies.latent_codec import LatentCodec


def _gather(tree, num_shards):
    """Each local array -> [N, ...]: block i is device i's (None stays None)."""
    return tuple(None if x is None else lax.all_gather(x, SEQ, axis=0) if num_shards > 1
                 else x[None] for x in tree)


def _source(step, num_shards):
    """The device whose block is met on `step` (the ring's order): (d - step) mod N."""
    return (lax.axis_index(SEQ) - step) % num_shards


def _pick(gathered, index):
    return tuple(None if x is None else lax.dynamic_index_in_dim(x, index, 0, keepdims=False)
                 for x in gathered)


class AllGather(base.Strategy):
    name = "allgather"

    def forward(self, spec, q, k, v, seg, order, sinks=None):
        n_shards = spec.num_shards
        qh = base.to_heads(q)
        q_pos = base.positions(spec, order, *q.shape[:2])
        local = base.key_block(k, v, seg, q_pos)
        gathered = _gather(local, n_shards)
        step = functools.partial(base.forward_step, spec, qh, q_pos, seg)
        acc = base.empty_result(qh, spec.tiles, sinks)
        counts = varying(jnp.zeros((n_shards,), jnp.int32), spec.tiles)

        def body(s, carry):
            acc, counts = carry
            acc, count = step(_pick(gathered, _source(s, n_shards)), acc)
            return acc, counts.at[s].set(count)

        acc, counts = lax.fori_loop(0, base.trip_count(n_shards), body, (acc, counts))
        out, lse = acc
        return base.from_heads(out).astype(q.dtype), lse, counts

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        n_shards = spec.num_shards
        qh, doh = base.to_heads(q), base.to_heads(dout)
        delta = base.delta_rows(out, dout)
        q_pos = base.positions(spec, order, *q.shape[:2])
        gathered = _gather(base.key_block(k, v, seg, q_pos), n_shards)
        kh = gathered[0]  # [N, b, h, n, d]
        passes = key_passes(kh.shape[3], spec.tiles.tile_k, n_shards)
        width = kh.shape[3] // passes

        def chunk(x, c, axis):  # keys c * width .. (c + 1) * width of a picked block
            return None if x is None else lax.dynamic_slice_in_dim(x, c * width, width, axis)

        def one_pass(c, carry):
            dq, dk, dv = carry

            def body(s, carry):
                dq, dkv = carry
                src = _source(s, n_shards)
                k_s, v_s, seg_s, k_pos = _pick(gathered, src)
                ddq, ddk, ddv = base.pair_backward(
                    spec, qh, chunk(k_s, c, 2), chunk(v_s, c, 2), doh, lse, delta, q_pos,
                    chunk(k_pos, c, 1), seg, chunk(seg_s, c, 1))
                return dq + ddq, dkv.at[0, src].set(ddk).at[1, src].set(ddv)  # met once

            dkv = varying(jnp.zeros((2, n_shards, *kh.shape[1:3], width, kh.shape[4]),
                                    jnp.float32), spec.tiles)
            dq, dkv = lax.fori_loop(0, n_shards, body, (dq, dkv))
            if n_shards > 1:  # every device's share of block i's chunk c onto device i
                dkv = lax.psum_scatter(dkv, SEQ, scatter_dimension=1, tiled=True)
            return (dq, lax.dynamic_update_slice_in_dim(dk, dkv[0, 0], c * width, 2),
                    lax.dynamic_update_slice_in_dim(dv, dkv[1, 0], c * width, 2))

        zeros = jnp.zeros(kh.shape[1:], jnp.float32)
        dq, dk, dv = lax.fori_loop(0, passes, one_pass, varying(
            (jnp.zeros(qh.shape, jnp.float32), zeros, zeros), spec.tiles))
        return (base.from_heads(dq).astype(q.dtype), base.from_heads(dk).astype(k.dtype),
                base.from_heads(dv).astype(v.dtype))

    passes_latents = True

    def latent_forward(self, spec, shape, q, c, k_rope, kv_b, seg, order):
        """The latents gathered, each block expanded as it is met (strategies/latent_codec.py)."""
        n_shards, qh = spec.num_shards, base.to_heads(q)
        q_pos = base.positions(spec, order, *q.shape[:2])
        gathered = _gather((c, k_rope, seg, q_pos), n_shards)
        codec = LatentCodec(kv_b, shape, spec.tiles.precision)
        step = functools.partial(base.forward_step, spec, qh, q_pos, seg, codec=codec)
        out, lse = lax.fori_loop(
            0, base.trip_count(n_shards),
            lambda s, acc: step(_pick(gathered, _source(s, n_shards)), acc)[0],
            base.empty_result(qh, spec.tiles))
        return base.from_heads(out).astype(q.dtype), lse

    def latent_backward(self, spec, shape, q, c, k_rope, kv_b, seg, order, out, lse, dout):
        """One pass over the gathered latents: each block's dc, dk_rope into an [N, ...]
        buffer (the latent's width: a ring step's worth of keys is small here), one
        psum_scatter hands each device its own block's sums; d kv_b stays local."""
        n_shards = spec.num_shards
        qh, doh, delta = base.to_heads(q), base.to_heads(dout), base.delta_rows(out, dout)
        q_pos = base.positions(spec, order, *q.shape[:2])
        gathered = _gather((c, k_rope, seg, q_pos), n_shards)
        codec = LatentCodec(kv_b, shape, spec.tiles.precision)

        def body(s, carry):
            dq, (dc, d_rope), d_kv_b = carry
            src = _source(s, n_shards)
            block = _pick(gathered, src)
            k_s, v_s, seg_s, k_pos = codec.expand(block)
            ddq, ddk, ddv = base.pair_backward(spec, qh, k_s, v_s, doh, lse, delta, q_pos,
                                               k_pos, seg, seg_s)
            (ddc, dd_rope), dd_kv_b = codec.pull(block, ddk, ddv)
            return dq + ddq, (dc.at[src].set(ddc), d_rope.at[src].set(dd_rope)), \
                d_kv_b + dd_kv_b

        zeros = lambda x: jnp.zeros((n_shards, *x.shape), jnp.float32)  # noqa: E731
        carry = varying((jnp.zeros(qh.shape, jnp.float32), (zeros(c), zeros(k_rope)),
                         jnp.zeros(kv_b.shape, jnp.float32)), spec.tiles)
        dq, latent, d_kv_b = lax.fori_loop(0, base.trip_count(n_shards), body, carry)
        if n_shards > 1:  # every device's share of block i onto device i
            latent = tuple(lax.psum_scatter(x, SEQ, scatter_dimension=0, tiled=True)
                           for x in latent)
        return (base.from_heads(dq).astype(q.dtype), latent[0][0], latent[1][0], d_kv_b)

    def cost(self, shape, net, degree, documents=None, step_counts=None):
        """The all-gather, then nothing to wait for: the busiest device's whole work; dK/dV
        reduce-scattered in C pieces, each behind the next pass's compute but the last."""
        _, kv, dkv = strategy_cost.block_bytes(shape, shape.kv_heads)
        counts = strategy_cost.step_counts(shape, documents, given=step_counts)
        n = shape.num_shards
        seconds = strategy_cost.step_seconds(shape, net, counts, shape.pair_tiles)
        work = seconds.sum(axis=2).max(axis=1).mean()
        passes = key_passes(shape.block, shape.tiles[1], n)
        gather, piece = net.collective((n - 1) * kv), net.collective((n - 1) * dkv / passes)
        hidden = min(piece, 2 * work / passes) * (passes - 1)
        return {"forward_s": gather + work,
                "backward_s": gather + 2 * work + passes * piece - hidden,
                "bytes_sent": (n - 1) * (2 * kv + dkv),
                "buffer_bytes": n * kv + 2 * n * dkv / passes, "compute_s": float(work)}


def key_passes(block: int, tile_k: int, num_shards: int) -> int:
    """C, the backward's passes over key chunks: the most, up to N, that split a block into
    whole key tiles (N: each pass's dK/dV buffer is one block's worth)."""
    tiles = block // tile_k
    return max(c for c in range(1, min(num_shards, tiles) + 1) if tiles % c == 0)


STRATEGY = AllGather()
