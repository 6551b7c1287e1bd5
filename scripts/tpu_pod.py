"""Train ringstripe on a Cloud TPU pod slice: create it, copy the code, train, follow, delete.

    python scripts/tpu_pod.py all --name rs-v4 --zone us-central2-b --config configs/tiny.py \
        --workdir gs://my-bucket/runs/tiny -- --config.num_train_steps=100

Subcommands (each can be run on its own; `all` runs create, setup, run, logs, then delete):

  (check) before `run` and `all` touch a slice, scripts/plan.py --compile tpu --topology
          ACCELERATOR_TYPE compiles the train step with the TPU compiler on this machine and
          stops, one line, if it does not compile or fit the chips (--skip-compile-check)
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
Standard library only, so it runs from any Python without the project installed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What runs on each worker (the bootstrap, starting and following train.py), and the checks of
# the command line: launch/, shared with scripts/launch.py tpu (standard library only).
from launch.tpu_inputs import (REPO, InputError,  # noqa: E402
                               check_accelerator_type, check_name, check_no_bucket,
                               check_run_inputs)
from launch.run_env import forwarded, hide_secrets  # noqa: E402
from launch.tpu_worker import (REMOTE_TARBALL, bootstrap_script, local_tarball,  # noqa: E402
                               logs_script, run_script, tar_command)


class CommandFailed(Exception):
    """A command exited non-zero (or could not start): reported as one line, exit code 1."""


# ---------------------------------------------------------------------------------------------
# Commands. Each builder returns argv lists; nothing here runs anything, so --dry-run prints
# exactly what a real run executes.
# ---------------------------------------------------------------------------------------------

def gcloud_tpu(args, verb: str, *rest: str) -> list[str]:
    """`gcloud compute tpus tpu-vm VERB ...` with the zone (and project) every call needs."""
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", verb, *rest, f"--zone={args.zone}"]
    if args.project:
        cmd.append(f"--project={args.project}")
    return cmd


def ssh(args, worker: str, script: str) -> list[str]:
    """Runs `script` with bash on `worker` ("all" or an index). Wrapping it in `bash -c` makes
    it independent of the remote login shell and keeps it one shell word for gcloud."""
    return gcloud_tpu(args, "ssh", args.name, f"--worker={worker}",
                      f"--command={shlex.join(['bash', '-c', script])}")


def create_commands(args) -> list[list[str]]:
    cmd = gcloud_tpu(args, "create", args.name, f"--accelerator-type={args.accelerator_type}",
                     f"--version={args.version}")
    if args.preemptible:
        cmd.append("--preemptible")
    if args.spot:
        cmd.append("--spot")
    return [cmd]


def setup_commands(args) -> list[list[str]]:
    tarball = local_tarball(args.name)
    return [
        tar_command(tarball),
        # --recurse matters only for directories; harmless for the one tarball.
        gcloud_tpu(args, "scp", tarball, f"{args.name}:{REMOTE_TARBALL}", "--worker=all",
                   "--recurse"),
        ssh(args, "all", bootstrap_script(args.python)),
    ]


def compile_check_command(args) -> list[str]:
    """scripts/plan.py --compile tpu for the slice: the TPU compiler, on this machine, says
    whether the train step compiles and fits the chips before a slice is paid for. Runs with
    the project's .venv when there is one (this file itself needs only the standard library)."""
    venv = REPO / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    return [python, str(REPO / "scripts" / "plan.py"), f"--config={args.config}",
            "--compile=tpu", f"--topology={args.accelerator_type}", *args.overrides]


def check_compiles(args) -> None:
    """Runs the compile check (printed as `+ COMMAND` like every command); CommandFailed with
    plan.py's one-line reason when the step does not compile or does not fit."""
    if args.skip_compile_check:
        return
    cmd = compile_check_command(args)
    print(f"+ {shlex.join(cmd)}", flush=True)
    if args.dry_run:
        return
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    except OSError as e:
        raise CommandFailed(f"the compile check could not start: {e}") from None
    lines = result.stdout.splitlines()  # the compiler's three lines: bytes, total, verdict
    at = next((i for i, ln in enumerate(lines) if ln.startswith("TPU compiler")), None)
    if at is not None:
        print("\n".join(lines[at:at + 3]), flush=True)
    if result.returncode:
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
        reason = errors[-1][len("error: "):] if errors else (
            result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        raise CommandFailed(f"compile check for {args.accelerator_type}: {reason} (nothing was "
                            f"created or started; --skip-compile-check launches anyway)")


def run_commands(args) -> list[list[str]]:
    return [ssh(args, "all", run_script(args.remote_config, args.workdir, args.overrides,
                                        env=forwarded()))]


def logs_commands(args) -> list[list[str]]:
    return [ssh(args, str(args.worker), logs_script())]


def delete_commands(args) -> list[list[str]]:
    return [gcloud_tpu(args, "delete", args.name, "--quiet")]


# ---------------------------------------------------------------------------------------------
# Execution.
# ---------------------------------------------------------------------------------------------

def execute(commands: list[list[str]], dry_run: bool) -> None:
    """Prints each command as `+ COMMAND` and, unless dry_run, runs it; stops at the first one
    that fails."""
    for cmd in commands:
        print(f"+ {hide_secrets(shlex.join(cmd))}", flush=True)
        if dry_run:
            continue
        try:
            subprocess.run(cmd, check=True)
        except subprocess.CalledProcessError as e:
            raise CommandFailed(f"`{hide_secrets(shlex.join(cmd))}` exited with code "
                                f"{e.returncode}") from None
        except OSError as e:  # e.g. tar missing
            raise CommandFailed(f"`{hide_secrets(shlex.join(cmd))}` could not start: {e}") from None


def run_all(args) -> None:
    """The compile check, then create, setup, run, logs, delete (unless --keep). If anything
    after create fails or is interrupted, the TPU is left up for inspection and the way to
    delete it is printed."""
    check_compiles(args)
    execute(create_commands(args), args.dry_run)
    delete_hint = (f"; the TPU {args.name} is still up, delete it with: "
                   f"{shlex.join(delete_commands(args)[0])}")
    following = False
    try:
        execute(setup_commands(args) + run_commands(args), args.dry_run)
        following = True
        execute(logs_commands(args), args.dry_run)
    except CommandFailed as e:
        raise CommandFailed(f"{e}{delete_hint}") from None
    except KeyboardInterrupt:
        # Ctrl-C while following the log means "stop watching", not "throw the run away".
        what = "stopped following the log; training goes on" if following else "interrupted"
        print(f"\n{what}{delete_hint}", file=sys.stderr)
        sys.exit(130)
    if args.keep:
        print(f"kept {args.name} (--keep){delete_hint}", file=sys.stderr)
    else:
        execute(delete_commands(args), args.dry_run)


PLANS = {"create": create_commands, "setup": setup_commands, "run": run_commands,
         "logs": logs_commands, "delete": delete_commands}


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
