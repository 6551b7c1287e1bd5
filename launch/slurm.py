"""SLURM: one batch script a run, written into WORKDIR/launch/ and submitted with sbatch.

    job = SlurmJob(run, nodes=2, tasks_per_node=8, gpus_per_task=1, time="24:00:00")
    text = batch_script(job)        # the #SBATCH lines, srun train.py --distributed, requeue
    job_id = submit(job)            # writes the script, sbatch --parsable, the job id

What the script does, each start of the job: one line with the job id and SLURM_RESTART_COUNT
(unset on the first start: read as 0), then `srun` runs train.py, one process a task; under srun,
and only there, `jax.distributed.initialize()` finds its peers in SLURM's step environment
(SLURM_STEP_NODELIST, SLURM_PROCID, ...). The preemption notice is SIGTERM to the tasks, from
`scancel --signal=TERM JOBID` or from `--signal=TERM@N`, N seconds before the time limit; JAX's
preemption sync manager (which replaces any Python SIGTERM handler at initialize, and hears a
SIGTERM sent twice as one notice) makes every process stop at the same step, save it, and exit
75. The script then requeues its own job (`scontrol requeue`): a job that exits 0 within its
grace time counts as COMPLETED and is never requeued, so the exit code is what carries the
difference. The requeued job starts again with SLURM_RESTART_COUNT=1, 2, ... and train.py
resumes from the checkpoint. Any other exit code is a failure: not requeued.

wandb: WANDB_MODE, WANDB_PROJECT and WANDB_ENTITY, where the launching shell sets them, are
exported by the script; WANDB_API_KEY reaches the job through sbatch's environment only.

GPUs: with --gpus-per-task G, SLURM gives each task its G GPUs (CUDA_VISIBLE_DEVICES), and the
script sets JAX_LOCAL_DEVICE_IDS=0..G-1 so that JAX takes all of them, not only the one its
SLURM_LOCALID would pick.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys

from launch.engine import Engine
from launch.preflight import (PREEMPTED_EXIT_CODE, REPO, Check, CommandFailed, LaunchError,
                              TrainRun, project_python, run_check)
from launch.run_env import forwarded, public
from storage.run_dir import RunDir

# SLURM's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# Killed by SIGTERM before train.py could take the notice (still starting): nothing was lost,
# start it again like a preemption. (SIGKILL is left out: out of memory would loop.)
SIGTERM_EXIT_CODE = 128 + 15


def time_seconds(text: str) -> int:
    """SLURM's --time as seconds ('90' minutes, '1:30:00', '2-00:00:00'); LaunchError where
    it is none of SLURM's formats."""
    m = TIME_RE.fullmatch(text)
    if not m:
        raise LaunchError(f"--time {text!r} is not a SLURM time: give minutes (90), HH:MM:SS "
                          f"(1:30:00) or D-HH:MM:SS (2-00:00:00)")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + b * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # minutes


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    run: TrainRun
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_task: int = 0
    partition: str | None = None
    time: str | None = None
    signal_seconds: int = 300  # the notice before the time limit (--signal=TERM@N)
    job_name: str | None = None
    log_dir: str | None = None  # default: WORKDIR/launch
    python: str = ""  # the interpreter on the nodes (a shared filesystem's)
    sbatch_args: tuple[str, ...] = ()  # more #SBATCH lines: --account=..., --qos=...
    env: dict = dataclasses.field(default_factory=dict)  # launch.run_env.forwarded()

    def __post_init__(self):
        for name in ("nodes", "tasks_per_node"):
            if getattr(self, name) < 1:
                raise LaunchError(f"--{name.replace('_', '-')}={getattr(self, name)} must be at "
                                  f"least 1")
        if self.gpus_per_task < 0:
            raise LaunchError(f"--gpus-per-task={self.gpus_per_task} must be 0 (CPUs) or more")
        if self.signal_seconds < 1:
            raise LaunchError(f"--signal-seconds={self.signal_seconds} must be at least 1")
        if self.time is not None and self.signal_seconds >= time_seconds(self.time):
            raise LaunchError(f"--signal-seconds={self.signal_seconds} is not inside --time "
                              f"{self.time}: the notice must come before the time limit")
        if self.log_dir is None and self.run.workdir.startswith("gs://"):
            raise LaunchError(f"--workdir {self.run.workdir} is a bucket, where SLURM cannot "
                              f"write the job's log: give --log-dir on a filesystem every node "
                              f"mounts")

    @property
    def directory(self) -> str:
        """Where the batch script and the job's log go."""
        return os.path.abspath(self.log_dir or RunDir(self.run.workdir).launch)

    @property
    def script_path(self) -> str:
        return os.path.join(self.directory, "slurm.sbatch")

    @property
    def name(self) -> str:
        return self.job_name or f"ringstripe-{os.path.basename(self.run.workdir.rstrip('/'))}"

    @property
    def devices(self) -> int:
        """The accelerators the job holds (0 on CPU nodes)."""
        return self.nodes * self.tasks_per_node * self.gpus_per_task


