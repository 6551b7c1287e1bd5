"""Sequence-parallel attention: the ring loop over the mesh's 'seq' axis, forward and backward.

Each device keeps its query block; key/value blocks (KV heads only) and their segment ids travel
one hop along the ring per step with `lax.ppermute`, so on step s device d holds the block that
started on device (d - s) mod N. The next hop is issued before the step's compute so that the
transfer can overlap it.

The backward is a second ring pass (`jax.custom_vjp`): dK and dV accumulate in float32, travel
with their K and V blocks and arrive home after N hops; dQ stays local. Residuals are the local
q, k, v, the output and the float32 log-sum-exp: O(seq / N) per device.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from parallel import layouts, tiles
from parallel.mesh import DATA, SEQ

F32 = jnp.float32
MAX_DEFAULT_TILE = 512  # large enough for efficient matmuls, small enough to skip masked work


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """Everything static about one attention call (hashable: used as a custom_vjp nondiff arg)."""

    mesh: Mesh
    kind: str
    tiles: tiles.TileSpec

    @property
    def num_shards(self) -> int:
        return self.mesh.shape[SEQ]


def _positions(spec: RingSpec, shard, block):
    return layouts.block_positions(spec.kind, shard, block, spec.num_shards, xp=jnp)


def _ring_steps_before_last(num_shards):
    """N - 1, hidden from XLA's constant folding.

    With a visible trip count of 1 (N = 2) XLA inlines the loop and lays out buffers differently
    from every other N; behind the barrier the program, and its memory, is the same for all N.
    """
    return lax.optimization_barrier(jnp.int32(num_shards - 1))


def _send_to_next(tree, num_shards):
    """Moves every array in `tree` one hop along the ring: device d -> d + 1."""
    if num_shards == 1:
        return tree
    pairs = [(i, (i + 1) % num_shards) for i in range(num_shards)]
    return jax.tree.map(lambda x: lax.ppermute(x, SEQ, pairs), tree)


def _ring_forward_local(spec: RingSpec, q, k, v, seg):
    """Per-device forward. q [b,n,H,d]; k, v [b,n,h,d]; seg [b,n] or None.

    Returns out [b,n,H,d] (q.dtype), lse [b,h,g,n] f32, tiles per step [1,1,N] int32.
    """
    b, n, num_q_heads, dim = q.shape
    kv_heads, num_shards, ts = k.shape[2], spec.num_shards, spec.tiles
    q = q.reshape(b, n, kv_heads, num_q_heads // kv_heads, dim)
    me = lax.axis_index(SEQ)
    q_pos = _positions(spec, me, n)

    def step(s, block, acc):
        k_s, v_s, seg_s = block
        k_pos = _positions(spec, (me - s) % num_shards, n)
        return tiles.forward_block(q, k_s, v_s, q_pos, k_pos, seg, seg_s, acc, ts)

    def body(s, carry):
        block, acc, counts = carry
        arriving = _send_to_next(block, num_shards)  # issued first: overlaps this step's compute
        acc, count = step(s, block, acc)
        return arriving, acc, counts.at[s].set(count)

    stat_shape = (b, kv_heads, q.shape[3], n)
    acc = tiles.varying((jnp.zeros(q.shape, F32), jnp.full(stat_shape, -jnp.inf, F32),
                         jnp.zeros(stat_shape, F32)), ts)
    counts = tiles.varying(jnp.zeros((num_shards,), jnp.int32), ts)
    block, acc, counts = lax.fori_loop(0, _ring_steps_before_last(num_shards), body, ((k, v, seg), acc, counts))
    (o, m, l), count = step(num_shards - 1, block, acc)  # last step: nothing left to send
    counts = counts.at[num_shards - 1].set(count)

    seen = l > 0  # rows with no visible key anywhere: output 0, lse -inf
    out = o / jnp.moveaxis(jnp.where(seen, l, 1.0), 3, 1)[..., None]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
    return out.reshape(b, n, num_q_heads, dim).astype(q.dtype), lse, counts[None, None]


def _ring_backward_local(spec: RingSpec, q, k, v, seg, out, lse, dout):
    """Per-device backward pass: returns dq, dk, dv in the input dtypes."""
    b, n, num_q_heads, dim = q.shape
    kv_heads, num_shards, ts = k.shape[2], spec.num_shards, spec.tiles
    groups = num_q_heads // kv_heads
    q5 = q.reshape(b, n, kv_heads, groups, dim)
    do5 = dout.reshape(q5.shape)
    # D = rowsum(dO * O), with the global output O: [b, h, g, n] f32.
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", do5.astype(F32), out.reshape(q5.shape).astype(F32))
    me = lax.axis_index(SEQ)
    q_pos = _positions(spec, me, n)

    def step(s, block, grads):
        (k_s, v_s, seg_s), (dk, dv), dq = block, grads[1:], grads[0]
        k_pos = _positions(spec, (me - s) % num_shards, n)
        return tiles.backward_block(q5, k_s, v_s, do5, lse, delta, q_pos, k_pos, seg, seg_s,
                                    (dq, dk, dv), ts)

    def body(s, carry):
        block, dq, dkv = carry
        arriving = _send_to_next(block, num_shards)
        dq, dk, dv = step(s, block, (dq, *dkv))
        return arriving, dq, _send_to_next((dk, dv), num_shards)

    dq = tiles.varying(jnp.zeros(q5.shape, F32), ts)
    dkv = tiles.varying((jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32)), ts)
    block, dq, dkv = lax.fori_loop(0, _ring_steps_before_last(num_shards), body, ((k, v, seg), dq, dkv))
    dq, dk, dv = step(num_shards - 1, block, (dq, *dkv))
    dk, dv = _send_to_next((dk, dv), num_shards)  # the last hop brings dK, dV home
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# Partition specs of the global arrays.
_QKV = P(DATA, SEQ, None, None)
_SEG = P(DATA, SEQ)
_LSE = P(DATA, None, None, SEQ)
_COUNTS = P(DATA, SEQ, None)


def _sharded(fn, spec: RingSpec, in_specs, out_specs):
    mapped = jax.shard_map(functools.partial(fn, spec), mesh=spec.mesh, in_specs=in_specs,
                           out_specs=out_specs)
    return lambda *args: mapped(*(_place(x, spec.mesh, s) for x, s in zip(args, in_specs)))


def _place(x, mesh: Mesh, spec: P):
    """Puts x in the layout shard_map expects, whatever the caller's sharding (or none).

    On a mesh with Explicit axes (jax.make_mesh's default) shard_map insists on inputs typed
    with exactly these specs, so they are resharded; on Auto axes a constraint suffices."""
    sharding = jax.sharding.NamedSharding(mesh, spec)
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(x, sharding)
    return lax.with_sharding_constraint(x, sharding)


@functools.partial(jax.jit, static_argnums=0)
def _forward(spec: RingSpec, q, k, v, seg):
    if seg is None:
        fn = _sharded(lambda sp, q, k, v: _ring_forward_local(sp, q, k, v, None), spec,
                      (_QKV,) * 3, (_QKV, _LSE, _COUNTS))
        return fn(q, k, v)
    fn = _sharded(_ring_forward_local, spec, (_QKV,) * 3 + (_SEG,), (_QKV, _LSE, _COUNTS))
    return fn(q, k, v, seg)


@functools.partial(jax.jit, static_argnums=0)
def _backward(spec: RingSpec, q, k, v, seg, out, lse, dout):
    if seg is None:
        fn = _sharded(lambda sp, q, k, v, *rest: _ring_backward_local(sp, q, k, v, None, *rest),
                      spec, (_QKV,) * 3 + (_QKV, _LSE, _QKV), (_QKV,) * 3)
        return fn(q, k, v, out, lse, dout)
    fn = _sharded(_ring_backward_local, spec, (_QKV,) * 3 + (_SEG, _QKV, _LSE, _QKV),
                  (_QKV,) * 3)
    return fn(q, k, v, seg, out, lse, dout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring_attention(spec, q, k, v, seg):
    return _forward(spec, q, k, v, seg)[0]


def _ring_attention_fwd(spec, q, k, v, seg):
    out, lse, _ = _forward(spec, q, k, v, seg)
    return out, (q, k, v, seg, out, lse)


def _ring_attention_bwd(spec, residuals, dout):
    q, k, v, seg, out, lse = residuals
    dq, dk, dv = _backward(spec, q, k, v, seg, out, lse, dout)
    seg_ct = None if seg is None else np.zeros(seg.shape, jax.dtypes.float0)
    return dq, dk, dv, seg_ct


_ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)


def default_tile(kind: str, block: int) -> int:
    """Largest divisor of the layout's contiguous run (block, or half a block for zigzag) that is
    at most MAX_DEFAULT_TILE, so tiles never straddle the jump between zigzag's two chunks."""
    run = block // 2 if kind == "zigzag" else block
    return max(t for t in range(1, min(run, MAX_DEFAULT_TILE) + 1) if run % t == 0)


def _check_inputs(q, k, v, segment_ids, mesh, kind):
    layouts.check_kind(kind)
    if not isinstance(mesh, Mesh) or set(mesh.axis_names) != {DATA, SEQ}:
        raise ValueError("mesh must be a ('data', 'seq') mesh: build it with parallel.make_mesh")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, seq, heads, head_dim]; got shapes {q.shape}, {k.shape}, "
            f"{v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {q.shape} and k/v {k.shape} must agree in batch, seq and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")
    batch, seq_len = q.shape[:2]
    if segment_ids is not None:
        if segment_ids.shape != (batch, seq_len):
            raise ValueError(
                f"segment_ids must be [batch, seq] = {(batch, seq_len)}; got {segment_ids.shape}")
        if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise ValueError(f"segment_ids must be integers; got {segment_ids.dtype}")
    if batch % mesh.shape[DATA]:
        raise ValueError(
            f"batch {batch} is not divisible by the {mesh.shape[DATA]} 'data' shards: "
            f"use a batch that is a multiple of {mesh.shape[DATA]}")
    layouts.check_divisible(kind, seq_len, mesh.shape[SEQ])


