"""GKE: the run as a JobSet (the JobSet controller's CRD), one Job a TPU slice, as XPK lays it out.

    job = GkeJob(run, name="rs-l8b", image="us-docker.pkg.dev/p/r/ringstripe:1",
                 accelerator_type="v5p-64", num_slices=2, spot=True)
    manifest(job) -> {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", ...}
    to_yaml(manifest(job))                       # what --print shows and kubectl applies

Each slice's Job runs one pod a TPU VM (`google.com/tpu` chips each), on nodes the node
selectors pick (the slice's accelerator and topology; spot with --spot), with host networking
and the JobSet's headless service giving every pod a DNS name: there jax.distributed.initialize()
finds the coordinator by itself (GKE's TPU environment names the slice's hosts; across slices the
MEGASCALE_* variables, the coordinator being slice 0's first pod).

The preemption rule: a pod whose node is taken back (condition DisruptionTarget) or whose
train.py exits 75 after saving fails its Job by the pod failure policy, and the JobSet restarts
every Job without counting it (RestartJobSetAndIgnoreMaxRestarts); any other failure counts
against failurePolicy.maxRestarts. A restarted run resumes from the bucket's checkpoint.

wandb: the launching shell's WANDB_MODE, WANDB_PROJECT and WANDB_ENTITY go into the pods'
environment; WANDB_API_KEY from a secret (`kubectl create secret generic wandb
--from-literal=WANDB_API_KEY=...`, then --wandb-secret wandb), never from the manifest.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys

from launch.engine import Engine
from launch.preflight import (PREEMPTED_EXIT_CODE, Check, CommandFailed, LaunchError, TrainRun,
                              run_check)
from launch.run_env import forwarded, public
from launch.tpu import vms_of
from launch.tpu_inputs import check_accelerator_type
from planner.topology import slice_for  # no JAX: planner/__init__ imports lazily

# GKE's node label for each TPU generation (cloud.google.com/gke-tpu-accelerator)
ACCELERATORS = {"v4": "tpu-v4-podslice", "v5litepod": "tpu-v5-lite-podslice",
                "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}
COORDINATOR_PORT = 8080  # megascale's, between slices


@dataclasses.dataclass(frozen=True)
class GkeJob:
    run: TrainRun
    name: str
    image: str  # a container image with this repository at `repo` and its Python environment
    accelerator_type: str = "v5p-8"
    num_slices: int = 1
    spot: bool = False
    max_restarts: int = 3  # failures; preemptions do not count
    grace_seconds: int = 300  # from SIGTERM to SIGKILL: the save's time
    repo: str = "/ringstripe"
    python: str = "python"
    namespace: str = "default"
    env: dict = dataclasses.field(default_factory=dict)  # launch.run_env.forwarded()
    wandb_secret: str | None = None  # the Kubernetes secret whose WANDB_API_KEY the pods get

    def __post_init__(self):
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", self.name):
            raise LaunchError(f"--name {self.name!r} is not a JobSet name: lowercase letters, "
                              f"digits and '-', at most 40 characters, e.g. rs-llama")
        check_accelerator_type(self.accelerator_type)
        if not self.run.workdir.startswith("gs://"):
            raise LaunchError(f"--workdir {self.run.workdir} is not a bucket: a pod's disk goes "
                              f"with it at a restart; give gs://BUCKET/PATH")
        if self.wandb_secret is not None and not re.fullmatch(
                r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?", self.wandb_secret):
            raise LaunchError(f"--wandb-secret {self.wandb_secret!r} is not a Kubernetes secret "
                              f"name: lowercase letters, digits, '-' and '.', e.g. wandb")
        if self.num_slices < 1 or self.max_restarts < 0:
            raise LaunchError("--num-slices must be at least 1 and --max-restarts at least 0")

    @property
    def tpu(self):
        return slice_for(self.accelerator_type)

    @property
    def chips_per_vm(self) -> int:
        return vms_of(self.accelerator_type)[1]

    @property
    def vms(self) -> int:
        return vms_of(self.accelerator_type)[0]


def _env(job: GkeJob) -> list[dict]:
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    # wandb's settings from the launching shell; its API key never in the manifest (kubectl
    # and --print show it, the cluster keeps it): from the secret, where one is named
    env += [{"name": k, "value": v} for k, v in public(job.env).items()]
    if job.wandb_secret:
        env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": job.wandb_secret, "key": "WANDB_API_KEY"}}})
    if job.num_slices > 1:
        env += [{"name": "MEGASCALE_COORDINATOR_ADDRESS",
                 "value": f"{job.name}-slice-0-0.{job.name}:{COORDINATOR_PORT}"},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(job.num_slices)},
                {"name": "MEGASCALE_SLICE_ID", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}}]
    return env


def manifest(job: GkeJob) -> dict:
    generation = job.accelerator_type.split("-")[0]
    selectors = {"cloud.google.com/gke-tpu-accelerator": ACCELERATORS[generation],
                 "cloud.google.com/gke-tpu-topology": "x".join(map(str, job.tpu.shape))}
    if job.spot:
        selectors["cloud.google.com/gke-spot"] = "true"
    train = [job.python, *job.run.train_args(), "--distributed"]
    container = {
        "name": "train", "image": job.image, "workingDir": job.repo, "command": train,
        "ports": [{"containerPort": 8471}, {"containerPort": COORDINATOR_PORT}],
        "resources": {"limits": {"google.com/tpu": job.chips_per_vm}},
        "securityContext": {"privileged": True}, "env": _env(job)}
    pod = {"restartPolicy": "Never", "nodeSelector": selectors, "hostNetwork": True,
           "dnsPolicy": "ClusterFirstWithHostNet",
           "terminationGracePeriodSeconds": job.grace_seconds, "containers": [container]}
    preempted = {"rules": [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "train", "operator": "In",
                                              "values": [PREEMPTED_EXIT_CODE]}}]}
    slice_job = {"parallelism": job.vms, "completions": job.vms, "backoffLimit": 0,
                 "podFailurePolicy": preempted, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": job.name, "namespace": job.namespace, "annotations": {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": job.name},
            "failurePolicy": {"maxRestarts": job.max_restarts, "rules": [
                {"action": "RestartJobSetAndIgnoreMaxRestarts",
                 "onJobFailureReasons": ["PodFailurePolicy"]}]},
            "replicatedJobs": [{"name": "slice", "replicas": job.num_slices,
                                "template": {"spec": slice_job}}]}}


def to_yaml(value, indent: int = 0) -> str:
    """YAML of dicts, lists and scalars (strings JSON-quoted: valid YAML, never retyped)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                text = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {text[indent + 2:]}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))


