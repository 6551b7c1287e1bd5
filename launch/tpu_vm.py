"""A Cloud TPU VM slice by hand (scripts/tpu_pod.py): create it, copy the code, train, follow,
delete, each a list of commands built here and run (or, with dry_run, printed) by `execute`.
Queued resources, which ask for the slice, wait for it and start the run again after a
preemption, are launch/tpu.py (scripts/launch.py tpu). The command line's options come in as
`args`, scripts/tpu_pod.py's argparse namespace. Standard library only, but for the compile
check (launch/preflight.py), which starts JAX in this process.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from launch.preflight import Check, CommandFailed, TrainRun, run_check
from launch.run_env import forwarded, hide_secrets
from launch.tpu_worker import (REMOTE_TARBALL, bootstrap_script, local_tarball, logs_script,
                               run_script, tar_command)


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


def compile_check(args) -> Check:
    """The TPU compiler's check of the run for the slice, on this machine, before a slice is
    paid for (training/analysis/run_plan.py; scripts/plan.py --compile tpu alone)."""
    return Check(TrainRun(args.config, args.workdir, tuple(args.overrides)), compile="tpu",
                 topology=args.accelerator_type)


def check_compiles(args) -> None:
    """Runs the compile check, printed as `+ COMMAND` like every command; CommandFailed, one
    line, when the step does not compile or does not fit the chips."""
    if not args.skip_compile_check:
        run_check(compile_check(args), f"compile check for {args.accelerator_type}",
                  args.dry_run, skip_flag="--skip-compile-check")


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
