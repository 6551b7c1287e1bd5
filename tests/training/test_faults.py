"""Faults around a run: the workdir lock, restore that tells damage from trouble, stale temp
files, the consecutive-skip cap, a full disk, a resumed run's metrics."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from checkpoints import Checkpointer, CheckpointError, WorkdirBusy, WorkdirLock
from checkpoints import manager as manager_lib
from checkpoints.lock import STALE_AFTER_S
from tests.support.train_runs import ROOT, clean_env, completed_checkpoints, run_train


def _write_lock(workdir, **holder):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "since": "then",
              "heartbeat": time.time(), "token": "someone", **holder}
    (workdir / "LOCK").write_text(json.dumps(record))


def test_a_live_holder_refuses_a_second_lock_and_names_itself(tmp_path):
    first = WorkdirLock(str(tmp_path))
    first.acquire()
    try:
        with pytest.raises(WorkdirBusy, match=rf"in use by pid {os.getpid()} on "
                                              rf"{socket.gethostname()} since "):
            WorkdirLock(str(tmp_path)).acquire()
    finally:
        first.release()
    assert not (tmp_path / "LOCK").exists()
    WorkdirLock(str(tmp_path)).acquire()  # free again


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that was this host's and is no longer running
    _write_lock(tmp_path, pid=dead.pid)
    said = []
    lock = WorkdirLock(str(tmp_path))
    lock.acquire(log=said.append)
    assert f"pid {dead.pid} on this host, is not running" in said[0]
    assert json.loads((tmp_path / "LOCK").read_text())["token"] == lock.token
    lock.release()


def test_another_hosts_lock_is_stale_only_once_its_heartbeat_stops(tmp_path):
    _write_lock(tmp_path, host="other-host", pid=7, heartbeat=time.time())
    with pytest.raises(WorkdirBusy, match="pid 7 on other-host"):
        WorkdirLock(str(tmp_path)).acquire()
    _write_lock(tmp_path, host="other-host", pid=7, heartbeat=time.time() - STALE_AFTER_S - 1)
    said = []
    WorkdirLock(str(tmp_path)).acquire(log=said.append)
    assert "has not refreshed it for" in said[0]


@pytest.fixture
def saved(tmp_path):
    """A checkpoint directory with steps 1 and 2 of a small state."""
    state = {"w": jnp.arange(8.0), "b": jnp.ones((4, 4))}
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=5, async_save=False)
    for step in (1, 2):
        checkpointer.save(step, jax.tree.map(lambda x: x * step, state), {"step": step})
    checkpointer.close()
    return tmp_path, state


class Flaky(Checkpointer):
    """Reads of the newest step fail with `error` `times` times (then read as usual)."""

    def __init__(self, directory, error, times):
        super().__init__(directory, keep=5)
        self.error, self.left, self.calls = error, times, 0

    def restore(self, step, abstract_state):
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return super().restore(step, abstract_state)


def _restore(checkpointer, state, said):
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            state)
    return checkpointer.restore_latest(abstract, lambda step, meta: None, log=said.append)


def test_a_transient_read_error_is_retried(saved, monkeypatch):
    monkeypatch.setattr(manager_lib, "RETRY_WAIT_S", 0.01)
    workdir, state = saved
    flaky = Flaky(str(workdir / "checkpoints"), ValueError("UNAVAILABLE: connection reset"), 2)
    said = []
    step, restored, _ = _restore(flaky, state, said)
    assert step == 2 and flaky.calls == 3 and not said
    np.testing.assert_array_equal(restored["w"], np.arange(8.0) * 2)


@pytest.mark.parametrize("error,retried", [
    (ValueError("UNAVAILABLE: the bucket does not answer"), True),
    (ValueError("RESOURCE_EXHAUSTED: Out of memory allocating 4.00GiB"), False),
    (PermissionError(13, "Permission denied"), False),
])
def test_trouble_that_is_not_damage_is_one_error_and_moves_nothing(saved, monkeypatch, error,
                                                                   retried):
    monkeypatch.setattr(manager_lib, "RETRY_WAIT_S", 0.01)
    workdir, state = saved
    flaky = Flaky(str(workdir / "checkpoints"), error, 100)
    with pytest.raises(CheckpointError, match="could not read checkpoint 2 .* it does not look "
                                              "damaged, so nothing was moved"):
        _restore(flaky, state, [])
    assert flaky.calls == (1 + manager_lib.RETRIES if retried else 1)
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]
    assert not (workdir / "damaged_checkpoints").exists()


def test_a_damaged_step_is_moved_aside_and_the_previous_one_restores(saved):
    workdir, state = saved
    for root, _, files in os.walk(workdir / "checkpoints" / "2" / "state"):
        for name in files:
            if name != "commit_success.txt":
                os.remove(os.path.join(root, name))
    said = []
    step, restored, _ = _restore(Checkpointer(str(workdir / "checkpoints"), keep=5), state, said)
    assert step == 1 and "checkpoint 2" in said[0] and "is damaged" in said[0]
    (moved,) = os.listdir(workdir / "damaged_checkpoints")
    assert moved.startswith("2-") and os.listdir(workdir / "checkpoints") == ["1"]


def _snapshot(directory):
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(directory) for f in files}


def _one_line(result, code, *fragments):
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    for fragment in fragments:
        assert fragment in line, line


@pytest.fixture(scope="module")
def own_cache_run(tmp_path_factory):
    """A run whose tokenizer and token cache are inside its workdir, stopped at step 6."""
    workdir = tmp_path_factory.mktemp("own") / "run"
    result = run_train(workdir, "--config.stop_at_step=6")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.mark.programs
def test_a_moved_run_samples_and_resumes_and_its_stale_temp_files_go(own_cache_run, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(own_cache_run, moved)
    os.rename(own_cache_run, own_cache_run.with_name("gone"))  # the original path is no more
    try:
        # A save in flight (a trainer writing now): sampling must leave it, and all else, alone.
        in_flight = moved / "checkpoints" / "8.orbax-checkpoint-tmp-1795546115"
        in_flight.mkdir()
        (in_flight / "part").write_bytes(b"x")
        before = _snapshot(moved)
        sample = subprocess.run([sys.executable, "sample.py", "--workdir", str(moved),
                                 "--max_new_tokens", "4"], cwd=ROOT, env=clean_env(),
                                capture_output=True, text=True, timeout=300)
        assert sample.returncode == 0, sample.stderr[-3000:]
        assert _snapshot(moved) == before
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = moved / "cache" / f"tokens-0123.npy.tmp-{dead.pid}.raw"  # a killed tokenizer's
        live = moved / "cache" / f"tokens-4567.npy.tmp-{os.getpid()}.raw"  # a live writer's
        stale.write_bytes(b"x"), live.write_bytes(b"x")
        resumed = run_train(moved, "--config.stop_at_step=8")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert not stale.exists() and live.exists()
        assert "data: training" not in resumed.stdout  # the copied run's own tokenizer
    finally:
        os.rename(own_cache_run.with_name("gone"), own_cache_run)


@pytest.mark.parametrize("override,fragments", [
    ("--config.seq_len=256", ["trained with seq_len=128 but this run has seq_len=256",
                             "--config.resume_accepts=seq_len"]),
    # one more file's worth of bytes: what a corpus grown by a file looks like to the cache
    ("--config.data.max_bytes=3000000", ["data fingerprint", "corpus changed",
                                         "--config.resume_accepts=data"]),
    ("--config.stop_at_step=4", ["stop_at_step=4 is not after step 6"]),
])
@pytest.mark.programs
def test_a_changed_run_is_refused_before_anything_is_written(own_cache_run, override,
                                                             fragments):
    before = _snapshot(own_cache_run)
    _one_line(run_train(own_cache_run, override), 2, *fragments)
    assert _snapshot(own_cache_run) == before


def test_what_defines_a_run_is_compared_and_a_named_change_accepted():
    import run_config
    from configs import tiny
    from training import resume
    config = run_config.build(tiny.get_config())
    meta = {"config": run_config.to_dict(config), "run": {"tokenizer": "aaaa", "data": "bbbb"}}
    identity = dict(resume.run_identity(config), tokenizer="aaaa", data="bbbb")
    resume.check_same_run(config, "d", 6, meta, identity)  # the same run
    for field, value in (("seed", 1), ("global_batch_size", 8), ("eval_fraction", 0.5),
                         ("tokenizer", "cccc")):
        changed = dict(identity, **{field: value})
        with pytest.raises(CheckpointError, match=f"resume_accepts={field} "):
            resume.check_same_run(config, "d", 6, meta, changed)
        accepting = run_config.replace(config, {"resume_accepts": f"seq_len,{field}"})
        resume.check_same_run(accepting, "d", 6, meta, changed)


@pytest.mark.programs
def test_consecutive_skipped_steps_stop_a_diverged_run(tmp_path):
    result = run_train(tmp_path, "--config.optim.learning_rate=1e30",
                       "--config.optim.skip_nonfinite=True", "--config.optim.max_skipped_steps=3",
                       "--config.log_every_steps=1")
    _one_line(result, 3, "3 steps in a row", "optim.max_skipped_steps=3", "stopped without saving")
    assert completed_checkpoints(tmp_path) == []


@pytest.mark.programs
def test_a_disk_the_checkpoints_fill_is_one_line_and_the_last_checkpoint_resumes(own_cache_run,
                                                                                   tmp_path):
    """A 6 MB disk filled by the run's own checkpoints (one every 2 steps, all kept): Orbax's save
    threads each log the failure with its traceback; the terminal gets one line, which names the
    file that holds them, and the last complete checkpoint resumes elsewhere."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    flags = (f"--config.data.cache_dir={own_cache_run / 'cache'}", "--config.num_train_steps=200",
             "--config.checkpoint_every_steps=2", "--config.checkpoint_keep=100")
    try:
        full = run_train(disk / "run", *flags)
        _one_line(full, 2, "No space left on device", "free space", "tracebacks: ")
        line = full.stderr.strip()
        kept = completed_checkpoints(disk / "run")
        assert kept and f"the last complete checkpoint ({kept[-1]}) is intact" in line, line
        log = line.rsplit("tracebacks: ", 1)[1].rstrip(")")
        with open(log) as f:
            text = f.read()
        assert text.count("Traceback (most recent call last)") >= 2 and "No space" in text
        shutil.copytree(disk / "run", tmp_path / "moved")
    finally:
        subprocess.run(["umount", str(disk)])
    resumed = run_train(tmp_path / "moved", *flags, f"--config.stop_at_step={kept[-1] + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(r) for r in open(tmp_path / "moved" / "metrics.jsonl")]
    assert [r["restored_step"] for r in rows if r.get("event") == "resumed"] == [kept[-1]]


_UNRETRIEVED = """
import asyncio, gc, sys
from absl import logging
logging.use_absl_handler()
from training.thread_log import ThreadLog
background = ThreadLog().install()
async def save():
    raise OSError(28, "No space left on device")
loop = asyncio.new_event_loop()
task = loop.create_task(save())
loop.run_until_complete(asyncio.sleep(0))
del task
gc.collect()
print("where:", background.save(sys.argv[1]), file=sys.stderr)
"""


def test_a_failed_save_task_that_asyncio_reports_at_collection_goes_to_the_log(tmp_path):
    """The flake behind a CI failure: an Orbax save task failed as the process ended, and asyncio
    printed 'Task exception was never retrieved' with its traceback under the one-line error."""
    result = subprocess.run([sys.executable, "-c", _UNRETRIEVED, str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, env=clean_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == f"where: {tmp_path / 'errors.log'}", result.stderr
    kept = (tmp_path / "errors.log").read_text()
    assert "Task exception was never retrieved" in kept and "No space left on device" in kept


def test_wandb_is_rewound_to_the_checkpoint_online_and_continued_offline(tmp_path, monkeypatch):
    """wandb drops points below its last step: online, a resume rewinds the run (resume_from)."""
    import types

    import run_config
    from configs import tiny
    from planner import resolve_run
    from training import trackers
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(
        init=lambda **kw: calls.append(kw) or types.SimpleNamespace(finish=lambda: None)))
    config = run_config.build(tiny.get_config())
    resolved = resolve_run(config, (2, 2), "cpu", "cpu")
    for mode, resumed in (("online", 12), ("online", 0), ("offline", 12)):
        monkeypatch.setenv("WANDB_MODE", mode)
        trackers.WandbTracker(config, str(tmp_path), (2, 2), resolved, "3f9a1c2b", resumed)
    rewound, fresh, offline = calls
    assert rewound["resume_from"] == "3f9a1c2b?_step=12" and "resume" not in rewound
    assert (fresh["id"], fresh["resume"]) == ("3f9a1c2b", "allow") and "resume_from" not in fresh
    assert (offline["id"], offline["resume"]) == ("3f9a1c2b", "allow")


@pytest.mark.parametrize("fault,outcome,left", [("damage", "restored 1", ["1"]),
                                                ("trouble", "refused", ["1", "2"])])
def test_processes_take_the_decision_of_the_one_that_fared_worst(tmp_path, fault, outcome, left):
    """Only process 1 of 2 finds step 2 wrong (tests/support/two_process_restore.py); deciding alone,
    process 0 would resume from step 2 while process 1 moved it away or stopped."""
    directory = tmp_path / "checkpoints"
    cmd = [sys.executable, "scripts/launch_local.py", "--processes", "2", "--timeout", "200",
           "--", "tests/support/two_process_restore.py", str(directory), fault]
    result = subprocess.run(cmd, cwd=ROOT, env=clean_env(processes=2), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    for p in (0, 1):
        assert f"[{p}] ok: {outcome}" in result.stdout, result.stdout[-3000:]
    assert sorted(os.listdir(directory)) == left
