"""A Gated DeltaNet layer's rule over the 'seq' devices: the two strategies of
parallel.linear_strategy (a run's AttentionChoice.linear_strategy; planner/linear_strategy.py
prices them for 'auto').

    'state'  each device scans its contiguous block of the row from a zero state and the devices
             pass states (gated_delta.pass_states: an all-gather of H (dk^2 + dk dv) numbers a
             row per device, whatever the length); the convolution's first taps read the
             previous device's last conv_kernel - 1 inputs (a halo). A layout whose devices do
             not hold contiguous blocks (striped, zigzag, balanced) reaches them and comes back
             with an all-to-all each way (parallel/contiguous.py).
    'heads'  an all-to-all gives each device the whole row for num_key_heads / N key heads
             (their q, k, their value heads' v, decays and betas: Ulysses for the recurrence),
             which it scans alone in the original order; one all-to-all brings the outputs
             back. What moves grows with the length; the key heads cap the degree.

Both take the convolution's inputs `mixed` [B, S, C] (q | k | v channels), g, beta [B, S, Hv],
segment ids [B, S] and the batch's order, in the layout's order and sharded ('data', 'seq'), and
return (o [B, S, Hv, dv] in the layout's order, the state after each whole row [B, Hv, dk, dv]):
exact, forward and backward (tests/test_linear_attention.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

import parallel
from model.gated_delta import gated_delta_rule, pass_states
from model.short_conv import causal_conv, halo
from parallel.contiguous import from_blocks, local_positions, to_blocks

TOKENS = jax.P(parallel.DATA, parallel.SEQ)
CHANNELS = jax.P(parallel.DATA, parallel.SEQ, None)
OUT = (jax.P(parallel.DATA, parallel.SEQ, None, None), jax.P(parallel.DATA))


def check_heads(num_key_heads: int, num_shards: int) -> None:
    """ValueError, one line, where 'heads' cannot split the layers' key heads evenly."""
    if num_key_heads % num_shards:
        raise ValueError(
            f"parallel.linear_strategy='heads' splits the Gated DeltaNet layers' {num_key_heads} "
            f"key heads over {num_shards} 'seq' devices, which does not divide them: set "
            f"parallel.linear_strategy='state' (or 'auto')")


def by_state(mixed, g, beta, seg, order, conv, la, layout: str, mesh, heads_of):
    """'state' (module docstring). heads_of(mixed, la) -> q, k, v [b, n, Hv, d]: the layer's
    normalisation of the convolution's output."""
    count = mesh.shape[parallel.SEQ]
    block = mixed.shape[1] // count
    reorder = layout != "ring"

    def local(mixed, g, beta, seg, conv, order):
        if reorder:
            pos = local_positions(layout, order, block, count)
            mixed, g, beta, seg = (to_blocks(t, pos) for t in (mixed, g, beta, seg))
        mixed = causal_conv(mixed, conv, seg, before=halo(mixed, seg, conv.shape[0] - 1))
        q, k, v = heads_of(mixed, la)
        o, final = pass_states(q, k, v, g, beta, seg, chunk=la.chunk_size)
        return (from_blocks(o, pos) if reorder else o), final

    return _over_devices(local, mesh, order)(mixed, g, beta, seg, conv, order)


def by_heads(mixed, g, beta, seg, order, conv, la, layout: str, mesh, heads_of):
    """'heads' (module docstring)."""
    count = mesh.shape[parallel.SEQ]
    check_heads(la.num_key_heads, count)
    hk, dk = la.num_key_heads, la.key_head_dim
    group = la.num_value_heads // hk
    width = 2 * dk + group * la.value_head_dim  # a key head's channels
    mine = dataclasses.replace(la, num_key_heads=hk // count,
                               num_value_heads=la.num_value_heads // count)
    block = mixed.shape[1] // count

    def local(mixed, g, beta, seg, conv, order):
        b, n, _ = mixed.shape
        packed = jnp.concatenate([by_key_head(mixed, hk, dk), g.reshape(b, n, hk, group),
                                  beta.reshape(b, n, hk, group)], axis=-1)
        packed = lax.all_to_all(packed, parallel.SEQ, 2, 1, tiled=True)  # [b, S, hk / N, w]
        pos = lax.all_gather(local_positions(layout, order, block, count), parallel.SEQ,
                             axis=1, tiled=True)  # [b or 1, S]: each slot's original index
        slots = jnp.argsort(pos, axis=1)  # each original index's slot
        packed = _take(packed, slots)
        seg = _take(lax.all_gather(seg, parallel.SEQ, axis=1, tiled=True), slots)
        s = packed.shape[1]
        taps = lax.dynamic_slice_in_dim(by_key_head(conv, hk, dk),
                                        lax.axis_index(parallel.SEQ) * mine.num_key_heads,
                                        mine.num_key_heads, 1)
        mixed = causal_conv(from_key_heads(packed[..., :width], dk), from_key_heads(taps, dk), seg)
        q, k, v = heads_of(mixed, mine)
        o, final = gated_delta_rule(q, k, v, packed[..., width:width + group].reshape(b, s, -1),
                                    packed[..., width + group:].reshape(b, s, -1),
                                    la.chunk_size, segment_ids=seg)
        o = _take(o, pos)  # back in the layout's order
        o = lax.all_to_all(o, parallel.SEQ, 1, 2, tiled=True)  # [b, n, Hv, dv]
        return o, lax.all_gather(final, parallel.SEQ, axis=1, tiled=True)

    return _over_devices(local, mesh, order)(mixed, g, beta, seg, conv, order)


def _over_devices(local, mesh, order):
    return jax.shard_map(
        local, mesh=mesh, check_vma=False,
        in_specs=(CHANNELS, CHANNELS, CHANNELS, TOKENS, jax.P(),
                  None if order is None else TOKENS), out_specs=OUT)


def by_key_head(x, hk: int, dk: int):
    """Channels q | k | v [..., 2 hk dk + hk group dv] (the convolution's inputs, its taps) ->
    per key head [..., hk, 2 dk + group dv]: its q, its k, its value heads' v."""
    lead = x.shape[:-1]
    q = x[..., :hk * dk].reshape(*lead, hk, dk)
    k = x[..., hk * dk:2 * hk * dk].reshape(*lead, hk, dk)
    v = x[..., 2 * hk * dk:].reshape(*lead, hk, -1)
    return jnp.concatenate([q, k, v], axis=-1)


def from_key_heads(x, dk: int):
    """by_key_head undone: [..., h, 2 dk + group dv] -> q | k | v channels [..., C]."""
    lead = x.shape[:-2]
    return jnp.concatenate([x[..., :dk].reshape(*lead, -1), x[..., dk:2 * dk].reshape(*lead, -1),
                            x[..., 2 * dk:].reshape(*lead, -1)], axis=-1)


def _take(x, index):
    """x [b, S, ...] at index [b or 1, S] along the sequence."""
    index = jnp.broadcast_to(index, x.shape[:2])
    return jnp.take_along_axis(x, index.reshape(*index.shape, *(1,) * (x.ndim - 2)), axis=1)
