"""Launch train.py through a cluster's scheduler: SLURM, Cloud TPU queued resources, GKE.

    python scripts/launch.py slurm --config configs/gpu/llama_1b.py --workdir /shared/runs/l1b \
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
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import gke, slurm, tpu  # noqa: E402
from launch.preflight import (REPO, Check, CommandFailed, LaunchError,  # noqa: E402
                              TrainRun, project_python, repo_config, run_check,
                              split_overrides)
from launch.run_env import forwarded  # noqa: E402
from launch.tpu_inputs import InputError, check_workdir  # noqa: E402


def _train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="config file, e.g. configs/tiny.py")
    parser.add_argument("--workdir", help="train.py's --workdir (slurm's default: runs/CONFIG "
                                          "in this repository, which the nodes share)")
    parser.add_argument("--skip-check", action="store_true",
                        help="launch without the check of the run (scripts/plan.py --check)")
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

    t = engines.add_parser("tpu", help="a Cloud TPU queued resource, watched: re-created when "
                                       "preempted, the run resumed")
    _train_options(t)
    t.add_argument("--name", required=True, help="the queued resource's and TPU's name")
    t.add_argument("--zone", required=True)
    t.add_argument("--project")
    t.add_argument("--accelerator-type", default="v4-8", help="v4-32, v5litepod-16, v5p-64, "
                                                              "v6e-16, ... (default: %(default)s)")
    t.add_argument("--runtime-version", default="tpu-ubuntu2204-base")
    capacity = t.add_mutually_exclusive_group()
    capacity.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
    capacity.add_argument("--reserved", action="store_true", help="the project's reservation")
    t.add_argument("--num-slices", type=int, default=1, help="multi-slice: slices of the type")
    t.add_argument("--python", default="python3.11", help="the workers' venv's interpreter")
    t.add_argument("--max-preemptions", type=int, default=100,
                   help="re-creations after the slice was taken back (default: %(default)s)")
    t.add_argument("--max-failures", type=int, default=3,
                   help="restarts after train.py failed by itself (default: %(default)s)")
    t.add_argument("--poll-seconds", type=float, default=60.0)
    t.add_argument("--keep", action="store_true", help="keep the slice once the run finished")
    t.add_argument("--dry-run", action="store_true",
                   help="print every gcloud command, as it would run; run nothing")

    g = engines.add_parser("gke", help="a JobSet on a GKE cluster's TPU node pools, applied with "
                                       "kubectl (or --print)")
    _train_options(g)
    g.add_argument("--name", required=True, help="the JobSet's name")
    g.add_argument("--image", required=True,
                   help="container image with this repository and its environment")
    g.add_argument("--repo", default="/ringstripe", help="the repository's path in the image")
    g.add_argument("--python", default="python", help="the interpreter in the image")
    g.add_argument("--accelerator-type", default="v5p-8")
    g.add_argument("--num-slices", type=int, default=1)
    g.add_argument("--spot", action="store_true", help="schedule on spot TPU node pools")
    g.add_argument("--max-restarts", type=int, default=3,
                   help="restarts after failures (preemptions do not count; default: "
                        "%(default)s)")
    g.add_argument("--grace-seconds", type=int, default=300,
                   help="from SIGTERM to SIGKILL: the save's time (default: %(default)s)")
    g.add_argument("--namespace", default="default")
    g.add_argument("--wandb-secret", metavar="NAME",
                   help="the Kubernetes secret whose WANDB_API_KEY the pods get (kubectl create "
                        "secret generic NAME --from-literal=WANDB_API_KEY=...)")
    g.add_argument("--print", action="store_true", help="print the manifest; apply nothing")
    return parser


def run_gke(args, run: TrainRun) -> None:
    job = gke.GkeJob(run, args.name, args.image, args.accelerator_type, args.num_slices,
                     args.spot, args.max_restarts, args.grace_seconds, args.repo, args.python,
                     args.namespace, env=forwarded(), wandb_secret=args.wandb_secret)
    if job.env.get("WANDB_API_KEY") and not job.wandb_secret:
        print("note: WANDB_API_KEY is set here but the pods do not get it (a manifest would "
              "show it): put it in a secret and give --wandb-secret NAME", file=sys.stderr)
    text = gke.to_yaml(gke.manifest(job)) + "\n"
    if args.print:
        print(text, end="")
        return
    if shutil.which("kubectl") is None:
        raise LaunchError("kubectl is not on PATH: install it and point it at the cluster, or "
                          "use --print and apply the manifest yourself")
    if not args.skip_check:
        run_check(Check(run, compile="tpu", topology=args.accelerator_type,
                        num_slices=args.num_slices),
                  f"the compile check for {args.accelerator_type}", dry_run=False)
    cmd = ["kubectl", "apply", "-f", "-"]
    print(f"+ {shlex.join(cmd)}", flush=True)
    done = subprocess.run(cmd, input=text, text=True)
    if done.returncode:
        raise CommandFailed(f"kubectl apply exited with code {done.returncode}")
    print(f"applied JobSet {job.name}: watch: kubectl get jobset {job.name}; kubectl logs -f "
          f"-l jobset.sigs.k8s.io/jobset-name={job.name}; stop: kubectl delete jobset "
          f"{job.name}")


def run_tpu(args, run: TrainRun) -> None:
    slice_ = tpu.QueuedSlice(args.name, args.zone, args.accelerator_type, args.runtime_version,
                             args.project, args.spot, args.reserved, args.num_slices,
                             args.python)
    notes = []
    check_workdir(run.workdir, notes)
    for note in notes:
        print(note, file=sys.stderr)
    if not args.dry_run and shutil.which("gcloud") is None:
        raise LaunchError("gcloud is not on PATH: install the Google Cloud SDK, or use "
                          "--dry-run to print the commands")
    if not args.skip_check:
        run_check(Check(run, compile="tpu", topology=args.accelerator_type,
                        num_slices=args.num_slices),
                  f"the compile check for {args.accelerator_type}", dry_run=args.dry_run)
    watcher = tpu.Watcher(slice_, run, tpu.Gcloud(args.dry_run), args.max_preemptions,
                          args.max_failures, args.poll_seconds, args.keep)
    try:
        watcher.launch()
    except KeyboardInterrupt:
        print(f"\nstopped watching; the slice and the run go on (delete: "
              f"{shlex.join(slice_.delete())})", file=sys.stderr)
        sys.exit(130)


def run_slurm(args, run: TrainRun) -> None:
    job = slurm.SlurmJob(run, nodes=args.nodes, tasks_per_node=args.tasks_per_node,
                         gpus_per_task=args.gpus_per_task, partition=args.partition,
                         time=args.time, signal_seconds=args.signal_seconds,
                         job_name=args.job_name, log_dir=args.log_dir, python=args.python,
                         sbatch_args=tuple(args.sbatch), env=forwarded())
    if not args.skip_check:  # with --print too: its lines on stderr, the script alone on stdout
        run_check(Check(run, device=args.device, devices=job.devices),
                  "the memory check", dry_run=False, stream=sys.stderr if args.print else None)
    if args.print:
        print(slurm.batch_script(job), end="")
        return
    job_id = slurm.submit(job)
    log = os.path.join(job.directory, f"slurm-{job_id}.log")
    print(f"submitted job {job_id}: log {log}\n"
          f"  watch: squeue -j {job_id}; tail -f {log}\n"
          f"  preempt (saves, requeues, resumes): scancel --signal=TERM {job_id}\n"
          f"  stop for good (saves within the grace time): scancel {job_id}")


def default_workdir(args) -> str:
    """SLURM's runs/CONFIG beside the code (the nodes run the repository from a shared
    filesystem, so they share it too); the TPU engines need a bucket named."""
    if args.engine != "slurm":
        raise LaunchError(f"--workdir is required for {args.engine}: give gs://BUCKET/PATH, "
                          f"where every host of the slice reads and writes the run")
    return os.path.join(REPO, "runs", os.path.splitext(os.path.basename(args.config))[0])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        own, overrides = split_overrides(argv)
        args = build_parser().parse_args(own)
        workdir = args.workdir or default_workdir(args)
        workdir = workdir if workdir.startswith("gs://") else os.path.abspath(workdir)
        run = TrainRun(repo_config(args.config), workdir, overrides)
        {"slurm": run_slurm, "tpu": run_tpu, "gke": run_gke}[args.engine](args, run)
    except (LaunchError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except CommandFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
