"""The attention kernel's tile cost measured on the machine at hand, and the calibration it gives
the planner: `scripts/calibrate.py --measure` runs this in a process of one device pinned to one
core (as the devices of scripts/launch_local.py --pin) and writes the result to the file the
planner reads (planner/devices.py: `measured_calibration`).

    rows = time_tiles(model_shape, blocks=(2048, 4096), tiles=(32, 64, 128, 256, 512))
    t0, flops_per_s = fit_tiles(rows)      # a forward tile: t0 + 4 b tq tk d H / flops_per_s

A row times one causal block of n tokens on one device, forward and backward, with square
tiles of t: T = n / t tiles a side, T (T + 1) / 2 of them computed; the planner's model of that
work is 3 x tiles x (t0 + F / rate) (the backward's tiles cost twice the forward's,
parallel/strategy_cost.py), so t0 and the rate are a least-squares fit of the seconds per tile
against its FLOPs.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import parallel


@dataclasses.dataclass(frozen=True)
class Shape:
    """The attention the rows time: one row of q_heads x head_dim queries, kv_heads keys."""

    q_heads: int
    kv_heads: int
    head_dim: int
    rows: int = 1

    def tile_flops(self, tile: int) -> float:
        """F of one forward tile over every head (parallel/strategy_cost.py)."""
        return 4.0 * self.rows * tile * tile * self.head_dim * self.q_heads


def causal_tiles(block: int, tile: int) -> int:
    """Tiles a causal block of `block` tokens computes with square tiles of `tile`."""
    sides = block // tile
    return sides * (sides + 1) // 2


def median_seconds(step, args, repeats: int) -> float:
    """Median seconds of `step(*args)` over `repeats` calls, after one untimed call (the
    compile)."""
    jax.block_until_ready(step(*args))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def time_tiles(shape: Shape, blocks, tiles, repeats: int = 5, kernel: str = "xla") -> list[dict]:
    """Median seconds of a jitted forward + backward of one causal block on this process's first
    device, for every (block, tile) with tile dividing the block; after one untimed call."""
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    rows = []
    for block in blocks:
        key = jax.random.split(jax.random.PRNGKey(block), 3)
        q = jax.random.normal(key[0], (shape.rows, block, shape.q_heads, shape.head_dim))
        k, v = (jax.random.normal(kk, (shape.rows, block, shape.kv_heads, shape.head_dim))
                for kk in key[1:])
        for tile in tiles:
            if block % tile:
                continue

            def loss(q, k, v, tile=tile):
                out = parallel.attention(q, k, v, mesh=mesh, layout="ring", strategy="ring",
                                         kernel=kernel, tile_q=tile, tile_k=tile)
                return jnp.sum(out * out)

            with jax.set_mesh(mesh):
                seconds = median_seconds(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v),
                                         repeats)
            count = causal_tiles(block, tile)
            rows.append({"block": block, "tile": tile, "tiles": count, "seconds": seconds,
                         "seconds_per_tile": seconds / (3 * count),
                         "tile_flops": shape.tile_flops(tile)})
    return rows


def fit_tiles(rows: list[dict]) -> tuple[float, float]:
    """(t0, flops_per_s): the forward tile's fixed seconds and the kernel's rate, from rows of
    `time_tiles`, by least squares on the relative error of the seconds per tile (so the
    small tiles, where t0 shows, weigh as much as the large ones). t0 is at least 0."""
    per_tile = np.array([r["seconds_per_tile"] for r in rows])
    flops = np.array([r["tile_flops"] for r in rows])
    # seconds_per_tile / per_tile = t0 / per_tile + (1 / rate) flops / per_tile = 1
    a = np.stack([1.0 / per_tile, flops / per_tile], axis=1)
    (t0, inverse_rate), *_ = np.linalg.lstsq(a, np.ones_like(per_tile), rcond=None)
    if t0 < 0:  # no fixed cost to see: the rate alone
        t0, inverse_rate = 0.0, float(np.median(per_tile / flops))
    return float(t0), float(1.0 / inverse_rate)


def time_matmuls(d_model: int, mlp_dim: int, tokens: int, repeats: int = 5) -> dict:
    """Median seconds of a jitted forward + backward of two chained matmuls, [tokens, d_model] x
    [d_model, mlp_dim] x [mlp_dim, d_model] (an MLP without its gate): 6 FLOPs per token and
    parameter, as the planner counts the dense layers (planner/step_time.py)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (tokens, d_model))
    w1 = jax.random.normal(keys[1], (d_model, mlp_dim)) / d_model ** 0.5
    w2 = jax.random.normal(keys[2], (mlp_dim, d_model)) / mlp_dim ** 0.5
    step = jax.jit(jax.grad(lambda x, w1, w2: jnp.sum((x @ w1) @ w2), argnums=(0, 1, 2)))
    seconds = median_seconds(step, (x, w1, w2), repeats)
    flops = 6.0 * tokens * 2 * d_model * mlp_dim
    return {"tokens": tokens, "seconds": seconds, "flops": flops,
            "flops_per_s": flops / seconds}


def measure_calibration(shape: Shape, d_model: int, mlp_dim: int, peak_flops: float,
                        blocks=(2048, 8192), tiles=(16, 32, 64, 128, 256, 512),
                        repeats: int = 5) -> dict:
    """{'calibration': the Calibration fields measured here, 'tiles': time_tiles' rows,
    'matmul': time_matmuls' row}: the matmul and attention shares of `peak_flops` and the
    tile's fixed cost (the ring's step cost and overlap stay nominal: one device has no ring)."""
    rows = time_tiles(shape, blocks, tiles, repeats)
    t0, rate = fit_tiles(rows)
    dense = time_matmuls(d_model, mlp_dim, max(blocks), repeats)
    return {"calibration": {"matmul_efficiency": dense["flops_per_s"] / peak_flops,
                            "attention_efficiency": rate / peak_flops, "tile_overhead_s": t0},
            "tiles": rows, "matmul": dense}
