"""scripts/launch.py: the TPU engine against a stand-in gcloud that plays a spot slice
(tests/support/fake_gcloud.py: the TPU VM a folder here, ssh runs bash in it), the GKE manifest parsed,
the SLURM batch script as printed, and bad input refused before anything runs. The SLURM engine
on a real cluster: tests/launch/test_slurm.py."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.support.train_runs import ROOT, clean_env, losses, read_metrics, run_train

TPU = ("--name", "rs-t", "--zone", "us-central2-b", "--accelerator-type", "v4-8")
RUN = ("--config.num_train_steps=24", "--config.checkpoint_every_steps=1000",
       "--config.eval_every_steps=1000", "--config.log_every_steps=1")


def launch(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "scripts/launch.py", *args], cwd=ROOT,
                          env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def gcloud(tmp_path):
    """PATH with the stand-in gcloud first; its folder (calls.log, the VMs)."""
    folder, bin_dir = tmp_path / "gcloud", tmp_path / "bin"
    folder.mkdir()
    bin_dir.mkdir()
    shim = bin_dir / "gcloud"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                    f"{shlex.quote(os.path.join(ROOT, 'tests', 'support', 'fake_gcloud.py'))} \"$@\"\n")
    shim.chmod(0o755)
    env = clean_env()
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_GCLOUD_DIR=str(folder))
    return folder, env


def _calls(folder):
    return (folder / "calls.log").read_text().splitlines()


@pytest.mark.programs
def test_a_preempted_slice_is_created_again_and_the_run_resumes_exactly(gcloud, tmp_path,
                                                                       token_cache):
    folder, env = gcloud
    cache = token_cache
    reference = run_train(tmp_path / "one", *RUN, f"--config.data.cache_dir={cache}")
    assert reference.returncode == 0, reference.stderr[-3000:]
    workdir = tmp_path / "run"  # (a bucket on a real slice; here the VM and this test share it)
    result = launch("tpu", "--config", "configs/tiny.py", "--workdir", str(workdir), *TPU,
                    "--spot", "--skip-check", "--poll-seconds", "0.5", *RUN,
                    f"--config.data.cache_dir={cache}",
                    env={**env, "FAKE_GCLOUD_PREEMPT_AT_STEP": "6"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the slice is SUSPENDED: starting the run again (preemptions 1 of at most 100)" in (
        result.stdout)
    assert "the run finished (1 preemptions, 0 failures on the way)" in result.stdout
    calls = _calls(folder)
    creates = [c for c in calls if " queued-resources create " in c]
    assert len(creates) == 2 and all("--spot" in c for c in creates)
    assert [c.split()[4] for c in calls if " queued-resources " in c][-1] == "delete"  # done
    rows = read_metrics(workdir)
    (stopped,) = [r["step"] for r in rows if r.get("event") == "stopped on request"]
    assert ("resumed", stopped) in [(r.get("event"), r["step"]) for r in rows]
    assert losses(rows) == losses(read_metrics(tmp_path / "one"))  # bit for bit
    assert not os.path.exists(folder / "vms" / "rs-t")  # deleted once finished


@pytest.mark.programs
def test_a_run_that_fails_by_itself_is_not_started_again_past_the_bound(gcloud, tmp_path):
    folder, env = gcloud
    result = launch("tpu", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"),
                    *TPU, "--skip-check", "--poll-seconds", "0.5", "--max-failures", "1",
                    "--config.optim.learning_rate=1e9", "--config.num_train_steps=6",
                    f"--config.data.cache_dir={tmp_path / 'cache'}", env=env)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "train.py failed (exit 3" in result.stdout  # non-finite: exit 3
    warning, line = result.stderr.strip().splitlines()  # a local workdir: each VM's own disk
    assert warning.startswith("warning: --workdir") and line.startswith("error: ")
    assert "2 failures, more than --max-failures=1: not started again" in line
    starts = [c for c in _calls(folder) if "nohup" in c]
    assert len(starts) == 2  # the first start and one restart
    assert not any(" queued-resources delete " in c for c in _calls(folder))  # kept for a look
    assert os.path.isdir(folder / "vms" / "rs-t")


def test_tpu_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    result = launch("tpu", "--config", "configs/tiny.py", "--workdir", "gs://b/runs/t", *TPU,
                    "--reserved", "--num-slices", "2", "--dry-run", "--config.seq_len=256",
                    env={**clean_env(), "PATH": "/usr/bin:/bin"})  # no gcloud on PATH
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(ln[2:]) for ln in result.stdout.splitlines() if ln.startswith("+ ")]
    assert commands[0][1].endswith("plan.py") and "--compile=tpu" in commands[0]
    assert "--topology=v4-8" in commands[0] and "--config.seq_len=256" in commands[0]
    create = commands[1]
    assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rs-t"]
    assert {"--node-count=2", "--node-prefix=rs-t", "--reserved"} <= set(create)
    runs = [c for c in commands if "nohup" in " ".join(c)]
    assert [c[5] for c in runs] == ["rs-t-0", "rs-t-1"]  # every slice's node
    scripts = [next(a for a in c if a.startswith("--command=")) for c in runs]
    assert all("--distributed" in s and "gs://b/runs/t" in s for s in scripts)
    assert commands[-1][:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete",
                                "rs-t"]


def test_gke_print_renders_a_jobset_of_one_job_a_slice_with_the_preemption_rule():
    result = launch("gke", "--config", "configs/tiny.py", "--workdir", "gs://b/runs/t",
                    "--name", "rs-t", "--image", "ghcr.io/me/ringstripe:1", "--accelerator-type",
                    "v5p-64", "--num-slices", "2", "--spot", "--max-restarts", "4", "--print",
                    "--config.seq_len=256")
    assert result.returncode == 0, result.stderr
    jobset = yaml.safe_load(result.stdout)
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    spec = jobset["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "rs-t"}
    assert spec["failurePolicy"]["maxRestarts"] == 4
    assert spec["failurePolicy"]["rules"] == [{"action": "RestartJobSetAndIgnoreMaxRestarts",
                                               "onJobFailureReasons": ["PodFailurePolicy"]}]
    (slices,) = spec["replicatedJobs"]
    assert slices["replicas"] == 2
    job = slices["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 8  # v5p-64: 32 chips, 4 a VM
    rules = job["podFailurePolicy"]["rules"]
    assert {"type": "DisruptionTarget"} in rules[0]["onPodConditions"]
    assert rules[1]["onExitCodes"]["values"] == [75]
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x4x4",
                                   "cloud.google.com/gke-spot": "true"}
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["google.com/tpu"] == 4
    assert container["command"] == ["python", "train.py", "--config=configs/tiny.py",
                                    "--workdir=gs://b/runs/t", "--config.seq_len=256",
                                    "--distributed"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "rs-t-slice-0-0.rs-t:8080"
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2"


def test_slurm_print_shows_the_batch_script_and_submits_nothing(tmp_path):
    result = launch("slurm", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                    "--nodes", "2", "--tasks-per-node", "4", "--gpus-per-task", "2", "--time",
                    "1:00:00", "--signal-seconds", "600", "--partition", "gpu",
                    "--sbatch=--account=proj", "--print", "--skip-check", "--config.seq_len=256")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    sbatch = {ln.split()[1] for ln in lines if ln.startswith("#SBATCH ")}
    assert {"--nodes=2", "--ntasks-per-node=4", "--gpus-per-task=2", "--partition=gpu",
            "--time=1:00:00", "--requeue", "--signal=TERM@600", "--open-mode=append",
            "--account=proj", f"--output={tmp_path / 'w'}/launch/slurm-%j.log"} <= sbatch
    (srun,) = [shlex.split(ln) for ln in lines if ln.startswith("srun ")]
    assert srun[2:] == ["train.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}",
                        "--config.seq_len=256", "--distributed"]
    assert "export JAX_LOCAL_DEVICE_IDS=0,1  # every GPU SLURM gave the task" in lines
    assert 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in result.stdout
    assert not (tmp_path / "w").exists()  # --print writes nothing


WANDB = {"WANDB_API_KEY": "k3y-never-printed", "WANDB_MODE": "online", "WANDB_PROJECT": "long ctx"}


def test_wandb_variables_go_where_the_run_runs_and_the_key_is_never_printed(tmp_path):
    """SLURM: exported by the batch script, the key left to sbatch's environment; GKE: in the
    pods' environment, the key from the secret --wandb-secret names, or not at all."""
    env = {**clean_env(), **WANDB}
    slurm = launch("slurm", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                   "--print", "--skip-check", env=env)
    assert slurm.returncode == 0, slurm.stderr
    lines = slurm.stdout.splitlines()
    assert {"export WANDB_MODE=online", "export WANDB_PROJECT='long ctx'"} <= set(lines)
    assert lines.index("export WANDB_MODE=online") < next(
        i for i, ln in enumerate(lines) if ln.startswith("srun "))
    gke = ("gke", "--config", "configs/tiny.py", "--workdir", "gs://b/runs/t", "--name", "rs-t",
           "--image", "ghcr.io/me/ringstripe:1", "--print")
    with_secret = launch(*gke, "--wandb-secret", "wandb", env=env)
    assert with_secret.returncode == 0, with_secret.stderr
    (container,) = yaml.safe_load(with_secret.stdout)["spec"]["replicatedJobs"][0]["template"][
        "spec"]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert pod_env["WANDB_PROJECT"] == "long ctx" and pod_env["WANDB_MODE"] == "online"
    assert pod_env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "WANDB_API_KEY"}}
    without = launch(*gke, env=env)
    assert without.returncode == 0 and "--wandb-secret NAME" in without.stderr
    assert "WANDB_API_KEY" not in without.stdout
    for result in (slurm, with_secret, without):
        assert WANDB["WANDB_API_KEY"] not in result.stdout + result.stderr


