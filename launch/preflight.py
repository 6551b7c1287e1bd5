"""What every engine does before it pays for anything: the command line read into a TrainRun
(config file, workdir, train.py's --config.FIELD=VALUE overrides), and the check of that run
on this machine, in this process (training/analysis/run_plan.py, what scripts/plan.py --check
prints): the TPU compiler's per-chip bytes for a TPU slice, the planner's memory verdict for
GPUs. A config mistake is one line here (exit 2), a run that does not fit one line (exit 1),
and nothing is submitted, created or started.

    run = TrainRun("configs/tiny.py", "/shared/r", ("--config.num_train_steps=50",))
    run_check(Check(run, device="h100-80gb", devices=16), "the memory check", dry_run=False)
    + .venv/bin/python scripts/plan.py --config=configs/tiny.py --compile=no --check \
        --device=h100-80gb --devices=16 --config.num_train_steps=50
    check: 0.02 GB per device (NVIDIA H100 80GB: 85.52 GB), FITS (the planner's estimate)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
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


@dataclasses.dataclass(frozen=True)
class Check:
    """The check a launcher runs on this machine before it pays for anything: the run planned
    for the job's devices (a planner device and count; the TPU compiler for a TPU slice, with
    compile='tpu'), as scripts/plan.py --check would plan it."""

    run: TrainRun
    compile: str = "no"
    device: str | None = None
    devices: int | None = None
    topology: str | None = None
    num_slices: int = 1

    def command(self) -> list[str]:
        """The same check as a command line (scripts/plan.py --check): what the launcher prints
        as `+ COMMAND`, for anyone who wants to run it, or read it, alone."""
        cmd = [project_python(), str(REPO / "scripts" / "plan.py"), f"--config={self.run.config}",
               f"--compile={self.compile}"]
        if self.compile != "tpu":  # the TPU compiler's verdict stops plan.py without it
            cmd.append("--check")
        if self.device:
            cmd.append(f"--device={self.device}")
        if self.devices:
            cmd.append(f"--devices={self.devices}")
        if self.topology:
            cmd.append(f"--topology={self.topology}")
        if self.num_slices > 1:
            cmd.append(f"--num_slices={self.num_slices}")
        return [*cmd, *self.run.overrides]


def run_check(check: Check, what: str, dry_run: bool, stream=None,
              skip_flag: str = "--skip-check") -> None:
    """Runs the check in this process (printed first as `+ COMMAND`, the equivalent
    scripts/plan.py command, like every command the launcher runs) and prints its verdict lines
    (on `stream`, default stdout); LaunchError for a config mistake, CommandFailed where the run
    does not compile or fit, each one line. Starts JAX, on fake CPU devices: the launchers
    themselves never do."""
    stream = stream or sys.stdout
    print(f"+ {shlex.join(check.command())}", file=stream, flush=True)
    if dry_run:
        return
    with _quiet():  # everything the check prints, JAX's and libtpu's own lines included
        outcome = _checked(check)
    if isinstance(outcome, ImportError):  # a Python without the project: the launcher needs none
        raise LaunchError(f"the check needs the project's environment ({outcome}): run the "
                          f"launcher with {project_python()} (make install), or {skip_flag}")
    if isinstance(outcome, LaunchError):
        raise outcome
    if isinstance(outcome, Exception):
        raise CommandFailed(f"{what}: {outcome} (nothing was submitted, created or started; "
                            f"{skip_flag} launches anyway)")
    print("\n".join(outcome), file=stream, flush=True)


def _checked(check: Check):
    """The verdict lines of the check, or the exception that says why not: a LaunchError for a
    mistake in the config or the request, the ImportError of a Python without the project, the
    refusal of a run that does not compile or fit."""
    try:
        import jax  # noqa: F401
    except ImportError as e:
        return e
    import run_config
    from data import DataError
    from planner.documents import PlanError
    from planner.reports.text import format_tpu_compiled
    from planner.topology import TopologyError
    from training.analysis import run_plan
    from training.cli import read_config_file
    try:
        config = run_config.build(read_config_file(str(REPO / check.run.config),
                                                   check.run.overrides))
        target = run_plan.plan_target(config, str(REPO / check.run.config), check.device,
                                      check.devices or 0, check.compile, check.topology,
                                      check.num_slices)
        planned = run_plan.plan_run(config, target, check.compile)
        lines = []
        if planned.tpu_slice is not None:
            run_plan.compile_for_tpu(planned, config)
            lines = format_tpu_compiled(planned.plan).splitlines()[:3]
        verdict = run_plan.fit_verdict(planned)
    except (run_plan.PlanInputError, run_config.ConfigError, DataError, PlanError,
            TopologyError) as e:
        return LaunchError(str(e))
    except (run_plan.CompileRefused, run_plan.DoesNotFit) as e:
        return e
    return lines + ([verdict] if verdict else [])


@contextlib.contextmanager
def _quiet():
    """This process's stdout and stderr, file descriptors and all, into a scratch file while the
    check works: what the planner notes, the compiler's progress and JAX's and libtpu's own
    warnings are plan.py's to print, not the launcher's, whose output is its commands and one
    line of verdict."""
    import tempfile
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 1)
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
