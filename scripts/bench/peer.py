"""Ours against a peer: `ringattention` 0.1.2 (Liu et al.'s JAX Ring Attention, contiguous ring).

Usage:
  pip install -e '.[peer]'                   # ringattention==0.1.2 and einops
  python scripts/bench/peer.py               # S=16384, 2 fake devices in one process
  python scripts/bench/peer.py --seq-len 8192 --reps 9 --json runs/bench_peer.json

Setup: 2 fake CPU devices in ONE process (the peer's own test setup; XLA's thread pool spreads
both devices over the machine's cores), a ('data' 1, 'seq' 2) mesh, batch 1, 4 heads of 64,
float32, causal; both run one ring of N = 2 steps with tiles (the peer's query/key chunks) of
block / 8. The peer runs in `jax.shard_map` over 'seq' with its blockwise JAX kernel
(`ringattention.ringattention_jax`, causal_block_size=1); ours is `parallel.attention` with the
xla kernel, in the striped and ring layouts. Programs are timed interleaved, medians of --reps;
"peer/ours" is the peer's median over ours (> 1: ours is faster). Before timing, every output is
checked against the peer's (same numbers, natural order).

The peer was written for an older JAX: `jax.lib.xla_bridge` has moved, so the shim below puts
`get_backend` back where the peer looks for it before importing it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from planner.calibration.timing import interleaved



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunks-per-block", type=int, default=8, help="tile = block / this")
    p.add_argument("--reps", type=int, default=5, help="timed calls of each program")
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


def import_peer():
    import types

    import jax
    import jax.extend

    if not hasattr(jax.lib, "xla_bridge"):  # the shim: moved in newer JAX
        jax.lib.xla_bridge = types.SimpleNamespace(get_backend=jax.extend.backend.get_backend)
    try:
        from ringattention import ringattention_jax
    except ImportError:
        sys.exit("bench_peer: the peer is not installed: pip install -e '.[peer]'")
    return ringattention_jax


def peer_attention(mesh, tile):
    """The peer's causal ring attention over the mesh's 'seq' axis, natural order in and out."""
    import jax
    import jax.numpy as jnp

    ring_attention = import_peer()
    blockwise = dict(causal_block_size=1, query_chunk_size=tile, key_chunk_size=tile,
                     deterministic=True, dropout_rng=None, attn_pdrop=0.0, dtype=jnp.float32,
                     policy=jax.checkpoint_policies.nothing_saveable, precision=None,
                     prevent_cse=True)
    local = lambda q, k, v: ring_attention(q, k, v, None, None, None, "seq", True, blockwise)
    spec = jax.P("data", "seq")
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                         check_vma=False)


def programs(args, mesh):
    """name -> (forward, forward+backward, inputs q, k, v, dO, natural-order index of the
    sequence axis). The peer takes natural order; ours takes its layout's order, as the data
    pipeline delivers it (a host permutation, not timed)."""
    import jax
    import numpy as np

    import parallel

    n = mesh.shape["seq"]
    tile = args.seq_len // n // args.chunks_per_block
    rng = np.random.default_rng(0)
    shape = (1, args.seq_len, args.heads, args.head_dim)
    natural = [rng.standard_normal(shape, np.float32) for _ in range(4)]
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    identity = np.arange(args.seq_len)
    attends = {"peer (ring)": (peer_attention(mesh, tile), identity, identity)}
    for layout in ("striped", "ring"):
        attend = lambda q, k, v, layout=layout: parallel.attention(
            q, k, v, mesh=mesh, layout=layout, kernel="xla", tile_q=tile, tile_k=tile)
        attends[f"ours ({layout})"] = (attend, parallel.permutation(layout, args.seq_len, n),
                                       parallel.inverse_permutation(layout, args.seq_len, n))
    runs = {}
    for name, (attend, perm, inv) in attends.items():
        fwd = jax.jit(attend)
        fwd_bwd = jax.jit(lambda q, k, v, do, attend=attend: jax.vjp(attend, q, k, v)[1](do))
        inputs = [jax.device_put(x[:, perm], sharding) for x in natural]
        runs[name] = (fwd, fwd_bwd, inputs, inv)
    return runs, tile


def check_same_numbers(runs):
    """Every program's output and gradients, back in natural order, equal the peer's."""
    import numpy as np

    def results(name):
        fwd, fwd_bwd, (q, k, v, do), inv = runs[name]
        return [np.asarray(x)[:, inv] for x in (fwd(q, k, v), *fwd_bwd(q, k, v, do))]

    want = results("peer (ring)")
    for name in runs:
        errors = [np.abs(got - w).max() / np.abs(w).max() for got, w in zip(results(name), want)]
        if max(errors) > 1e-4:
            sys.exit(f"bench_peer: {name} differs from the peer by {max(errors):.2e}")


def measure(runs, reps):
    calls = {}
    for name, (fwd, fwd_bwd, (q, k, v, do), _) in runs.items():
        calls[(name, "forward")] = lambda f=fwd, q=q, k=k, v=v: f(q, k, v)
        calls[(name, "forward+backward")] = lambda f=fwd_bwd, q=q, k=k, v=v, do=do: f(q, k, v, do)
    return interleaved(calls, reps, warmup=1)  # one warm-up: the check compiled them already


def main():
    args = parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    import parallel

    mesh = parallel.make_mesh(1, 2, devices=jax.devices()[:2])
    runs, tile = programs(args, mesh)
    print(f"jax {jax.__version__}, {os.cpu_count()} cores, 2 fake devices in one process, "
          f"S={args.seq_len}, heads {args.heads} x {args.head_dim}, float32, causal, "
          f"tiles {tile}")
    check_same_numbers(runs)
    times = measure(runs, args.reps)
    rows = []
    for mode in ("forward", "forward+backward"):
        peer = statistics.median(times[("peer (ring)", mode)])
        for name in runs:
            median = statistics.median(times[(name, mode)])
            rows.append(dict(program=name, mode=mode, median_s=median, peer_over_this=peer / median,
                             times_s=times[(name, mode)]))
    print(f"{'program':<16} {'mode':<17} {'median s':>9} {'peer/this':>9}")
    for r in rows:
        print(f"{r['program']:<16} {r['mode']:<17} {r['median_s']:>9.3f} "
              f"{r['peer_over_this']:>9.2f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tile": tile, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
