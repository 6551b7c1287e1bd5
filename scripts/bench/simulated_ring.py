"""A ring of N devices simulated on one accelerator: each layout's share of the ideal, and the
kernel's own TFLOP/s against cuDNN's on one causal block pair.

Usage (on a GPU; Llama-3.1-8B attention shapes by default):
  python scripts/bench/simulated_ring.py                    # N = 8, S = 65,536, bf16
  python scripts/bench/simulated_ring.py --json runs/simulated_ring.json
  python scripts/bench/simulated_ring.py --seq-len 1024 --heads 4 --kv-heads 2 --head-dim 32 \\
      --reps 2                                              # a small check of the script on a CPU

One GPU cannot hold a real ring, so the script runs every device's work one after the other on
the one device it has. For each layout, ring step s and device d it times the kernel's forward
and backward on the block pair device d meets on step s (its query block against the key block
of device (d - s) mod N, with the layout's token positions, so each pair is masked and skipped
exactly as in the ring); a pair with no visible key costs 0, as the strategy never calls the
kernel for it. Devices wait for each other at every hop, so a step costs its slowest device:

    critical path = sum over steps of max over devices (forward + backward time)
    ideal         = (forward + backward of the same kernel on the whole causal problem) / N
    share         = ideal / critical path

Communication is assumed to overlap compute (the ring issues each hop before the step's
compute); the share is of compute only. `model` is the same share from the cost model's tile
counts (parallel.cost), what the share would be if every tile took the same time.

Then the kernel alone on one causal block pair (S / N tokens, the diagonal step) against
`jax.nn.dot_product_attention(implementation="cudnn")` on the same shapes, both in their own
layout ([b, heads, n, d] for ours, [b, n, heads, d] for cuDNN): TFLOP/s counting the visible
half of the scores, forward 4 b H d n(n+1)/2 and backward 2.5 x that. All figures are medians
of --reps calls, timed interleaved. On a CPU, cuDNN is replaced by jax's XLA implementation.
"""

from __future__ import annotations

import argparse
import json
import statistics

from planner.calibration.timing import interleaved
from planner.flops import causal_pair_tflops

# ring-flash-attention's published fwd+bwd share of ideal, 8 x H800, for comparison.
PEER = {"ring": 0.539, "striped": 0.829, "zigzag": 0.902}
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=8, help="N: devices of the simulated ring")
    p.add_argument("--seq-len", type=int, default=65536)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--kernel", default="auto", help="parallel.attention's kernel")
    p.add_argument("--tile", type=int, default=None, help="tile_q = tile_k (default: the API's)")
    p.add_argument("--layouts", nargs="+", default=None, help="default: every layout")
    p.add_argument("--reps", type=int, default=5, help="timed calls of each program")
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


class Bench:
    """The kernel, its tiling and random inputs for one block size; jitted calls on them."""

    def __init__(self, args, layout, num_tokens):
        import jax
        import jax.numpy as jnp
        from jax import lax

        import parallel
        from parallel.choice import default_tile
        from parallel.spec import TileSpec

        platform = jax.devices()[0].platform
        self.kernel = parallel.resolve_kernel(args.kernel, platform)
        self.dtype = jnp.dtype(args.dtype)
        block = args.seq_len // args.shards
        tile_q, tile_k = ((args.tile, args.tile) if args.tile else
                          (default_tile(layout, block, m) for m in self.kernel.max_tiles))
        self.tiles = TileSpec(
            tile_q=tile_q, tile_k=tile_k, causal=True, scale=args.head_dim ** -0.5,
            precision=lax.Precision.HIGHEST if self.dtype == jnp.float32 else None,
            varying_axes=(), interpret=self.kernel.interpreted_on(platform))
        keys = jax.random.split(jax.random.key(num_tokens), 4)
        q_shape = (1, args.heads, num_tokens, args.head_dim)
        kv_shape = (1, args.kv_heads, num_tokens, args.head_dim)
        self.q, self.k, self.v, self.do = (
            jax.random.normal(key, shape, self.dtype)
            for key, shape in zip(keys, (q_shape, kv_shape, kv_shape, q_shape)))
        self.forward = jax.jit(lambda q, k, v, qp, kp: self.kernel.forward(
            q, k, v, qp, kp, None, None, self.tiles))
        self.backward = jax.jit(lambda q, k, v, do, lse, delta, qp, kp: self.kernel.backward(
            q, k, v, do, lse, delta, qp, kp, None, None, self.tiles))
        self.delta = jnp.zeros(q_shape[:3], jnp.float32)

    def times(self, q_pos, k_pos, reps):
        """Median seconds of (forward, backward) on this pair of positions."""
        import jax.numpy as jnp

        # One batch row: positions are [1, n] (the kernel contract's [b, n]).
        q_pos, k_pos = (jnp.asarray(p, jnp.int32)[None] for p in (q_pos, k_pos))
        _, lse, _ = self.forward(self.q, self.k, self.v, q_pos, k_pos)
        lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # the global lse of a row is finite
        calls = {
            "forward": lambda: self.forward(self.q, self.k, self.v, q_pos, k_pos),
            "backward": lambda: self.backward(self.q, self.k, self.v, self.do, lse, self.delta,
                                              q_pos, k_pos)}
        measured = interleaved(calls, reps)
        return statistics.median(measured["forward"]), statistics.median(measured["backward"])


