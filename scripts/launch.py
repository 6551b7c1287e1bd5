"""Launch train.py through a cluster's scheduler: SLURM, Cloud TPU queued resources, GKE.

    python scripts/launch.py slurm --config configs/llama_1b.py --workdir /shared/runs/l1b \
        --nodes 2 --tasks-per-node 8 --gpus-per-task 1 --partition gpu --time 24:00:00 \
        --config.num_train_steps=20000
    python scripts/launch.py slurm ... --print          # the batch script; nothing submitted

Each engine takes train.py's config file and --config.FIELD=VALUE overrides, checks the run on
this machine before anything is paid for (scripts/plan.py --check: the planner's memory verdict
for GPUs; --skip-check to go anyway), and gives the run one preemption rule: train.py saves at
the step the notice arrives and exits 75; the engine starts it again and it resumes there
(launch/README.md). The work is in the package launch/; this file reads the command line.

Exit codes: 0 submitted (or printed), 1 a command failed or the run does not fit, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import slurm  # noqa: E402
from launch.preflight import (CommandFailed, LaunchError, TrainRun, check_command,  # noqa: E402
                              project_python, repo_config, run_check, split_overrides)


def _train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="config file, e.g. configs/tiny.py")
    parser.add_argument("--workdir", required=True, help="train.py's --workdir")
    parser.add_argument("--skip-check", action="store_true",
                        help="launch without scripts/plan.py's check of the run")
    parser.add_argument("--device", help="the planner's device for the check (planner.DEVICES; "
                                         "default: the config's DEVICE)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "train.py's overrides (--config.FIELD=VALUE) may stand anywhere."))
    engines = parser.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    s = engines.add_parser("slurm", help="write a batch script into WORKDIR/launch and sbatch it")
    _train_options(s)
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--tasks-per-node", type=int, default=1,
                   help="processes a node: one a GPU (with --gpus-per-task 1)")
    s.add_argument("--gpus-per-task", type=int, default=0, help="0: CPU nodes")
    s.add_argument("--partition")
    s.add_argument("--time", help="time limit (SLURM's formats: minutes, HH:MM:SS, D-HH:MM:SS)")
    s.add_argument("--signal-seconds", type=int, default=300,
                   help="the preemption notice this many seconds before --time ends "
                        "(--signal=TERM@N; default: %(default)s)")
    s.add_argument("--job-name")
    s.add_argument("--log-dir", help="where the script and the job's log go (default: "
                                     "WORKDIR/launch; needed with a gs:// workdir)")
    s.add_argument("--python", default=project_python(),
                   help="the interpreter on the nodes (default: %(default)s)")
    s.add_argument("--sbatch", action="append", default=[], metavar="ARG",
                   help="one more #SBATCH option, e.g. --sbatch=--account=proj (repeatable)")
    s.add_argument("--print", action="store_true",
                   help="print the batch script; write and submit nothing")
    return parser


def run_slurm(args, run: TrainRun) -> None:
    job = slurm.SlurmJob(run, nodes=args.nodes, tasks_per_node=args.tasks_per_node,
                         gpus_per_task=args.gpus_per_task, partition=args.partition,
                         time=args.time, signal_seconds=args.signal_seconds,
                         job_name=args.job_name, log_dir=args.log_dir, python=args.python,
                         sbatch_args=tuple(args.sbatch))
    if args.print:
        print(slurm.batch_script(job), end="")
        return
    if not args.skip_check:
        run_check(check_command(run, device=args.device, devices=job.devices),
                  "the memory check", dry_run=False)
    job_id = slurm.submit(job)
    log = os.path.join(job.directory, f"slurm-{job_id}.log")
    print(f"submitted job {job_id}: log {log}\n"
          f"  watch: squeue -j {job_id}; tail -f {log}\n"
          f"  preempt (saves, requeues, resumes): scancel --signal=TERM {job_id}\n"
          f"  stop for good (saves within the grace time): scancel {job_id}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        own, overrides = split_overrides(argv)
        args = build_parser().parse_args(own)
        workdir = args.workdir if args.workdir.startswith("gs://") else os.path.abspath(
            args.workdir)
        run = TrainRun(repo_config(args.config), workdir, overrides)
        {"slurm": run_slurm}[args.engine](args, run)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except CommandFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