class JobSets(Engine):
    name = "gke"
    help = "a JobSet on a GKE cluster's TPU node pools, applied with kubectl (or --print)"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, help="the JobSet's name")
        parser.add_argument("--image", required=True,
                            help="container image with this repository and its environment")
        parser.add_argument("--repo", default="/ringstripe",
                            help="the repository's path in the image")
        parser.add_argument("--python", default="python", help="the interpreter in the image")
        parser.add_argument("--accelerator-type", default="v5p-8")
        parser.add_argument("--num-slices", type=int, default=1)
        parser.add_argument("--spot", action="store_true", help="schedule on spot TPU node pools")
        parser.add_argument("--max-restarts", type=int, default=3,
                            help="restarts after failures (preemptions do not count; default: "
                                 "%(default)s)")
        parser.add_argument("--grace-seconds", type=int, default=300,
                            help="from SIGTERM to SIGKILL: the save's time (default: "
                                 "%(default)s)")
        parser.add_argument("--namespace", default="default")
        parser.add_argument("--wandb-secret", metavar="NAME",
                            help="the Kubernetes secret whose WANDB_API_KEY the pods get "
                                 "(kubectl create secret generic NAME "
                                 "--from-literal=WANDB_API_KEY=...)")
        parser.add_argument("--print", action="store_true",
                            help="print the manifest; apply nothing")

    def launch(self, args, run: TrainRun) -> None:
        job = GkeJob(run, args.name, args.image, args.accelerator_type, args.num_slices,
                     args.spot, args.max_restarts, args.grace_seconds, args.repo, args.python,
                     args.namespace, env=forwarded(), wandb_secret=args.wandb_secret)
        if job.env.get("WANDB_API_KEY") and not job.wandb_secret:
            print("note: WANDB_API_KEY is set here but the pods do not get it (a manifest would "
                  "show it): put it in a secret and give --wandb-secret NAME", file=sys.stderr)
        text = to_yaml(manifest(job)) + "\n"
        if args.print:
            print(text, end="")
            return
        if shutil.which("kubectl") is None:
            raise LaunchError("kubectl is not on PATH: install it and point it at the cluster, "
                              "or use --print and apply the manifest yourself")
        if not args.skip_check:
            run_check(Check(run, compile="tpu", topology=args.accelerator_type,
                            num_slices=args.num_slices),
                      f"the compile check for {args.accelerator_type}", dry_run=False)
        cmd = ["kubectl", "apply", "-f", "-"]
        print(f"+ {shlex.join(cmd)}", flush=True)
        done = subprocess.run(cmd, input=text, text=True)
        if done.returncode:
            raise CommandFailed(f"kubectl apply exited with code {done.returncode}")
        print(f"applied JobSet {job.name}: watch: kubectl get jobset {job.name}; kubectl logs "
              f"-f -l jobset.sigs.k8s.io/jobset-name={job.name}; stop: kubectl delete jobset "
              f"{job.name}")


ENGINE = JobSets()
