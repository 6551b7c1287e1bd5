"""Train ringstripe on a Cloud TPU pod slice: create it, copy the code, train, follow, delete.

    python scripts/tpu_pod.py all --name rs-v4 --zone us-central2-b --config configs/tiny.py \
        --workdir gs://my-bucket/runs/tiny -- --config.num_train_steps=100

Subcommands (each can be run on its own; `all` runs create, setup, run, logs, then delete):

  (check) before `run` and `all` touch a slice, the TPU compiler compiles the train step for
          ACCELERATOR_TYPE on this machine, in this process (printed as the equivalent
          scripts/plan.py --compile tpu command), and it stops, one line, if it does not
          compile or fit the chips (--skip-compile-check)
  create  gcloud compute tpus tpu-vm create (default v4-32, tpu-ubuntu2204-base)
  setup   tar the working tree, scp it to every worker, and run an idempotent bootstrap there:
          the venv is made only if missing, and `pip install -c constraints.txt -e . jax[tpu]`
          runs only when pyproject.toml or constraints.txt changed since the last install (their
          sha256 is kept inside the venv)
  run     start train.py --distributed under nohup on every worker (log in ~/train.log); a
          --workdir gs://BUCKET/PATH is passed on unchanged: train.py writes the bucket itself
          with the TPU's service account, nothing is mounted (a local workdir is each worker's
          own disk, with a warning)
  logs    follow ~/train.log on one worker until its train.py exits
  delete  gcloud compute tpus tpu-vm delete --quiet

--dry-run prints every command, one per line as `+ COMMAND`, shell-quoted exactly as it would
run, and runs nothing. Arguments after `--` go to train.py unchanged (--config.FIELD=VALUE).
Exit codes: 0 done, 1 a command failed, 2 bad input or no gcloud, 130 interrupted.
Standard library only but for the compile check, which needs the project's environment
(make install; --skip-compile-check does without). The commands are built in launch/tpu_vm.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The commands (launch/tpu_vm.py), what runs on each worker and the checks of the command line:
# launch/, shared with scripts/launch.py tpu.
from launch.preflight import CommandFailed  # noqa: E402
from launch.tpu_inputs import (InputError, check_accelerator_type, check_name,  # noqa: E402
                               check_no_bucket, check_run_inputs)
from launch.tpu_vm import PLANS, check_compiles, execute, run_all, run_commands  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="TPU name (lowercase letters, digits, -)")
    common.add_argument("--zone", required=True, help="e.g. us-central2-b (where v4 lives)")
    common.add_argument("--project", help="Google Cloud project (default: gcloud's own setting)")
    common.add_argument("--accelerator-type", default="v4-32",
                        help="slice type, e.g. v4-32, v5litepod-16 (default: %(default)s)")
    common.add_argument("--version", default="tpu-ubuntu2204-base",
                        help="TPU VM software version (default: %(default)s)")
    common.add_argument("--dry-run", action="store_true",
                        help="print every command as `+ COMMAND`, exactly as it would run, and "
                             "run nothing")

    capacity = argparse.ArgumentParser(add_help=False)
    group = capacity.add_mutually_exclusive_group()
    group.add_argument("--preemptible", action="store_true", help="create a preemptible TPU")
    group.add_argument("--spot", action="store_true", help="create a Spot TPU")

    setup = argparse.ArgumentParser(add_help=False)
    setup.add_argument("--python", default="python3.11",
                       help="interpreter for the workers' venv, Python 3.11+; installed with "
                            "apt when missing (default: %(default)s)")
    # Hidden: it mounted the bucket with gcsfuse, which is gone; given, it is refused in one line.
    setup.add_argument("--bucket", help=argparse.SUPPRESS)

    train = argparse.ArgumentParser(add_help=False)
    train.add_argument("--config", required=True,
                       help="config file inside this repository, e.g. configs/tiny.py")
    train.add_argument("--workdir", required=True,
                       help="train.py's --workdir, passed on unchanged; normally a bucket path "
                            "such as gs://BUCKET/runs/NAME, which train.py writes directly: "
                            "every worker shares it and it outlives the TPU (a local path is "
                            "each worker's own disk)")
    train.add_argument("--skip-compile-check", action="store_true",
                       help="do not compile the train step for the slice first (scripts/plan.py "
                            "--compile tpu: seconds here against an out-of-memory on the pod)")

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Training overrides go after `--`, e.g. -- --config.num_train_steps=100.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("create", parents=[common, capacity], help="create the TPU VM slice")
    sub.add_parser("setup", parents=[common, setup],
                   help="copy the code to every worker and bootstrap its venv (idempotent)")
    sub.add_parser("run", parents=[common, train],
                   help="start train.py --distributed on every worker (-- overrides)")
    logs = sub.add_parser("logs", parents=[common], help="follow ~/train.log on one worker")
    logs.add_argument("--worker", type=int, default=0, help="worker index (default: 0)")
    sub.add_parser("delete", parents=[common], help="delete the TPU VM slice")
    everything = sub.add_parser("all", parents=[common, capacity, setup, train],
                                help="create, setup, run, logs, then delete unless --keep")
    everything.add_argument("--keep", action="store_true", help="do not delete the TPU at the end")
    everything.set_defaults(worker=0)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after the first `--` is for train.py, untouched by argparse.
    split = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1:]
    if args.overrides and args.command not in ("run", "all"):
        parser.error(f"training overrides after -- only apply to run and all, not "
                     f"{args.command}")
    try:
        check_no_bucket(args)
        check_name(args.name)
        check_accelerator_type(args.accelerator_type)
        if args.command in ("run", "all"):
            notes = check_run_inputs(args)
        else:
            notes = []
        if not args.dry_run and shutil.which("gcloud") is None:
            raise InputError("gcloud is not on PATH: install the Google Cloud SDK "
                             "(https://cloud.google.com/sdk/docs/install) or use --dry-run to "
                             "print the commands")
        # Only now, so that bad input stays a single line.
        for note in notes:
            print(note, file=sys.stderr)
        if args.command == "all":
            run_all(args)
        elif args.command == "run":
            check_compiles(args)
            execute(run_commands(args), args.dry_run)
        else:
            execute(PLANS[args.command](args), args.dry_run)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except CommandFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        following = args.command == "logs"
        print("\nstopped following the log; training goes on" if following else "\ninterrupted",
              file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