def _check_tile(name, tile, block):
    if tile < 1 or block % tile:
        raise ValueError(
            f"{name}={tile} does not divide the per-device block of {block} tokens: "
            f"choose a divisor of {block}")


def make_spec(q, k, v, segment_ids, *, mesh, kind, causal, tile_q, tile_k, scale) -> RingSpec:
    """Validates the arguments of `attention` and gathers the static parameters."""
    _check_inputs(q, k, v, segment_ids, mesh, kind)
    block = q.shape[1] // mesh.shape[SEQ]
    tile_q = default_tile(kind, block) if tile_q is None else int(tile_q)
    tile_k = default_tile(kind, block) if tile_k is None else int(tile_k)
    _check_tile("tile_q", tile_q, block)
    _check_tile("tile_k", tile_k, block)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    precision = lax.Precision.HIGHEST if jnp.dtype(q.dtype) == jnp.float32 else None
    ts = tiles.TileSpec(tile_q=tile_q, tile_k=tile_k, causal=bool(causal), scale=scale,
                        precision=precision, varying_axes=(DATA, SEQ))
    return RingSpec(mesh=mesh, kind=kind, tiles=ts)


def attention(q, k, v, *, mesh, kind, segment_ids=None, causal=True, tile_q=None, tile_k=None,
              scale=None):
    """Exact sequence-parallel attention over the mesh's 'seq' axis.

    Args:
      q: [batch, seq, q_heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim], with
        q_heads % kv_heads == 0 (query head i uses KV head i // (q_heads // kv_heads)).
        The seq axis is in `kind`'s order (see `permutation`); batch is sharded over 'data',
        seq over 'seq'.
      mesh: a ('data', 'seq') mesh from `make_mesh`.
      kind: 'ring' | 'striped' | 'zigzag': the layout the seq axis is in.
      segment_ids: optional [batch, seq] integers, in the same order; tokens attend only within
        their own segment (packed documents).
      causal: mask keys whose original index is after the query's.
      tile_q, tile_k: tile sizes inside each block pair (default: largest divisor of the
        block, or of half a block for zigzag, up to 512).
      scale: score scale (default 1 / sqrt(head_dim)).

    Returns:
      [batch, seq, q_heads, head_dim] in q's dtype, order and sharding. A query with no visible
      key gets 0.
    """
    spec = make_spec(q, k, v, segment_ids, mesh=mesh, kind=kind, causal=causal, tile_q=tile_q,
                     tile_k=tile_k, scale=scale)
    return _ring_attention(spec, q, k, v, segment_ids)


def attention_with_stats(q, k, v, *, mesh, kind, segment_ids=None, causal=True, tile_q=None,
                         tile_k=None, scale=None):
    """`attention`'s forward, plus the work it did.

    Returns (out, tiles): tiles [N, N] int32, tiles[d, s] = number of tile_q x tile_k tiles that
    seq shard d computed on ring step s, counted inside the kernel's own loop (the maximum over
    'data' shards when the batch is sharded, since those may skip different tiles).
    """
    spec = make_spec(q, k, v, segment_ids, mesh=mesh, kind=kind, causal=causal, tile_q=tile_q,
                     tile_k=tile_k, scale=scale)
    out, _, counts = _forward(spec, q, k, v, segment_ids)
    return out, counts.max(axis=0)
