"""`allgather`: every device gathers the whole key/value sequence, then attends to it by blocks.

Forward: one `all_gather` over 'seq' brings every device's K, V (KV heads only, head-major),
segment ids and original positions. The device first runs its query block against its own key
block, which needs nothing from the gather (XLA may overlap the two), then against the other
N - 1 blocks in the ring's order: on step s the block that started on device (d - s) mod N. So
the kernel, its tile skipping and the tile counts per step are exactly the ring's; only the
transport differs (one collective of (N - 1) / N of the sequence instead of N - 1 hops).

Backward: K/V are gathered again (not kept: residuals stay O(S / N)), dK and dV of every block
accumulate in float32 in a [b, h, S, d] buffer, and one `psum_scatter` over 'seq' sums the N
devices' contributions and returns each its own block's. dQ stays local.

Memory: the gathered K/V (2 b S h d in the input dtype, plus ids) and, in the backward, the
float32 dK/dV buffer (8 b S h d): O(S) per device, against the ring's O(S / N).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from parallel import strategy_cost
from parallel.kernels.base import varying
from parallel.mesh import SEQ
from parallel.strategies import base


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
        gathered = _gather(local, n_shards)  # issued before the local block's compute
        step = functools.partial(base.forward_step, spec, qh, q_pos, seg)
        acc, count = step(local, base.empty_result(qh, spec.tiles, sinks))
        counts = varying(jnp.zeros((n_shards,), jnp.int32), spec.tiles).at[0].set(count)

        def body(s, carry):
            acc, counts = carry
            acc, count = step(_pick(gathered, _source(s, n_shards)), acc)
            return acc, counts.at[s].set(count)

        if n_shards > 1:
            acc, counts = lax.fori_loop(1, n_shards, body, (acc, counts))
        out, lse = acc
        return base.from_heads(out).astype(q.dtype), lse, counts

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        n_shards = spec.num_shards
        qh, doh = base.to_heads(q), base.to_heads(dout)
        delta = base.delta_rows(out, dout)
        q_pos = base.positions(spec, order, *q.shape[:2])
        gathered = _gather(base.key_block(k, v, seg, q_pos), n_shards)
        kh = gathered[0]
        dq = varying(jnp.zeros(qh.shape, jnp.float32), spec.tiles)
        dkv = varying(jnp.zeros((2, *kh.shape), jnp.float32), spec.tiles)  # [2, N, b, h, n, d]

        def body(s, carry):
            dq, dkv = carry
            src = _source(s, n_shards)
            k_s, v_s, seg_s, k_pos = _pick(gathered, src)
            ddq, ddk, ddv = base.pair_backward(spec, qh, k_s, v_s, doh, lse, delta, q_pos,
                                               k_pos, seg, seg_s)
            dkv = dkv.at[0, src].set(ddk).at[1, src].set(ddv)  # each block is met once
            return dq + ddq, dkv

        dq, dkv = lax.fori_loop(0, n_shards, body, (dq, dkv))
        if n_shards > 1:  # sum every device's share of block i onto device i
            dkv = lax.psum_scatter(dkv, SEQ, scatter_dimension=1, tiled=True)
        dk, dv = dkv[0, 0], dkv[1, 0]
        return (base.from_heads(dq).astype(q.dtype), base.from_heads(dk).astype(k.dtype),
                base.from_heads(dv).astype(v.dtype))


    def cost(self, shape, net, degree, documents=None, step_counts=None):
        """Nothing to wait for once gathered: the busiest device's whole work, its own block
        overlapping the all-gather; dK/dV reduce-scattered after the backward."""
        _, kv, dkv = strategy_cost.block_bytes(shape, shape.kv_heads)
        counts = strategy_cost.step_counts(shape, documents, given=step_counts)
        tile_s, n = strategy_cost.tile_seconds(shape, net), shape.num_shards
        work = counts.sum(axis=2).max(axis=1).mean() * tile_s
        own = counts[:, :, 0].max(axis=1).mean() * tile_s
        gather, scatter = net.collective((n - 1) * kv), net.collective((n - 1) * dkv)
        return {"forward_s": max(own, gather) + work - own,
                "backward_s": gather + 2 * work + scatter,
                "bytes_sent": (n - 1) * (2 * kv + dkv), "buffer_bytes": n * (kv + dkv),
                "compute_s": float(work)}


STRATEGY = AllGather()