def simulate_ring(args, layout):
    """Per-step times of the slowest device, the ideal and the model's share, for one layout."""
    import numpy as np

    import parallel
    from parallel import cost

    n, block = args.shards, args.seq_len // args.shards
    bench = Bench(args, layout, block)
    # One document: each device's original indices (balanced places it from the same order).
    order = parallel.row_order(layout, np.zeros((1, args.seq_len), np.int32), n)[0]
    positions = order.reshape(n, block)
    step_time = np.zeros((n, n))  # [device, step], forward + backward seconds
    for d in range(n):
        for s in range(n):
            q_pos, k_pos = positions[d], positions[(d - s) % n]
            if k_pos[0] <= q_pos[-1]:  # the strategy skips a pair with no visible key
                step_time[d, s] = sum(bench.times(q_pos, k_pos, args.reps))
    whole = Bench(args, layout, args.seq_len)
    everything = np.arange(args.seq_len)
    ideal = sum(whole.times(everything, everything, args.reps)) / n
    critical = step_time.max(axis=0)
    tq, tk = bench.tiles.tile_q, bench.tiles.tile_k
    counts = cost.placement_tile_counts(order, None, n, tq, tk)
    return dict(layout=layout, tile=f"{tq}x{tk}", kernel=bench.kernel.name, ideal_s=ideal,
                critical_path_s=float(critical.sum()), step_s=critical.tolist(),
                share=ideal / float(critical.sum()),
                model_share=cost.efficiency(counts, args.seq_len, tq, tk))


def kernel_against_cudnn(args):
    """TFLOP/s of our kernel and of jax.nn.dot_product_attention on one causal block pair."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = args.seq_len // args.shards
    bench = Bench(args, "ring", n)
    ours_fwd, ours_bwd = bench.times(np.arange(n), np.arange(n), args.reps)
    on_gpu = jax.devices()[0].platform == "gpu"
    impl = "cudnn" if on_gpu else None
    seq_major = lambda x: jnp.swapaxes(x, 1, 2)  # cuDNN's own layout, [b, n, heads, d]
    q, k, v, do = (seq_major(x) for x in (bench.q, bench.k, bench.v, bench.do))
    attend = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                          implementation=impl)
    forward = jax.jit(attend)
    forward_backward = jax.jit(lambda q, k, v, do: jax.vjp(attend, q, k, v)[1](do))
    measured = interleaved({"forward": lambda: forward(q, k, v),
                            "forward+backward": lambda: forward_backward(q, k, v, do)},
                           args.reps)
    ref_fwd = statistics.median(measured["forward"])
    ref_bwd = statistics.median(measured["forward+backward"]) - ref_fwd
    rate = lambda fwd, bwd: causal_pair_tflops(args.heads, args.head_dim, n, fwd, bwd)
    return dict(block=n, reference="cudnn" if on_gpu else "xla (no GPU: not cuDNN)",
                ours_tflops=rate(ours_fwd, ours_bwd), reference_tflops=rate(ref_fwd, ref_bwd))


def main(argv=None):
    args = parse_args(argv)
    import jax

    import parallel

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}); simulated ring of N = "
          f"{args.shards}, S = {args.seq_len}, {args.heads} query / {args.kv_heads} KV heads of "
          f"{args.head_dim}, {args.dtype}, causal; fwd+bwd, communication assumed overlapped")
    rows = [simulate_ring(args, layout) for layout in args.layouts or parallel.LAYOUTS]
    print("\n| layout | kernel | tile | critical path ms | ideal ms | share of ideal | model | "
          "ring-flash-attention 8xH800 |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = f"{PEER[r['layout']]:.3f}" if r["layout"] in PEER else "-"  # none for balanced
        print(f"| {r['layout']} | {r['kernel']} | {r['tile']} | {r['critical_path_s'] * 1e3:.2f}"
              f" | {r['ideal_s'] * 1e3:.2f} | {r['share']:.3f} | {r['model_share']:.3f} | "
              f"{peer} |")
    pair = kernel_against_cudnn(args)
    (ours_f, ours_fb), (ref_f, ref_fb) = pair["ours_tflops"], pair["reference_tflops"]
    print(f"\none causal block pair of {pair['block']} tokens, TFLOP/s (forward | fwd+bwd):")
    print(f"  ours ({rows[0]['kernel']}): {ours_f:.3g} | {ours_fb:.3g}")
    print(f"  {pair['reference']}: {ref_f:.3g} | {ref_fb:.3g}")
    print(f"  ours / reference: {ours_f / ref_f:.2f} | {ours_fb / ref_fb:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), device=device.device_kind, layouts=rows,
                           block_pair=pair), f, indent=1)


if __name__ == "__main__":
    main()
