"""`ring`: key/value blocks travel around the 'seq' axis with `lax.ppermute`, N steps.

Each device keeps its query block; on step s device d holds the key/value block (KV heads only,
head-major, with its segment ids and original positions) that started on device
(d - s) mod N. The next hop is issued
before the step's compute so that the transfer can overlap it; the forward's last step sends
nothing.

The backward is a second ring pass: dK and dV accumulate in float32, travel with their K and V
blocks and arrive home after N hops; dQ stays local. Residuals are the local q, k, v, the output
and the float32 log-sum-exp: O(S / N) per device whatever N.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from parallel.mesh import SEQ
from parallel.strategies import base
from parallel.kernels.base import varying


def _hidden(steps):
    """A loop's trip count, hidden from XLA's constant folding.

    With a visible trip count of 1 (N = 2) XLA inlines the loop and lays out buffers differently
    from every other N; behind the barrier the program, and its memory, is the same for all N.
    """
    return lax.optimization_barrier(jnp.int32(steps))


def _send_to_next(tree, num_shards):
    """Moves every array in `tree` one hop along the ring: device d -> d + 1."""
    if num_shards == 1:
        return tree
    pairs = [(i, (i + 1) % num_shards) for i in range(num_shards)]
    return jax.tree.map(lambda x: lax.ppermute(x, SEQ, pairs), tree)


class Ring(base.Strategy):
    name = "ring"

    def forward(self, spec, q, k, v, seg, order):
        num_shards = spec.num_shards
        qh = base.to_heads(q)
        q_pos = base.positions(spec, order, *q.shape[:2])

        step = functools.partial(base.forward_step, spec, qh, q_pos, seg)

        def body(s, carry):
            block, acc, counts = carry
            arriving = _send_to_next(block, num_shards)  # issued first: overlaps this step
            acc, count = step(block, acc)
            return arriving, acc, counts.at[s].set(count)

        block = base.key_block(k, v, seg, q_pos)
        counts = varying(jnp.zeros((num_shards,), jnp.int32), spec.tiles)
        acc = base.empty_result(qh, spec.tiles)
        if num_shards > 1:  # (one shard: no loop to compile)
            block, acc, counts = lax.fori_loop(0, _hidden(num_shards - 1), body,
                                               (block, acc, counts))
        (out, lse), count = step(block, acc)  # the last step: nothing left to send
        counts = counts.at[num_shards - 1].set(count)
        return base.from_heads(out).astype(q.dtype), lse, counts

    def backward(self, spec, q, k, v, seg, order, out, lse, dout):
        num_shards = spec.num_shards
        qh, doh = base.to_heads(q), base.to_heads(dout)
        delta = base.delta_rows(out, dout)
        q_pos = base.positions(spec, order, *q.shape[:2])

        def step(block, grads):
            (k_s, v_s, seg_s, k_pos), (dq, dk, dv) = block, grads
            ddq, ddk, ddv = base.pair_backward(spec, qh, k_s, v_s, doh, lse, delta, q_pos, k_pos,
                                               seg, seg_s)
            return dq + ddq, dk + ddk, dv + ddv

        def body(s, carry):
            block, dq, dkv = carry
            arriving = _send_to_next(block, num_shards)
            dq, dk, dv = step(block, (dq, *dkv))
            return arriving, dq, _send_to_next((dk, dv), num_shards)

        block = base.key_block(k, v, seg, q_pos)
        dq = varying(jnp.zeros(qh.shape, jnp.float32), spec.tiles)
        dkv = varying((jnp.zeros(block[0].shape, jnp.float32),) * 2, spec.tiles)
        # N identical steps: the last one also sends its K/V (nobody reads them; the hop overlaps
        # its compute, as every hop does), so the backward kernel is traced and compiled once,
        # not twice. After N hops dK and dV are back on the device that owns their block.
        _, dq, (dk, dv) = lax.fori_loop(0, _hidden(num_shards), body, (block, dq, dkv))
        return (base.from_heads(dq).astype(q.dtype), base.from_heads(dk).astype(k.dtype),
                base.from_heads(dv).astype(v.dtype))


STRATEGY = Ring()
