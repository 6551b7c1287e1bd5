"""Launch train.py through a cluster's scheduler: SLURM, Cloud TPU queued resources, GKE.

    python scripts/launch.py slurm --config configs/gpu/llama_1b.py --workdir /shared/runs/l1b \
        --nodes 2 --tasks-per-node 8 --gpus-per-task 1 --partition gpu --time 24:00:00 \
        --config.num_train_steps=20000
    python scripts/launch.py slurm ... --print          # the batch script; nothing submitted

Each engine takes train.py's config file and --config.FIELD=VALUE overrides, checks the run on
this machine before anything is paid for (scripts/plan.py --check: the planner's memory verdict
for GPUs; --skip-check to go anyway), and gives the run one preemption rule: train.py saves at
the step the notice arrives and exits 75; the engine starts it again and it resumes there
(launch/README.md). The engines are the package launch/'s (launch/engines.py: ENGINES, one
subcommand each); this file reads the command line.

Exit codes: 0 submitted (or printed), 1 a command failed or the run does not fit, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.engine import train_options  # noqa: E402
from launch.engines import ENGINES  # noqa: E402
from launch.preflight import (CommandFailed, LaunchError, TrainRun, repo_config,  # noqa: E402
                              split_overrides)
from launch.tpu_inputs import InputError  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "train.py's overrides (--config.FIELD=VALUE) may stand anywhere."))
    subcommands = parser.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    for engine in ENGINES.values():
        sub = subcommands.add_parser(engine.name, help=engine.help)
        train_options(sub)
        engine.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        own, overrides = split_overrides(argv)
        args = build_parser().parse_args(own)
        engine = ENGINES[args.engine]
        workdir = args.workdir or engine.default_workdir(args)
        workdir = workdir if workdir.startswith("gs://") else os.path.abspath(workdir)
        run = TrainRun(repo_config(args.config), workdir, overrides)
        engine.launch(args, run)
    except (LaunchError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except CommandFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
