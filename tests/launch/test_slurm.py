"""scripts/launch.py slurm on a real one-node SLURM cluster (tests/support/slurm_cluster.py): a job of two
tasks (two train.py processes under srun, 2 fake CPU devices each, a data x seq mesh over both)
is preempted, saves the step the notice arrived at, exits 75, requeues itself, resumes, and
finishes with the losses of an uninterrupted run, bit for bit.

Marked `cluster`: `make test-cluster` runs them (and `.ci/run`, after make test); the cluster
is started here, and where it cannot be (no packages and no root, a daemon that does not come
up) the tests fail with the reason rather than skip.
"""

import os
import subprocess
import sys
import time

import pytest

from tests.support.slurm_cluster import SlurmCluster
from tests.support.train_runs import (ROOT, clean_env, losses, read_metrics, completed_checkpoints,
                                      wait_for_step)

pytestmark = pytest.mark.cluster

# About 60 s of steps on 2 cores, so that the time limit's notice (below) comes while it trains.
STEPS = 450
RUN = ("--config.cpu_devices=2", "--config.mesh.data=2", "--config.mesh.seq=2",
       f"--config.num_train_steps={STEPS}", "--config.checkpoint_every_steps=1000",
       "--config.eval_every_steps=1000", "--config.log_every_steps=1",
       "--config.parallel.layout=striped")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = SlurmCluster(str(tmp_path_factory.mktemp("slurm"))).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: the same two processes, joined on 127.0.0.1 by
    scripts/launch_local.py; its token cache is the SLURM runs' too."""
    workdir = tmp_path_factory.mktemp("reference")
    cache = workdir / "cache"
    result = subprocess.run(
        [sys.executable, "scripts/launch_local.py", "--processes", "2", "--",
         "train.py", "--config=configs/tiny.py", f"--workdir={workdir}", *RUN],
        cwd=ROOT, env=clean_env(processes=2), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return losses(read_metrics(workdir)), str(cache)


def _launch(cluster, workdir, cache, *more):
    result = subprocess.run(
        [sys.executable, "scripts/launch.py", "slurm", "--config", "configs/tiny.py",
         "--workdir", str(workdir), "--tasks-per-node", "2", "--python", sys.executable,
         *RUN, f"--config.data.cache_dir={cache}", *more],
        cwd=ROOT, env={**clean_env(processes=2), **cluster.env}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("submitted job "))
    return line.split()[2].rstrip(":")


def _wait_for(cluster, job_id, done, what, timeout=400):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = cluster.job(job_id)
        if done(info):
            return info
        time.sleep(1)
    raise AssertionError(f"job {job_id} never {what}: {cluster.job(job_id)}")


def _finished(info):
    return info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def _check_resumed(workdir, job_id, want, stopped_at):
    log = open(os.path.join(workdir, "launch", f"slurm-{job_id}.log")).read()
    assert "restart count 0," in log and "restart count 1," in log, log
    assert "requeueing job" in log and f"job {job_id} finished" in log, log
    rows = read_metrics(workdir)
    events = [(r["event"], r["step"]) for r in rows if "event" in r]
    assert ("stopped on request", stopped_at) in events and ("resumed", stopped_at) in events
    got = losses(rows)
    assert sorted(got) == list(range(1, STEPS + 1))  # one row a step across the restart
    assert got == want  # float32, the same processes and mesh: bit for bit
    assert completed_checkpoints(workdir) == [stopped_at, STEPS]  # both checkpoints complete
    assert not os.path.exists(os.path.join(workdir, "damaged_checkpoints"))


def test_scancel_signal_term_preempts_and_the_job_requeues_and_resumes_exactly(
        cluster, reference, tmp_path):
    want, cache = reference
    workdir = tmp_path / "run"
    job_id = _launch(cluster, workdir, cache)
    info = _wait_for(cluster, job_id, lambda i: i.get("JobState") == "RUNNING", "ran")
    proc = _JobProbe(cluster, job_id)
    wait_for_step(workdir, 4, proc, timeout=300)
    for _ in range(2):  # a task may get the notice twice: still one stop, one save
        subprocess.run(["scancel", "--signal=TERM", job_id], env=cluster.env, check=True)
        time.sleep(0.1)
    info = _wait_for(cluster, job_id, _finished, "finished")
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    stopped = [r["step"] for r in read_metrics(workdir) if r.get("event") == "stopped on request"]
    assert len(stopped) == 1 and 4 <= stopped[0] < STEPS, stopped
    _check_resumed(workdir, job_id, want, stopped[0])


def test_the_time_limit_warning_preempts_and_the_job_requeues_and_resumes_exactly(
        cluster, reference, tmp_path):
    """--time 2 with --signal-seconds 70. slurmctld looks at time limits every 30 s and sends
    the notice at its first look once the job is within 70 + 30 s of its end: 20 to 50 s into
    the job, while it trains. Once the job is back in the queue its time limit is raised (as an
    administrator would), so that the second start finishes instead of meeting the notice
    again (a run longer than the limit requeues at each notice and goes on)."""
    want, cache = reference
    workdir = tmp_path / "run"
    job_id = _launch(cluster, workdir, cache, "--time", "2", "--signal-seconds", "70")
    _wait_for(cluster, job_id, lambda i: i.get("Restarts") == "1" or _finished(i), "requeued",
              timeout=300)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=20"], env=cluster.env,
                   check=True)
    info = _wait_for(cluster, job_id, _finished, "finished")
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    stopped = [r["step"] for r in read_metrics(workdir) if r.get("event") == "stopped on request"]
    assert len(stopped) == 1, stopped
    _check_resumed(workdir, job_id, want, stopped[0])


class _JobProbe:
    """What wait_for_step polls: "running" while the job has not ended."""

    def __init__(self, cluster, job_id):
        self.cluster, self.job_id = cluster, job_id

    def poll(self):
        return 0 if _finished(self.cluster.job(self.job_id)) else None
