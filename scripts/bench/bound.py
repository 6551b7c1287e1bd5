"""The most any layout can gain over the ring layout on a run's own rows, on this machine.

    python scripts/bench/bound.py                       # configs/default.py, 16,384 tokens, 2 devices
    python scripts/bench/bound.py --steps 80 --tile 256

Times the config's train step on one device pinned to one core (one device's share of a row,
rows of documents of equal lengths) and splits it into a cost per attention tile and the rest
(training/analysis/step_split.py). Then, for the rows the run trains on (global batch 1, train.py's
steps 1, 2, ..), prints the ring layout's critical path and the even share of the row's tiles,
and the step times they give: no layout runs a row faster than the even share, so their ratio
bounds its gain over the ring on that row. scripts/bench/train.py measures the layouts
themselves on the same rows (steps 2 to --bench-steps + 1 there: its first step compiles).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/default.py", help="train.py's config file")
    p.add_argument("--seq-len", type=int, default=16384, help="tokens per row")
    p.add_argument("--processes", type=int, default=2, help="devices the row is split over")
    p.add_argument("--tile", type=int, default=512, help="square attention tile")
    p.add_argument("--steps", type=int, default=20, help="train.py steps whose rows to bound")
    p.add_argument("--bench-steps", type=int, default=4,
                   help="scripts/bench/train.py's timed steps (its --steps), also summarised")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds of the split")
    p.add_argument("--core", type=int, default=0, help="the core the one device is pinned to")
    p.add_argument("--workdir", default="runs/bench_train",
                   help="the data cache (scripts/bench/train.py's: the same rows)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.config = os.path.abspath(args.config) if os.path.exists(args.config) else args.config
    args.workdir = os.path.abspath(args.workdir)
    os.chdir(ROOT)  # the configs by their repository paths
    sys.path.insert(0, ROOT)
    from training.cli import config_file, use_fake_devices
    config = config_file(args.config)  # a missing or broken file: one line, exit 2
    if args.seq_len % (args.processes * args.tile) or args.steps < args.bench_steps + 1:
        sys.exit(f"bench_bound: --seq-len must split into {args.processes} blocks of whole "
                 f"tiles of {args.tile}, and --steps be at least --bench-steps + 1")
    os.sched_setaffinity(0, {args.core})  # one device, one core: as bench_train's processes
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false").strip()
    use_fake_devices(1)
    import run_config
    from data import sample_segment_ids
    from storage.run_dir import RunDir
    from training.analysis.step_split import layout_bound, measure_split

    config = run_config.replace(run_config.build(config), {
        "seq_len": args.seq_len, "global_batch_size": 1,
        "data.cache_dir": RunDir(args.workdir).cache})
    tokens = args.seq_len // args.processes
    split = measure_split(config, tokens, args.tile, args.repeats)
    print(f"train step of {os.path.relpath(args.config, ROOT)} on one device pinned to core {args.core}, {tokens:,} "
          f"tokens, tiles of {args.tile}, documents masked; medians of {args.repeats}:")
    for length, tiles, seconds in split.points:
        print(f"  documents of {length:>6,} tokens: {tiles:>4} tiles, {seconds:.3f} s")
    print(f"  fit: {split.rest_s:.3f} s + {split.tile_s * 1e3:.2f} ms a tile")
    rows = layout_bound(split, sample_segment_ids(config, args.workdir, args.steps),
                        args.processes, args.tile)
    print(f"\nthe run's rows ({args.seq_len:,} tokens over {args.processes} devices): ring "
          f"critical path against the even share, tiles and predicted seconds")
    for step, r in enumerate(rows, start=1):
        print(f"  step {step:>3}: ring {r['ring_tiles']:>4} tiles {r['ring_s']:6.2f} s, even "
              f"{r['even_tiles']:7.1f} tiles {r['even_s']:6.2f} s, bound {r['ratio']:.3f}x")
    bench = rows[1:args.bench_steps + 1]
    print(f"bound on bench_train's steps 2-{args.bench_steps + 1}: median of ratios "
          f"{statistics.median(r['ratio'] for r in bench):.3f}, total time "
          f"{sum(r['ring_s'] for r in bench) / sum(r['even_s'] for r in bench):.3f}")
    print(f"bound on steps 2-{args.steps}: median of ratios "
          f"{statistics.median(r['ratio'] for r in rows[1:]):.3f}, total time "
          f"{sum(r['ring_s'] for r in rows[1:]) / sum(r['even_s'] for r in rows[1:]):.3f}")


if __name__ == "__main__":
    main()
