"""Everything static about one attention call, and the checks that build it.

`make_spec` is the one place the public arguments are validated: every bad argument becomes a
ValueError that names the problem and the fix, before anything is traced.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from parallel.choice import resolve_tiles
from parallel.kernels import Kernel, resolve_kernel
from parallel.layouts import Layout, get_layout
from parallel.mask import Mask, check_window
from parallel.mesh import DATA, SEQ
from parallel.strategies import Strategy, configured, get_strategy



@dataclasses.dataclass(frozen=True)
class TileSpec:
    """Static parameters of the work on one block pair."""

    tile_q: int
    tile_k: int
    causal: bool
    scale: float  # > 0; applied inside the exponent, so the max of raw scores is the max
    precision: lax.Precision | None  # HIGHEST for float32 inputs (TPU would use bf16 passes)
    varying_axes: tuple[str, ...]  # mesh axes the kernel's values vary over (for check_vma)
    interpret: bool = False  # run a Pallas kernel in interpret mode (a platform it is not fused on)
    window: int | None = None  # keys a query sees, itself included (parallel/mask.py)
    soft_cap: float | None = None  # logits c tanh(scale s / c) (kernels/base.py: logits)

    @property
    def mask(self) -> Mask:
        return Mask(causal=self.causal, window=self.window)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """The three choices and the tiling of one call (hashable: a static jit argument); the
    strategy configured with its own options (parallel/strategies/base.py)."""

    mesh: Mesh
    layout: Layout
    strategy: Strategy
    kernel: Kernel
    tiles: TileSpec

    @property
    def num_shards(self) -> int:
        return self.mesh.shape[SEQ]


def make_spec(q, k, v, segment_ids, order, *, mesh, layout, strategy, kernel, causal, tile_q,
              tile_k, scale, ulysses_degree=None, window=None, sinks=None,
              logit_soft_cap=None) -> AttentionSpec:
    """Validates the arguments of `parallel.attention` and gathers the static parameters."""
    lay, strat = get_layout(layout), get_strategy(strategy)
    _check_mesh(mesh)
    platform = mesh.devices.flat[0].platform
    kern = resolve_kernel(kernel, platform)
    _check_shapes(q, k, v, segment_ids)
    _check_order(order, lay, q.shape[:2])
    batch, seq_len = q.shape[:2]
    if batch % mesh.shape[DATA]:
        raise ValueError(
            f"batch {batch} is not divisible by the {mesh.shape[DATA]} 'data' shards: "
            f"use a batch that is a multiple of {mesh.shape[DATA]}")
    lay.check_divisible(seq_len, mesh.shape[SEQ])
    strat = configured(strat, mesh.shape[SEQ], q.shape[2], ulysses_degree=ulysses_degree)
    tile_q, tile_k = resolve_tiles(lay, kern, seq_len // mesh.shape[SEQ], tile_q, tile_k)
    if lay.data_dependent:
        _check_units(order, tile_q, tile_k)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"scale={scale} must be positive (default 1 / sqrt(head_dim))")
    window = check_window(window)
    soft_cap = _check_soft_cap(logit_soft_cap)
    _check_sinks(sinks, q.shape[2])
    precision = lax.Precision.HIGHEST if jnp.dtype(q.dtype) == jnp.float32 else None
    interpret = kern.interpreted_on(platform)
    kern.check_tiles(tile_q, tile_k, interpret)
    tiles = TileSpec(tile_q=tile_q, tile_k=tile_k, causal=bool(causal), scale=scale,
                     precision=precision, varying_axes=(DATA, SEQ), interpret=interpret,
                     window=window, soft_cap=soft_cap)
    return AttentionSpec(mesh=mesh, layout=lay, strategy=strat, kernel=kern, tiles=tiles)


def _check_soft_cap(cap):
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, (int, float, np.floating, np.integer)) \
            or not cap > 0 or not math.isfinite(cap):
        raise ValueError(f"logit_soft_cap={cap!r} must be a positive number (Gemma 2 uses 50.0) "
                         f"or None for no cap")
    return float(cap)


def _check_sinks(sinks, q_heads):
    if sinks is None:
        return
    if tuple(getattr(sinks, "shape", ())) != (q_heads,):
        raise ValueError(f"sinks must be [q_heads] = ({q_heads},), one logit per query head; got "
                         f"shape {tuple(getattr(sinks, 'shape', ()))}")
    if not jnp.issubdtype(sinks.dtype, jnp.floating):
        raise ValueError(f"sinks must be floats (learned logits); got {sinks.dtype}")


def _check_mesh(mesh):
    if not isinstance(mesh, Mesh) or set(mesh.axis_names) != {DATA, SEQ}:
        raise ValueError("mesh must be a ('data', 'seq') mesh: build it with parallel.make_mesh")


def _check_shapes(q, k, v, segment_ids):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, seq, heads, head_dim]; got shapes {q.shape}, {k.shape}, "
            f"{v.shape}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in batch, seq and heads; got {k.shape} and "
                         f"{v.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k/v {k.shape} must agree in batch, seq and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")
    if segment_ids is not None:
        if segment_ids.shape != q.shape[:2]:
            raise ValueError(
                f"segment_ids must be [batch, seq] = {q.shape[:2]}; got {segment_ids.shape}")
        if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise ValueError(f"segment_ids must be integers; got {segment_ids.dtype}")


def _check_order(order, layout, shape):
    if order is None:
        if layout.data_dependent:
            raise ValueError(
                f"layout {layout.name!r} places tokens from the data: pass order=, the [batch, "
                f"seq] permutation that laid the rows out (parallel.permutation(..., "
                f"segment_ids=...))")
        return
    if tuple(order.shape) != tuple(shape):
        raise ValueError(f"order must be [batch, seq] = {tuple(shape)}; got {tuple(order.shape)}: "
                         f"broadcast a [seq] permutation to every row")
    if not jnp.issubdtype(order.dtype, jnp.integer):
        raise ValueError(f"order must be integers (original token indices); got {order.dtype}")


def _check_units(order, tile_q, tile_k):
    """A data-dependent order (balanced) places tokens in units of consecutive tokens; a tile
    must lie inside one unit, or it straddles two and the placement's balance is lost (0.3-0.5
    parallel efficiency instead of 0.9 on packed documents). Checked where the order is
    concrete (a traced order comes from a run, whose AttentionChoice makes both from one
    unit)."""
    if isinstance(order, jax.core.Tracer):
        return
    o = np.asarray(order)
    for name, tile in (("tile_q", tile_q), ("tile_k", tile_k)):
        if not (np.diff(o.reshape(o.shape[0], -1, tile), axis=-1) == 1).all():
            raise ValueError(
                f"{name}={tile} straddles the units this order was placed in: build it with "
                f"parallel.permutation(layout, S, N, segment_ids=..., "
                f"tile={math.lcm(tile_q, tile_k)}) (the tiles' lcm), or pass the tiles it was "
                f"built for")
