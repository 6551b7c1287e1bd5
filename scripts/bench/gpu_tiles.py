"""pallas_gpu's tiles and Triton launch parameters, measured: forward and backward of one causal
block pair for each (tile_q, tile_k, num_warps, num_stages), per head_dim.

Usage (on a GPU):
  python scripts/bench/gpu_tiles.py                       # head_dim 64 and 128, block 8,192, bf16
  python scripts/bench/gpu_tiles.py --head-dims 128 --block 4096 --json runs/gpu_tiles.json
  python scripts/bench/gpu_tiles.py --head-dims 32 --heads 2 --kv-heads 1 --block 256 \\
      --tiles 32x32 --launches 4x2 --reps 1                  # a check of the script on a CPU

Every choice is compiled first; then all are timed interleaved, --reps rounds, medians. A choice
the compiler refuses (shared memory, registers) is listed with its error and left out. The
winner per head_dim, by forward + backward time, is what pallas_gpu.LAUNCH and the kernel's
tiles should say. TFLOP/s as bench_simulated_ring counts them (`causal_pair_tflops`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

from planner.calibration.timing import interleaved
from planner.flops import causal_pair_tflops


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--block", type=int, default=8192, help="tokens of the causal block pair")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tiles", nargs="+", default=["64x32", "64x64", "128x32", "128x64",
                                                   "128x128"], help="tile_q x tile_k")
    p.add_argument("--launches", nargs="+", default=["4x2", "4x3", "8x2", "8x3"],
                   help="num_warps x num_stages")
    p.add_argument("--split", nargs="+", choices=["on", "off"], default=["on"],
                   help="pallas_gpu.SPLIT_FULL_TILES: fully visible tiles in their own unmasked "
                        "loop (on) or every tile masked (off); both to compare them")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


def pair(text):
    a, b = text.split("x")
    return int(a), int(b)


def programs(args, head_dim):
    """{(tile, launch, split): (forward, backward)} compiled on this device's kernel, and the
    refused choices with their errors."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from parallel.kernels import pallas_gpu
    from parallel.spec import TileSpec

    platform = jax.devices()[0].platform
    n, dtype = args.block, jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.key(head_dim), 4)
    q, do = (jax.random.normal(key, (1, args.heads, n, head_dim), dtype) for key in keys[:2])
    k, v = (jax.random.normal(key, (1, args.kv_heads, n, head_dim), dtype) for key in keys[2:])
    pos = jnp.asarray(np.arange(n, dtype=np.int32)[None])
    delta = jnp.zeros((1, args.heads, n), jnp.float32)
    built, refused = {}, {}
    for tile, launch, split in itertools.product(map(pair, args.tiles), map(pair, args.launches),
                                                 args.split):
        if n % tile[0] or n % tile[1]:
            continue
        tiles = TileSpec(tile_q=tile[0], tile_k=tile[1], causal=True, scale=head_dim ** -0.5,
                         precision=None, varying_axes=(), interpret=platform != "gpu")
        pallas_gpu.LAUNCH[head_dim] = launch  # both read when the kernel is traced, just below
        pallas_gpu.SPLIT_FULL_TILES = split == "on"
        try:
            fwd = jax.jit(lambda q, k, v, t=tiles: pallas_gpu.KERNEL.forward(
                q, k, v, pos, pos, None, None, t)[:2]).lower(q, k, v).compile()
            _, lse = fwd(q, k, v)
            bwd = jax.jit(lambda q, k, v, do, lse, t=tiles: pallas_gpu.KERNEL.backward(
                q, k, v, do, lse, delta, pos, pos, None, None, t)).lower(
                    q, k, v, do, lse).compile()
        except Exception as e:  # noqa: BLE001  (the compiler's refusal is a result here)
            refused[(tile, launch, split)] = str(e).splitlines()[0][:160]
            continue
        built[(tile, launch, split)] = (lambda f=fwd: f(q, k, v),
                                 lambda b=bwd: b(q, k, v, do, lse))
    pallas_gpu.LAUNCH.pop(head_dim, None)
    pallas_gpu.SPLIT_FULL_TILES = True
    return built, refused


def measure(args, head_dim):
    built, refused = programs(args, head_dim)
    calls = {}
    for key, (fwd, bwd) in built.items():
        calls[(key, "forward")], calls[(key, "backward")] = fwd, bwd
    times = interleaved(calls, args.reps)
    rows = []
    for key in built:
        tile, launch, split = key
        f = statistics.median(times[(key, "forward")])
        b = statistics.median(times[(key, "backward")])
        forward_tflops, total_tflops = causal_pair_tflops(args.heads, head_dim, args.block, f, b)
        rows.append(dict(head_dim=head_dim, tile=tile, launch=launch, split=split,
                         forward_ms=f * 1e3,
                         backward_ms=b * 1e3, forward_tflops=forward_tflops,
                         total_tflops=total_tflops))
    return rows, refused


def main(argv=None):
    args = parse_args(argv)
    import jax

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}); causal block pair of {args.block} "
          f"tokens, {args.heads} query / {args.kv_heads} KV heads, {args.dtype}")
    every = []
    for head_dim in args.head_dims:
        rows, refused = measure(args, head_dim)
        every += rows
        print(f"\nhead_dim {head_dim}\n| tile_q x tile_k | warps x stages | split | forward ms "
              f"| backward ms | forward TFLOP/s | fwd+bwd TFLOP/s |\n|---|---|---|---|---|---|---|")
        for r in sorted(rows, key=lambda r: r["forward_ms"] + r["backward_ms"]):
            print(f"| {r['tile'][0]}x{r['tile'][1]} | {r['launch'][0]}x{r['launch'][1]} | "
                  f"{r['split']} | "
                  f"{r['forward_ms']:.3f} | {r['backward_ms']:.3f} | "
                  f"{r['forward_tflops']:.1f} | {r['total_tflops']:.1f} |")
        for (tile, launch, split), error in refused.items():
            print(f"refused: {tile[0]}x{tile[1]} {launch[0]}x{launch[1]} split {split}: {error}")
        if rows:
            best = min(rows, key=lambda r: r["forward_ms"] + r["backward_ms"])
            print(f"best for head_dim {head_dim}: tiles {best['tile'][0]}x{best['tile'][1]}, "
                  f"warps x stages {best['launch'][0]}x{best['launch'][1]}, split {best['split']}, "
                  f"{best['total_tflops']:.1f} TFLOP/s fwd+bwd")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), device=device.device_kind, rows=every), f, indent=1)


if __name__ == "__main__":
    main()