@pytest.mark.parametrize("args, message", [
    (("--config.no_such_field=1",), "unknown config field"),
    (("--config.model.d_model=16384", "--config.model.num_layers=64",  # a 200B model
      "--config.model.mlp_dim=65536", "--config.model.num_heads=128",
      "--config.model.head_dim=128"), None),
    (("--time", "1", "--signal-seconds", "60"), "--signal-seconds=60 is not inside --time 1"),
    (("--time", "soon"), "--time 'soon' is not a SLURM time"),
    (("stray",), "unrecognized arguments: stray"),
])
@pytest.mark.programs
def test_slurm_bad_input_is_one_line_and_nothing_is_written_or_submitted(tmp_path, args,
                                                                          message):
    """sbatch is not on this PATH: a run that got past the checks would fail there, loudly."""
    result = launch("slurm", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                    "--tasks-per-node", "2", "--device", "h100-80gb", *args,
                    env={**clean_env(), "PATH": os.path.dirname(sys.executable) + ":/usr/bin"})
    (line,) = [ln for ln in result.stderr.splitlines()
               if ln.startswith(("error:", "usage:"))][-1:]
    if message is None:  # does not fit the GPUs: plan.py's line, exit 1
        assert result.returncode == 1 and "the train step needs" in line, result.stderr
    else:
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "submitted" not in result.stdout and not (tmp_path / "w").exists()


def test_slurm_job_of_other_devices_than_the_mesh_is_refused_before_anything(tmp_path):
    """The job's nodes x tasks x GPUs against the config's mesh (data 1 x seq 8): 16 GPUs would
    pass the memory check for 8 and stop train.py on the cluster after the queue. (sbatch is not
    on this PATH: a job that got past the check would fail there, exit 1.)"""
    result = launch("slurm", "--config", "configs/gpu/llama_1b.py", "--workdir", str(tmp_path / "w"),
                    "--nodes", "2", "--tasks-per-node", "8", "--gpus-per-task", "1",
                    env={**clean_env(), "PATH": os.path.dirname(sys.executable) + ":/usr/bin"})
    assert result.returncode == 2, result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert "16 devices" in line and "data 1 x seq 8 = 8" in line and "--config.mesh.data=2" in line
    assert "submitted" not in result.stdout and not (tmp_path / "w").exists()


def test_train_py_distributed_outside_a_cluster_is_one_line(tmp_path):
    """What a batch script that runs train.py --distributed without srun gets: no traceback."""
    result = run_train(tmp_path / "w", "--distributed")
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert "--distributed found no cluster to join" in line and "under srun" in line
    assert not (tmp_path / "w").exists()
