"""Benchmark of the layouts: work on the critical path, and wall clock (with packed documents).

Usage:
  python scripts/bench/attention.py                      # tiles at N=2,4,8,16; wall clock, 2 processes
  python scripts/bench/attention.py --json runs/bench.json --reps 7
  python scripts/bench/attention.py --processes 1        # wall clock in one process (see below)
  python scripts/bench/attention.py --no-wallclock       # tile counts only (seconds)
  python scripts/bench/attention.py --documents stdlib --seq-lens 65536 --batch 1
  python scripts/bench/attention.py --strategies ring allgather --no-tiles   # strategies

1. Tiles. For each layout and ring size N, the kernel's own counters (`attention_with_stats`) give
   tiles[d, s], the tiles device d computed on ring step s. Devices wait for each other at every
   hop, so the critical path is sum over s of max over d. The ideal is the causal mask's
   (query, key) pairs spread evenly: S(S+1)/2 / (N * tile_q * tile_k). Efficiency = ideal / path.
   Counted on N fake CPU devices in this process, T tiles per block side.

2. Wall clock: medians of forward and forward+backward at each sequence length, layouts
   interleaved, and the ratio of ring's time to each layout's. Fake devices inside ONE process share
   XLA's thread pool: a device idled by the causal mask lends its core to the busy one, and
   ring's imbalance disappears from the clock. So by default each device is its own process,
   pinned to its own core (os.sched_setaffinity), joined with jax.distributed on 127.0.0.1, and
   every timed call ends with a global barrier so that process 0 times the slowest device.

3. --documents: the wall clock on rows of packed documents, masked (segment ids), balanced
   included: every layout attends over the same q, k, v in natural order, laid out by its own
   `order` (parallel.row_order). "path tiles" is the cost model's critical path for those rows
   (a device's rows summed per ring step), what the clock should follow.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

from planner.calibration.timing import interleaved
from planner.documents import stdlib_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYOUTS = ("ring", "striped", "zigzag")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8, 16],
                   help="ring sizes N for the tile counts")
    p.add_argument("--tiles-per-block", type=int, default=8, help="T, tiles per block side")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[8192, 16384],
                   help="sequence lengths for the wall clock")
    p.add_argument("--processes", type=int, default=2,
                   help="wall clock with one pinned process per device (1: fake devices in one "
                        "process, which hides load imbalance)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per layout and mode")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--strategies", nargs="+", default=["ring"],
                   help="parallel.attention's strategies for the wall clock, interleaved with "
                        "the layouts (e.g. ring allgather)")
    p.add_argument("--kernel", default="auto", help="parallel.attention's kernel")
    p.add_argument("--documents", help="wall clock with packed documents masked, balanced "
                   "included: a length spec (exp:2048, lognormal:MU:SIGMA, pareto:ALPHA:MIN) or "
                   "stdlib (the default config's own rows)")
    p.add_argument("--no-wallclock", action="store_true", help="tile counts only")
    p.add_argument("--no-tiles", action="store_true", help="wall clock only")
    p.add_argument("--segments", help=argparse.SUPPRESS)  # the parent's segment ids, for workers
    p.add_argument("--json", help="write every figure to this JSON file")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------- tile counts (one process)

def tile_table(shards, tiles_per_block):
    import jax
    import numpy as np
    import parallel
    from parallel import cost

    tile = 4
    rows = []
    for n in shards:
        seq_len = n * tiles_per_block * tile
        mesh = parallel.make_mesh(1, n, devices=jax.devices()[:n])
        x = np.zeros((1, seq_len, 1, 8), np.float32)
        ideal = cost.ideal_tiles(seq_len, n, tile, tile)
        for layout in LAYOUTS:
            _, tiles, _ = parallel.attention_with_stats(x, x, x, mesh=mesh, layout=layout,
                                                     tile_q=tile, tile_k=tile)
            tiles = np.asarray(tiles)
            path = cost.critical_path(tiles)
            rows.append(dict(layout=layout, shards=n, tiles_per_block=tiles_per_block,
                             critical_path_tiles=path, ideal_tiles=ideal,
                             efficiency=ideal / path, per_step_max=tiles.max(axis=0).tolist()))
    for row in rows:
        ring = next(r for r in rows if r["shards"] == row["shards"] and r["layout"] == "ring")
        row["ring_over_layout"] = ring["critical_path_tiles"] / row["critical_path_tiles"]
    return rows


def print_tile_table(rows):
    print(f"critical path in tiles (T={rows[0]['tiles_per_block']} tiles per block side)")
    print(f"{'N':>3} {'layout':<8} {'path':>6} {'ideal':>8} {'efficiency':>10} {'ring/this':>9}")
    for r in rows:
        print(f"{r['shards']:>3} {r['layout']:<8} {r['critical_path_tiles']:>6} "
              f"{r['ideal_tiles']:>8.1f} {r['efficiency']:>10.3f} {r['ring_over_layout']:>9.2f}")


# ---------------------------------------------------------------- wall clock

def segment_rows(args):
    """{seq_len: segment ids [batch, seq_len] in natural order} for --documents (else {})."""
    if not args.documents:
        return {}
    from data.document_lengths import packed_segment_ids
    if args.documents != "stdlib":
        return {s: packed_segment_ids(args.documents, args.batch, s) for s in args.seq_lens}
    workdir = os.path.join(ROOT, "runs", "bench_documents")  # its tokenizer and token cache
    return {s: stdlib_rows(s, args.batch, workdir) for s in args.seq_lens}


def layout_inputs(layouts, seg, num_shards, tile):
    """{layout: (order, segment ids in layout order)}; (None, None) for one document."""
    import numpy as np
    import parallel

    if seg is None:
        return {layout: (None, None) for layout in layouts}
    out = {}
    for layout in layouts:
        order = parallel.row_order(layout, seg, num_shards, tile=tile)
        out[layout] = (order, np.take_along_axis(seg, order, 1))
    return out


def time_layouts(args, mesh, sync, segments):
    """Medians of forward and forward+backward per (seq_len, layout), layouts interleaved; with
    documents, each layout attends over the same natural-order q, k, v laid out its own way."""
    import jax
    import numpy as np
    import parallel
    from parallel import cost

    layouts = LAYOUTS + (("balanced",) if segments else ())
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    put = lambda x: jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
    results = []
    for seq_len in args.seq_lens:
        rng = np.random.default_rng(seq_len)
        full = {name: rng.standard_normal((args.batch, seq_len, heads, args.head_dim),
                                          np.float32)
                for name, heads in (("q", args.heads), ("k", args.kv_heads),
                                    ("v", args.kv_heads), ("dout", args.heads))}
        n = mesh.shape["seq"]
        tile = seq_len // n // args.tiles_per_block
        seg = segments.get(seq_len)
        programs, paths = {}, {}
        kinds = [(layout, strategy, inputs) for layout, inputs
                 in layout_inputs(layouts, seg, n, tile).items() for strategy in args.strategies]
        for layout, strategy, (order, seg_l) in kinds:
            take = (lambda x: x) if order is None else (
                lambda x, o=order: np.take_along_axis(x, o[:, :, None, None], 1))
            q, k, v, dout = (put(take(full[name])) for name in ("q", "k", "v", "dout"))
            # order and segment ids are arguments: a multi-process jit cannot close over them.
            extra = () if order is None else (put(order), put(seg_l))

            def attend(q, k, v, *extra, layout=layout, strategy=strategy):
                kw = dict(zip(("order", "segment_ids"), extra))
                return parallel.attention(q, k, v, mesh=mesh, layout=layout, tile_q=tile,
                                          tile_k=tile, strategy=strategy,
                                          kernel=args.kernel, **kw)

            def attend_vjp(q, k, v, do, *extra, attend=attend):
                return jax.vjp(lambda q, k, v: attend(q, k, v, *extra), q, k, v)[1](do)

            fwd, fwd_bwd = jax.jit(attend), jax.jit(attend_vjp)
            programs[(layout, strategy, "forward")] = lambda f=fwd, a=(q, k, v, *extra): f(*a)
            programs[(layout, strategy, "forward+backward")] = (
                lambda f=fwd_bwd, a=(q, k, v, dout, *extra): f(*a))
            if seg is not None:  # the rows of one device run together: sum them, then the path
                counts = cost.layout_tile_counts(layout, seg, n, tile, tile).sum(axis=0)
                paths[layout] = cost.critical_path(counts)
        times = interleaved(programs, args.reps, after=sync)  # kinds alternate every rep
        for (layout, strategy, mode), ts in times.items():
            results.append(dict(seq_len=seq_len, layout=layout, strategy=strategy, mode=mode,
                                median_s=statistics.median(ts), times_s=ts,
                                critical_path_tiles=paths.get(layout)))
    def twin(r, **changed):
        """The result that differs from r only in `changed`."""
        want = dict({k: r[k] for k in ("seq_len", "mode", "layout", "strategy")}, **changed)
        return next(x for x in results if all(x[k] == v for k, v in want.items()))

    for r in results:
        r["ring_over_layout"] = twin(r, layout="ring")["median_s"] / r["median_s"]
        r["ring_strategy_over_this"] = twin(r, strategy="ring")["median_s"] / r["median_s"]
    return results


def print_time_table(rows, setup):
    print(f"wall clock, {setup}")
    print("ring/this: the ring layout's time (same strategy) / this; ring strat/this: the ring "
          "strategy's time (same layout) / this")
    print(f"{'seq':>6} {'mode':<17} {'layout':<9} {'strategy':<10} {'median s':>9} "
          f"{'ring/this':>9} {'ring strat/this':>15} {'path tiles':>10}")
    for r in rows:
        path = "-" if r.get("critical_path_tiles") is None else r["critical_path_tiles"]
        print(f"{r['seq_len']:>6} {r['mode']:<17} {r['layout']:<9} {r['strategy']:<10} "
              f"{r['median_s']:>9.3f} {r['ring_over_layout']:>9.2f} "
              f"{r['ring_strategy_over_this']:>15.2f} {path:>10}")


def worker_main(args):
    """One process of the pinned multi-process wall clock; process 0 prints JSON results."""
    os.sched_setaffinity(0, {args.worker % os.cpu_count()})
    import jax
    from jax._src import distributed

    jax.config.update("jax_num_cpu_devices", 1)
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.worker)
    import parallel

    mesh = parallel.make_mesh(1, args.processes)
    barriers = iter(range(10**9))
    segments = {}
    if args.segments:
        import numpy as np
        with np.load(args.segments) as saved:
            segments = {int(name): saved[name] for name in saved.files}

    def sync():
        # A barrier in the coordination service: the process that finished first sleeps in a
        # gRPC call. (A device psum barrier, as in multihost_utils.sync_global_devices, keeps
        # the waiting process busy in gloo and was measured to slow the other one down.)
        distributed.global_state.client.wait_at_barrier(f"bench{next(barriers)}", 600_000)

    rows = time_layouts(args, mesh, sync, segments)
    if args.worker == 0:
        print("RESULTS " + json.dumps(rows), flush=True)
    jax.distributed.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wallclock_multiprocess(args, segments):
    import tempfile

    import numpy as np

    port = free_port()
    saved = tempfile.NamedTemporaryFile(suffix=".npz", delete=False)
    np.savez(saved, **{str(s): seg for s, seg in segments.items()})
    saved.close()
    passthrough = ["--segments", saved.name, "--seq-lens", *map(str, args.seq_lens),
                   "--processes", str(args.processes), "--reps", str(args.reps),
                   "--batch", str(args.batch), "--heads", str(args.heads),
                   "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
                   "--tiles-per-block", str(args.tiles_per_block),
                   "--strategies", *args.strategies, "--kernel", args.kernel]
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *passthrough,
                               "--worker", str(i), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True, env=env)
             for i in range(args.processes)]
    try:
        outputs = [p.communicate(timeout=3000)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        os.unlink(saved.name)
    if any(p.returncode for p in procs):
        sys.exit(f"bench worker failed: exit codes {[p.returncode for p in procs]}")
    line = next(l for l in outputs[0].splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def main():
    args = parse_args()
    if args.worker is not None:
        return worker_main(args)
    devices_needed = max(args.shards + [args.processes])
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={devices_needed}")
    import jax

    from data import DataError
    from data.document_lengths import parse_length_spec
    try:
        if args.documents not in (None, "stdlib"):
            parse_length_spec(args.documents)
    except DataError as e:
        sys.exit(f"bench_attention: --documents: {e}")
    print(f"jax {jax.__version__}, {os.cpu_count()} cores, "
          f"heads {args.heads}/{args.kv_heads} x {args.head_dim}, batch {args.batch}")
    report = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "port")}}
    if not args.no_tiles:
        report["tiles"] = tile_table(args.shards, args.tiles_per_block)
        print_tile_table(report["tiles"])
    if not args.no_wallclock:
        segments = segment_rows(args)
        if args.processes > 1:
            setup = f"{args.processes} processes, one pinned core and one device each"
            rows = wallclock_multiprocess(args, segments)
        else:
            setup = "1 process, 2 fake devices sharing the cores (hides load imbalance)"
            mesh = __import__("parallel").make_mesh(1, 2, devices=jax.devices()[:2])
            rows = time_layouts(args, mesh, lambda: None, segments)
        if args.documents:
            setup += f"; documents {args.documents}, masked"
        report["wallclock"] = rows
        report["wallclock_setup"] = setup
        print()
        print_time_table(rows, setup)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
