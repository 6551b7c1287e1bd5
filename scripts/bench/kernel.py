"""Time per computed tile of an attention kernel against the hardware floor, on one pinned core.

Usage:
  python scripts/bench/kernel.py                         # tiles 256, 512, 1024; kernel xla
  python scripts/bench/kernel.py --tiles 1024 --reps 9 --json runs/bench_kernel.json

For each tile size t: one device, one causal row of S = T x t tokens (T tiles per side, 8 by
default, so the kernel computes T(T+1)/2 tiles, counted by `attention_with_stats`), batch 1,
4 heads of 64, float32. Three programs are timed interleaved, medians of --reps calls:

- floor: the same tile's two matmuls, q.k^T then p.v, in head-major [b, h, t, d] order (the
  fastest order here), run over T distinct key tiles in one jitted loop. Per tile.
- forward: `parallel.attention`, divided by the tiles it computed.
- forward+backward: its VJP, divided by the same count. The backward does five matmuls per tile
  to the forward's two, so its floor is 3.5 x the forward floor.

ratio = floor / time per tile (1.0 = the kernel runs at the speed of its bare matmuls). The
process pins itself to one core and turns off XLA's multi-threaded matmuls, so that the kernel
and its floor see the same single core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from planner.calibration.timing import interleaved

BACKWARD_FLOOR = 3.5  # (2 forward + 5 backward matmuls) / 2 forward matmuls


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiles", type=int, nargs="+", default=[256, 512, 1024], help="tile sizes")
    p.add_argument("--tiles-per-side", type=int, default=8, help="T: S = T x tile")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--kernel", default="xla", help="parallel.attention's kernel")
    p.add_argument("--reps", type=int, default=7, help="timed calls of each program")
    p.add_argument("--core", type=int, default=0, help="the core to pin to")
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


def programs(tile, args):
    """The three jitted programs on fresh inputs, and the number of tiles the kernel computes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import parallel

    t, side, h, d = tile, args.tiles_per_side, args.heads, args.head_dim
    seq_len = side * t
    rng = np.random.default_rng(tile)
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, seq_len, h, d), np.float32))
                   for _ in range(4))
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    kw = dict(mesh=mesh, layout="ring", kernel=args.kernel, tile_q=t, tile_k=t)
    _, counts, _ = parallel.attention_with_stats(q, k, v, **kw)
    tiles = int(np.asarray(counts).sum())

    attend = lambda q, k, v: parallel.attention(q, k, v, **kw)
    forward = jax.jit(attend)
    forward_backward = jax.jit(lambda q, k, v, do: jax.vjp(attend, q, k, v)[1](do))

    q_tile = jnp.swapaxes(q[:, :t], 1, 2)  # [1, h, t, d]
    k_all, v_all = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [1, h, S, d]

    @jax.jit
    def floor(q_tile, k_all, v_all):
        def one_tile(i, acc):  # distinct key tiles, so nothing is hoisted out of the loop
            k_t = lax.dynamic_slice_in_dim(k_all, i * t, t, 2)
            v_t = lax.dynamic_slice_in_dim(v_all, i * t, t, 2)
            s = jnp.einsum("bhqd,bhkd->bhqk", q_tile, k_t)
            return acc + jnp.einsum("bhqk,bhkd->bhqd", s, v_t)
        return lax.fori_loop(0, side, one_tile, jnp.zeros_like(q_tile))

    return {
        "floor": (lambda: floor(q_tile, k_all, v_all), side),
        "forward": (lambda: forward(q, k, v), tiles),
        "forward+backward": (lambda: forward_backward(q, k, v, do), tiles),
    }, tiles


def measure(tile, args):
    runs, tiles = programs(tile, args)
    times = interleaved({name: run for name, (run, _) in runs.items()}, args.reps)
    per_tile = {name: statistics.median(times[name]) / runs[name][1] for name in runs}
    floor = per_tile["floor"]
    return dict(tile=tile, tiles_computed=tiles, floor_ms=floor * 1e3,
                forward_ms=per_tile["forward"] * 1e3,
                forward_backward_ms=per_tile["forward+backward"] * 1e3,
                forward_ratio=floor / per_tile["forward"],
                forward_backward_ratio=BACKWARD_FLOOR * floor / per_tile["forward+backward"],
                times_s={name: ts for name, ts in times.items()})


def main():
    args = parse_args()
    os.sched_setaffinity(0, {args.core})
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    print(f"jax {jax.__version__}, kernel {args.kernel}, one core (#{args.core}), "
          f"heads {args.heads} x {args.head_dim}, float32, T={args.tiles_per_side} tiles per side")
    print(f"{'tile':>5} {'tiles':>6} {'floor ms':>9} {'fwd ms':>8} {'fwd ratio':>9} "
          f"{'fwd+bwd ms':>10} {'fwd+bwd ratio':>13}")
    rows = []
    for tile in args.tiles:
        r = measure(tile, args)
        rows.append(r)
        print(f"{tile:>5} {r['tiles_computed']:>6} {r['floor_ms']:>9.2f} {r['forward_ms']:>8.2f} "
              f"{r['forward_ratio']:>9.2f} {r['forward_backward_ms']:>10.2f} "
              f"{r['forward_backward_ratio']:>13.2f}", flush=True)
    print("ratio = floor / time per computed tile (fwd+bwd: 3.5 x floor / time per tile)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
