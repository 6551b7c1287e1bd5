"""Compare the losses of training runs step by step: is a change of layout (or kernel) exact?

    python scripts/compare_losses.py runs/cmp_striped runs/cmp_balanced
    python scripts/compare_losses.py runs/a runs/b --tolerance 2e-4
    python scripts/compare_losses.py runs/moe_a runs/moe_b --metrics moe/share_max  # any metric

Reads every run's WORKDIR/metrics.jsonl (what train.py writes), pairs the steps all runs
logged, and prints train/loss and eval/loss (or the --metrics given) per step for each run,
then the largest absolute difference from the first run. Exit 1 when a difference passes --tolerance (if given), 2 when a
workdir has no metrics or the runs share no step.
"""

from __future__ import annotations

import argparse
import os
import sys

from storage.run_dir import read_metrics

KEYS = ("train/loss", "eval/loss")


def fail(message: str):
    print(f"compare_losses: {message}", file=sys.stderr)
    sys.exit(2)


def read_losses(workdir: str, keys=KEYS) -> dict[int, dict[str, float]]:
    """{step: {key: value}} of the run's metrics.jsonl (storage.run_dir.read_metrics); one line
    and exit 2 for a workdir without one."""
    try:
        return read_metrics(workdir, keys)
    except FileNotFoundError as e:
        fail(str(e))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdirs", nargs="+", help="two or more train.py workdirs")
    p.add_argument("--tolerance", type=float, help="exit 1 if a loss differs by more")
    p.add_argument("--metrics", nargs="+", default=list(KEYS),
                   help="metrics.jsonl keys to compare (default: train/loss eval/loss)")
    args = p.parse_args(argv)
    if len(args.workdirs) < 2:
        fail("give at least two workdirs to compare")
    runs = [read_losses(w, args.metrics) for w in args.workdirs]
    steps = sorted(set.intersection(*(set(r) for r in runs)))
    if not steps:
        fail("the runs share no logged step: compare runs of one config")
    names = [os.path.basename(os.path.normpath(w)) for w in args.workdirs]
    width = max(11, *map(len, args.metrics))
    print(f"{'step':>5} {'metric':<{width}}" + "".join(f"{n:>16}" for n in names)
          + f"{'max |diff|':>12}")
    worst = 0.0
    for step in steps:
        for key in args.metrics:
            if not all(key in r[step] for r in runs):
                continue
            values = [r[step][key] for r in runs]
            diff = max(abs(v - values[0]) for v in values[1:])
            worst = max(worst, diff)
            print(f"{step:>5} {key:<{width}}" + "".join(f"{v:>16.6f}" for v in values)
                  + f"{diff:>12.2e}")
    print(f"largest |difference| from {names[0]}: {worst:.2e} over {len(steps)} steps")
    if args.tolerance is not None and worst > args.tolerance:
        print(f"above the tolerance {args.tolerance:g}")
        sys.exit(1)


if __name__ == "__main__":
    main()
