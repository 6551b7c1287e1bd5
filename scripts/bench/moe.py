"""The expert layer's grouped matmuls (lax.ragged_dot over the pairs sorted by expert) against a
loop over the experts (a dense matmul per expert over every pair, the others masked): forward
and backward of one layer's experts on one device, medians of interleaved repeats.

    python scripts/bench/moe.py                              # configs/moe_tiny.py's experts
    python scripts/bench/moe.py --tokens 8192 --experts 8 32 --reps 5

Each kind is jitted once and timed on the same pairs (tokens x top_k, routed at random), so the
ratio is the loop's cost over the grouped matmuls' (model/moe.py expert_mlp and
looped_expert_mlp): E times the matmul work for the loop.
"""

from __future__ import annotations

import argparse
import statistics
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192, help="tokens on the device")
    p.add_argument("--experts", type=int, nargs="+", default=[8], help="experts per layer")
    p.add_argument("--top-k", type=int, default=2, help="experts a token goes to")
    p.add_argument("--d-model", type=int, default=128, help="residual width")
    p.add_argument("--width", type=int, default=96, help="each expert's hidden width")
    p.add_argument("--reps", type=int, default=5, help="timed repeats of each kind")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from model import moe
    print(f"one layer's experts, forward + backward, {args.tokens:,} tokens x top-{args.top_k}, "
          f"d_model {args.d_model}, width {args.width}, float32, {jax.devices()[0].platform}; "
          f"medians of {args.reps} interleaved repeats")
    print(f"{'experts':>8} {'grouped ms':>11} {'loop ms':>9} {'loop / grouped':>15}")
    for e in args.experts:
        rng = np.random.default_rng(0)
        p, d, f = args.tokens * args.top_k, args.d_model, args.width
        weights = {"gate": rng.normal(size=(e, d, f)), "up": rng.normal(size=(e, d, f)),
                   "down": rng.normal(size=(e, f, d))}
        weights = {k: jnp.asarray(v / np.sqrt(v.shape[1]), jnp.float32) for k, v in weights.items()}
        experts = np.sort(rng.integers(0, e, p)).astype(np.int32)  # pairs sorted by expert
        sizes = jnp.asarray(np.bincount(experts, minlength=e), jnp.int32)
        xs = jnp.asarray(rng.normal(size=(p, d)), jnp.float32)
        kinds = {}
        for name, fn in (("grouped", moe.expert_mlp), ("loop", moe.looped_expert_mlp)):
            def loss(w, x, fn=fn):
                y = fn(w, x, sizes, jnp.asarray(experts), dtype=jnp.float32,
                       activation="silu", limit=0.0)
                return jnp.sum(y * y)
            kinds[name] = jax.jit(jax.grad(loss, argnums=(0, 1)))
        outs = {name: jax.block_until_ready(f(weights, xs)) for name, f in kinds.items()}
        gap = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in
                  zip(jax.tree.leaves(outs["grouped"]), jax.tree.leaves(outs["loop"])))
        times = {name: [] for name in kinds}
        for _ in range(args.reps):
            for name, f in kinds.items():
                start = time.perf_counter()
                jax.block_until_ready(f(weights, xs))
                times[name].append(time.perf_counter() - start)
        grouped, loop = (statistics.median(times[k]) * 1e3 for k in ("grouped", "loop"))
        print(f"{e:>8} {grouped:>11.1f} {loop:>9.1f} {loop / grouped:>15.2f}"
              f"   (gradients agree to {gap:.1e})")


if __name__ == "__main__":
    main()