def batch_script(job: SlurmJob) -> str:
    """The batch script's text (module docstring)."""
    sbatch = [f"--job-name={job.name}", f"--nodes={job.nodes}",
              f"--ntasks-per-node={job.tasks_per_node}"]
    if job.gpus_per_task:
        sbatch.append(f"--gpus-per-task={job.gpus_per_task}")
    if job.partition:
        sbatch.append(f"--partition={job.partition}")
    if job.time:
        sbatch.append(f"--time={job.time}")
    sbatch += [f"--output={job.directory}/slurm-%j.log", "--open-mode=append",  # one log a job
               "--requeue", f"--signal=TERM@{job.signal_seconds}", f"--chdir={REPO}",
               *job.sbatch_args]
    train = [job.python, *job.run.train_args(), "--distributed"]
    lines = ["#!/bin/bash",
             "# ringstripe's SLURM batch script, written by scripts/launch.py slurm; submit it "
             "again with: sbatch " + shlex.quote(job.script_path),
             *(f"#SBATCH {shlex.quote(a)}" for a in sbatch),
             "set -u",
             "export PYTHONUNBUFFERED=1"]
    # wandb's settings from the launching shell, so a resubmitted script keeps them; the API
    # key stays out of the file: the job has it from sbatch's environment (SLURM exports it)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in public(job.env).items()]
    if len(public(job.env)) < len(job.env):
        lines.append("# WANDB_API_KEY: from the environment sbatch ran in (not written here)")
    if job.gpus_per_task:
        ids = ",".join(str(i) for i in range(job.gpus_per_task))
        lines.append(f"export JAX_LOCAL_DEVICE_IDS={ids}  # every GPU SLURM gave the task")
    lines += [
        'echo "ringstripe: job $SLURM_JOB_ID, restart count ${SLURM_RESTART_COUNT:-0}, '
        '$SLURM_NNODES node(s) $SLURM_JOB_NODELIST, $(date -u +%Y-%m-%dT%H:%M:%SZ)"',
        f"srun {shlex.join(train)}",
        "code=$?",
        'case $code in',
        '  0) echo "ringstripe: job $SLURM_JOB_ID finished"; exit 0 ;;',
        f'  {PREEMPTED_EXIT_CODE}|{SIGTERM_EXIT_CODE})',
        f'    [ $code = {PREEMPTED_EXIT_CODE} ] && saved="the checkpoint of that step saved" '
        '|| saved="SIGTERM before train.py could take it: resumes from the last checkpoint"',
        '    echo "ringstripe: stopped on a preemption notice (exit $code, $saved): '
        'requeueing job $SLURM_JOB_ID"',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        '    echo "ringstripe: scontrol requeue failed: submit the script again to resume"',
        '    exit $code ;;',
        '  *) echo "ringstripe: train.py failed (exit $code), not requeued: see the lines '
        'above"; exit $code ;;',
        'esac',
    ]
    return "\n".join(lines) + "\n"


def submit(job: SlurmJob) -> str:
    """Writes the batch script and submits it; the job id."""
    os.makedirs(job.directory, exist_ok=True)
    with open(job.script_path, "w") as f:
        f.write(batch_script(job))
    cmd = ["sbatch", "--parsable", job.script_path]
    print(f"+ {shlex.join(cmd)}", flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise CommandFailed(f"sbatch could not start ({e}): run this on a SLURM login node, "
                            f"or use --print to see the batch script") from None
    if done.returncode:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise CommandFailed(f"sbatch refused the job: {reason} (the script is "
                            f"{job.script_path})")
    return done.stdout.strip().split(";")[0]


class Slurm(Engine):
    name = "slurm"
    help = "write a batch script into WORKDIR/launch and sbatch it"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--nodes", type=int, default=1)
        parser.add_argument("--tasks-per-node", type=int, default=1,
                            help="processes a node: one a GPU (with --gpus-per-task 1)")
        parser.add_argument("--gpus-per-task", type=int, default=0, help="0: CPU nodes")
        parser.add_argument("--partition")
        parser.add_argument("--time", help="time limit (SLURM's formats: minutes, HH:MM:SS, "
                                           "D-HH:MM:SS)")
        parser.add_argument("--signal-seconds", type=int, default=300,
                            help="the preemption notice this many seconds before --time ends "
                                 "(--signal=TERM@N; default: %(default)s)")
        parser.add_argument("--job-name")
        parser.add_argument("--log-dir", help="where the script and the job's log go (default: "
                                              "WORKDIR/launch; needed with a gs:// workdir)")
        parser.add_argument("--python", default=project_python(),
                            help="the interpreter on the nodes (default: %(default)s)")
        parser.add_argument("--sbatch", action="append", default=[], metavar="ARG",
                            help="one more #SBATCH option, e.g. --sbatch=--account=proj "
                                 "(repeatable)")
        parser.add_argument("--print", action="store_true",
                            help="print the batch script; write and submit nothing")

    def launch(self, args, run: TrainRun) -> None:
        job = SlurmJob(run, nodes=args.nodes, tasks_per_node=args.tasks_per_node,
                       gpus_per_task=args.gpus_per_task, partition=args.partition,
                       time=args.time, signal_seconds=args.signal_seconds,
                       job_name=args.job_name, log_dir=args.log_dir, python=args.python,
                       sbatch_args=tuple(args.sbatch), env=forwarded())
        if not args.skip_check:  # with --print too: its lines on stderr, the script alone on stdout
            run_check(Check(run, device=args.device, devices=job.devices), "the memory check",
                      dry_run=False, stream=sys.stderr if args.print else None)
        if args.print:
            print(batch_script(job), end="")
            return
        job_id = submit(job)
        log = os.path.join(job.directory, f"slurm-{job_id}.log")
        print(f"submitted job {job_id}: log {log}\n"
              f"  watch: squeue -j {job_id}; tail -f {log}\n"
              f"  preempt (saves, requeues, resumes): scancel --signal=TERM {job_id}\n"
              f"  stop for good (saves within the grace time): scancel {job_id}")

    def default_workdir(self, args) -> str:
        """runs/CONFIG beside the code: the nodes run the repository from a shared filesystem,
        so they share it too."""
        return os.path.join(REPO, "runs", os.path.splitext(os.path.basename(args.config))[0])


ENGINE = Slurm()
