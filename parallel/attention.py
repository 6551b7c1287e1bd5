"""The public attention functions: checks, the custom VJP, and the shard_map around a strategy.

    attention(q, k, v, *, mesh, layout, ...)             exact attention, differentiable
    attention_with_stats(q, k, v, *, mesh, layout, ...)  (out, tiles[N, N], kv_tokens[N])
    SAVED_BY_NAME                                        what a remat policy saves to keep the
                                                         backward from rerunning the forward

Data path: global [B, S, heads, d] arrays (seq in the layout's order) -> shard_map over the
('data', 'seq') mesh -> the strategy's per-device forward/backward -> the kernel on block pairs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, PartitionSpec as P

from parallel.mesh import DATA, SEQ
from parallel.spec import AttentionSpec, make_spec
from parallel.strategies.base import delta_rows

# Partition specs of the global arrays.
_QKV = P(DATA, SEQ, None, None)
_SEG = P(DATA, SEQ)
_LSE = P(DATA, None, SEQ)  # [B, H, S] float32
_COUNTS = P(DATA, SEQ, None)  # [data, N devices, N steps]
# jax.checkpoint names of the forward's output and its float32 softmax statistics (lse)
SAVED_BY_NAME = ("attention_out", "attention_lse")


def _place(x, mesh: Mesh, spec: P):
    """Puts x in the layout shard_map expects, whatever the caller's sharding (or none).

    On a mesh with Explicit axes (jax.make_mesh's default) shard_map insists on inputs typed
    with exactly these specs, so they are resharded; on Auto axes a constraint suffices."""
    sharding = jax.sharding.NamedSharding(mesh, spec)
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(x, sharding)
    return lax.with_sharding_constraint(x, sharding)


def _sharded(spec: AttentionSpec, fn, args, in_specs, out_specs):
    """Runs fn(*args) per device under shard_map; None arguments (no segment ids) stay None."""
    present = [i for i, a in enumerate(args) if a is not None]

    def local(*xs):
        full = [None] * len(args)
        for i, x in zip(present, xs):
            full[i] = x
        return fn(*full)

    # Types are checked (check_vma) except around a Pallas kernel in interpret mode, whose
    # interpreter mixes its own unvarying indices with the varying blocks (CPU tests only).
    mapped = jax.shard_map(local, mesh=spec.mesh, in_specs=tuple(in_specs[i] for i in present),
                           out_specs=out_specs, check_vma=not spec.tiles.interpret)
    return mapped(*(_place(args[i], spec.mesh, in_specs[i]) for i in present))


@functools.partial(jax.jit, static_argnums=0)
def _forward(spec: AttentionSpec, q, k, v, seg, order, sinks):
    def local(q, k, v, seg, order, sinks):
        out, lse, counts = spec.strategy.forward(spec, q, k, v, seg, order, sinks)
        return out, lse, counts[None, None]
    return _sharded(spec, local, (q, k, v, seg, order, sinks),
                    (_QKV, _QKV, _QKV, _SEG, _SEG, P()), (_QKV, _LSE, _COUNTS))


@functools.partial(jax.jit, static_argnums=0)
def _backward(spec: AttentionSpec, q, k, v, seg, order, out, lse, dout):
    local = functools.partial(spec.strategy.backward, spec)
    return _sharded(spec, local, (q, k, v, seg, order, out, lse, dout),
                    (_QKV, _QKV, _QKV, _SEG, _SEG, _QKV, _LSE, _QKV), (_QKV,) * 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(spec, q, k, v, seg, order, sinks):
    return _forward(spec, q, k, v, seg, order, sinks)[0]


def _attention_fwd(spec, q, k, v, seg, order, sinks):
    out, lse, _ = _forward(spec, q, k, v, seg, order, sinks)
    # Named for jax.checkpoint: a remat policy that saves these two (SAVED_BY_NAME) keeps the
    # backward from running this forward again; every other residual is recomputable from q, k,
    # v, which the block's projections remake cheaply.
    out, lse = (checkpoint_name(x, name) for x, name in zip((out, lse), SAVED_BY_NAME))
    return out, (q, k, v, seg, order, sinks, out, lse)


def _no_cotangent(x):
    """The cotangent of an integer input (segment ids, order): float0 zeros, or None."""
    return None if x is None else np.zeros(x.shape, jax.dtypes.float0)


def _sink_cotangent(sinks, out, lse, dout):
    """d loss / d sinks[h] = -sum over rows of p_sink * rowsum(dO * O): the sink's column has no
    value, so its share of dS is p_sink (0 - D). lse includes the sink (the forward started its
    merge from it), so p_sink = exp(sinks[h] - lse) is final."""
    if sinks is None:
        return None
    delta = delta_rows(out, dout)  # [B, H, S] float32, as the strategies' backward takes it
    p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, None] - lse)
    return (-(p_sink * delta).sum(axis=(0, 2))).astype(sinks.dtype)


def _attention_bwd(spec, residuals, dout):
    q, k, v, seg, order, sinks, out, lse = residuals
    dq, dk, dv = _backward(spec, q, k, v, seg, order, out, lse, dout)
    return (dq, dk, dv, _no_cotangent(seg), _no_cotangent(order),
            _sink_cotangent(sinks, out, lse, dout))


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, mesh, layout, segment_ids=None, order=None, causal=True,
              strategy="ring", kernel="auto", tile_q=None, tile_k=None, scale=None,
              ulysses_degree=None, window=None, sinks=None, logit_soft_cap=None):
    """Exact sequence-parallel attention over the mesh's 'seq' axis.

    Args:
      q: [batch, seq, q_heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim], with
        q_heads % kv_heads == 0 (query head i uses KV head i // (q_heads // kv_heads)); v may
        be of another width than q and k (latent attention), the output then of v's.
        The seq axis is in `layout`'s order (see `permutation`); batch is sharded over
        'data', seq over 'seq'.
      mesh: a ('data', 'seq') mesh from `make_mesh`.
      layout: 'ring' | 'striped' | 'zigzag': where tokens sit on the seq shards.
      segment_ids: optional [batch, seq] integers, in the same order; tokens attend only within
        their own segment (packed documents).
      order: optional [batch, seq] integers: the original index of each token as it sits, i.e.
        the permutation that laid the row out (`permutation(...)`, [S] broadcast to every row,
        or [B, S] from a data-dependent layout). Required for 'balanced'; for the others it
        defaults to the layout's own formula. Masks and tile skipping follow it.
      causal: mask keys whose original index is after the query's.
      strategy: how keys and values reach the queries: 'ring', 'allgather', 'ulysses' or
        'usp' (STRATEGIES; see parallel/README.md for when each is faster).
      kernel: the work on one block pair: 'auto' (the backend's fused kernel, else 'xla') or a
        name from `parallel.KERNELS`.
      tile_q, tile_k: tile sizes inside each block pair (default: the largest divisor of the
        block, or of half a block for zigzag, up to 512).
      scale: score scale, > 0 (default 1 / sqrt(head_dim)).
      ulysses_degree: for strategy 'usp' only: u, the 'seq' devices per all-to-all group (a
        divisor of the seq shards and of q_heads); the ring runs over the N / u groups.
      window: None, or W >= 1: a sliding window on original positions. Causal: query i sees keys
        i - W < j <= i (W counts the query itself, as Hugging Face's `sliding_window`);
        bidirectional: |i - j| < W. Tiles and block pairs outside it are skipped.
      sinks: None, or [q_heads] floats: learned logits, one per head, each adding exp(sinks[h])
        to its head's softmax denominator (a key with no value, as in GPT-OSS); differentiable.
      logit_soft_cap: None, or c > 0: scores become c * tanh(scores / c) after scaling and before
        masking (Gemma 2).

    Returns:
      [batch, seq, q_heads, head_dim] in q's dtype, order and sharding. A query with no visible
      key gets 0.

    Example (8 devices, striped, natural-order inputs x [2, 1024, 4, 64]):
      mesh = make_mesh(1, 8); perm = permutation('striped', 1024, 8)
      y = attention(x[:, perm], x[:, perm], x[:, perm], mesh=mesh, layout='striped')
      y[:, inverse_permutation('striped', 1024, 8)]   # natural order again
    """
    width = v.shape[-1] if v.ndim == k.ndim == 4 and v.shape[-1] != k.shape[-1] else None
    if width is not None:  # values of another width (latent attention)
        q, k, v, scale = _one_width(q, k, v, scale)
    spec = make_spec(q, k, v, segment_ids, order, mesh=mesh, layout=layout, strategy=strategy,
                     kernel=kernel, causal=causal, tile_q=tile_q, tile_k=tile_k, scale=scale,
                     ulysses_degree=ulysses_degree, window=window, sinks=sinks,
                     logit_soft_cap=logit_soft_cap)
    with jax.named_scope("attention"):  # its ops' names in a profile (training/analysis/profile.py)
        out = _attention(spec, q, k, v, segment_ids, order, sinks)
    return out if width is None else out[..., :width]


def _one_width(q, k, v, scale):
    """Values of another head width than the keys (latent attention: qk 192, v 128): the
    strategies and kernels move and tile one width, so the narrower side is padded with zeros
    to the wider. Exact: zero columns of q and k add nothing to a score, zero columns of v
    give zero output columns, sliced off again (their gradients are zeros too). The padding's
    bytes travel on every ring step; model.mla's latent exchange moves the latent instead."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    d = max(k.shape[-1], v.shape[-1])
    pad = lambda x: jnp.pad(x, [(0, 0)] * 3 + [(0, d - x.shape[-1])])  # noqa: E731
    return pad(q), pad(k), pad(v), scale


def attention_with_stats(q, k, v, *, mesh, layout, segment_ids=None, order=None, causal=True,
                         strategy="ring", kernel="auto", tile_q=None, tile_k=None, scale=None,
                         ulysses_degree=None, window=None, sinks=None, logit_soft_cap=None):
    """`attention`'s forward, plus the work it did.

    Returns (out, tiles, kv_tokens):
      tiles [N, N] int32, tiles[d, s] = tile_q x tile_k tiles that seq shard d computed on step
        s (the block of device d - s; for ulysses and usp, whose N / u steps fill the first
        columns, of the group d - s u), counted inside the kernel's own loop, one per batch row
        (all the heads the device holds: all of them, or H / u for ulysses and usp); the
        maximum over 'data' shards when the batch is sharded, since those may skip different
        tiles.
      kv_tokens [N] float64: key/value tokens seq shard d received from the others, per batch
        row, counted in tokens of every KV head (the strategy's own count: a halo under a
        window, N - 1 blocks for the full ring and allgather, head shares for ulysses).
    """
    spec = make_spec(q, k, v, segment_ids, order, mesh=mesh, layout=layout, strategy=strategy,
                     kernel=kernel, causal=causal, tile_q=tile_q, tile_k=tile_k, scale=scale,
                     ulysses_degree=ulysses_degree, window=window, sinks=sinks,
                     logit_soft_cap=logit_soft_cap)
    out, _, counts = _forward(spec, q, k, v, segment_ids, order, sinks)
    received = spec.strategy.kv_tokens_received(spec.layout, spec.num_shards,
                                                q.shape[1] // spec.num_shards, spec.tiles.mask,
                                                spec.tiles.tile_k, k.shape[2])
    return out, counts.max(axis=0), received
