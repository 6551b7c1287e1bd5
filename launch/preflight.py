"""What every engine does before it pays for anything: the command line read into a TrainRun
(config file, workdir, train.py's --config.FIELD=VALUE overrides), and scripts/plan.py's check
of that run on this machine: the TPU compiler's per-chip bytes for a TPU slice, the planner's
memory verdict for GPUs. A config mistake is one line here (exit 2), a run that does not fit
one line (exit 1), and nothing is submitted, created or started.

    run = split_train_args(["--config", "configs/tiny.py", "--workdir", "/shared/r",
                            "--config.num_train_steps=50"], ...)
    check_command(run, device="h100-80gb", devices=16)
    -> [".venv/bin/python", "scripts/plan.py", "--config=configs/tiny.py", "--compile=no",
        "--check", "--device=h100-80gb", "--devices=16", "--config.num_train_steps=50"]
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREEMPTED_EXIT_CODE = 75  # checkpoints.PREEMPTED_EXIT_CODE (not imported: it would start JAX)


class LaunchError(Exception):
    """A mistake in the command line or the run's config: one line, exit code 2."""


class CommandFailed(Exception):
    """A command the launcher ran failed, or the run does not fit: one line, exit code 1."""


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """What train.py is started with on every worker: the config file, relative to the
    repository (the workers run from its root), the workdir, the --config.FIELD overrides."""

    config: str
    workdir: str
    overrides: tuple[str, ...] = ()

    def train_args(self) -> list[str]:
        return ["train.py", f"--config={self.config}", f"--workdir={self.workdir}",
                *self.overrides]


def split_overrides(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(the launcher's own arguments, train.py's --config.FIELD=VALUE overrides). Overrides may
    stand anywhere, as in train.py; everything after a `--` is train.py's too."""
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    else:
        rest = []
    own = [a for a in argv if not a.startswith("--config.")]
    overrides = [a for a in argv if a.startswith("--config.")] + rest
    bad = [o for o in overrides if not o.startswith("--config.")]
    if bad:
        raise LaunchError(f"{shlex.join(bad)} is not a --config.FIELD=VALUE override: give "
                          f"train.py's config fields as --config.num_train_steps=100")
    unset = [o for o in overrides if "=" not in o]
    if unset:
        raise LaunchError(f"{unset[0]} has no value: write it as {unset[0]}=VALUE")
    return own, tuple(overrides)


def repo_config(config: str) -> str:
    """The config file's path relative to the repository root, where train.py runs on the
    workers; one line where the file is missing or lies outside the repository."""
    path = Path(config).expanduser()
    if not path.is_file():
        raise LaunchError(f"config file {config!r} does not exist: give a file such as "
                          f"configs/tiny.py")
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        raise LaunchError(f"config {config!r} is outside {REPO}, where the workers run "
                          f"train.py: put it under configs/") from None


def project_python() -> str:
    """The project's .venv interpreter where there is one, else this one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def check_command(run: TrainRun, compile: str = "no", device: str | None = None,
                  devices: int | None = None, topology: str | None = None,
                  num_slices: int = 1) -> list[str]:
    """scripts/plan.py --check for the run: exit 1 with one line where it does not fit."""
    cmd = [project_python(), str(REPO / "scripts" / "plan.py"), f"--config={run.config}",
           f"--compile={compile}", "--check"]
    if device:
        cmd.append(f"--device={device}")
    if devices:
        cmd.append(f"--devices={devices}")
    if topology:
        cmd.append(f"--topology={topology}")
    if num_slices > 1:
        cmd.append(f"--num_slices={num_slices}")
    return [*cmd, *run.overrides]


def run_check(cmd: list[str], what: str, dry_run: bool, stream=None) -> None:
    """Runs the check (printed as `+ COMMAND`, like every command the launcher runs) and prints
    its verdict lines (on `stream`, default stdout); LaunchError for a config mistake (plan.py's
    exit 2), CommandFailed where the run does not compile or fit (exit 1), with plan.py's own
    line."""
    stream = stream or sys.stdout
    print(f"+ {shlex.join(cmd)}", file=stream, flush=True)
    if dry_run:
        return
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    except OSError as e:
        raise CommandFailed(f"the check could not start: {e}") from None
    verdicts = [ln for ln in result.stdout.splitlines()
                if ln.startswith(("TPU compiler", "check:"))]
    if verdicts:
        print("\n".join(verdicts), file=stream, flush=True)
    if result.returncode:
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
        reason = errors[-1][len("error: "):] if errors else (
            result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        if result.returncode == 2:
            raise LaunchError(reason)
        raise CommandFailed(f"{what}: {reason} (nothing was submitted, created or started; "
                            f"--skip-check launches anyway)")
