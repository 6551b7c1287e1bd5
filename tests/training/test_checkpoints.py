"""Checkpoints: exact resume, other meshes and layouts, preemption, SIGKILL, NaN, multi-host."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.support.train_runs import (ROOT, clean_env, completed_checkpoints, losses, read_metrics,
                              run_train, start_train, terminate, wait_for_step)

STEPS = 20
WANDB_OFFLINE = dict(clean_env(), WANDB_MODE="offline")  # wandb writes its run files locally


@pytest.fixture(scope="module")
def cache(token_cache):
    return f"--config.data.cache_dir={token_cache}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache):
    """The reference: tiny, striped, data 2 x seq 2, 20 steps without a stop."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    result = run_train(workdir, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def stopped_at_6(tmp_path_factory, cache):
    """A run stopped on request after step 6, tracked by wandb (offline) too; tests copy it."""
    workdir = tmp_path_factory.mktemp("stopped_at_6")
    result = run_train(workdir, cache, "--config.stop_at_step=6", "--config.tracker=wandb",
                       env=WANDB_OFFLINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert completed_checkpoints(workdir) == [6]
    return workdir


def copy_run(source, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(source, target, symlinks=True)  # wandb's latest-run stays a link
    return target


def load_state(workdir, step):
    """A checkpoint's arrays as numpy, whatever mesh wrote them."""
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return jax.tree.leaves(checkpointer.restore(path, restore_args=args))


@pytest.mark.programs
def test_resume_is_bitwise_identical_and_wandb_continues_its_run(tmp_path, cache,
                                                                  uninterrupted, stopped_at_6):
    tmp_path = copy_run(stopped_at_6, tmp_path)
    # The same command again: resumes without any flag.
    second = run_train(tmp_path, cache, "--config.tracker=wandb", env=WANDB_OFFLINE)
    assert second.returncode == 0, second.stderr[-3000:]
    runs = sorted(d for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-"))
    assert len(runs) == 2 and runs[0].split("-")[-1] == runs[1].split("-")[-1]  # one run id
    rows = read_metrics(tmp_path)  # wandb implies metrics.jsonl
    events = [r for r in rows if "event" in r]
    assert [(e["event"], e["step"]) for e in events] == [("stopped on request", 6), ("resumed", 6)]
    want, got = losses(read_metrics(uninterrupted)), losses(rows)
    assert set(got) == set(want) | {7}  # the first step after the resume is logged too
    assert {s: got[s] for s in want} == want  # every logged step, before and after, bitwise
    for got, expected in zip(load_state(tmp_path, STEPS), load_state(uninterrupted, STEPS)):
        np.testing.assert_array_equal(got, expected)
    # Counters continue across the restart.
    assert rows[-1]["progress/train_tokens"] == STEPS * 4 * 128


@pytest.mark.programs
def test_resume_on_another_mesh_and_layout(tmp_path, cache, uninterrupted, stopped_at_6):
    """Stopped on data 2 x seq 2 (striped), resumed on data 2 x seq 1 (ring, 2 devices)."""
    tmp_path = copy_run(stopped_at_6, tmp_path)
    second = run_train(tmp_path, cache, "--config.parallel.layout=ring", "--config.cpu_devices=2",
                       "--config.mesh.data=2", "--config.mesh.seq=1")
    assert second.returncode == 0, second.stderr[-3000:]
    rows = read_metrics(tmp_path)
    resumed = next(r for r in rows if r.get("event") == "resumed")
    assert resumed["attention"] == "ring" and resumed["mesh"] == [2, 1]
    got, want = losses(rows), losses(read_metrics(uninterrupted))
    assert set(got) == set(want) | {7}  # 7: the first step after the resume
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)],
                               rtol=1e-4)


@pytest.mark.programs
def test_a_checkpoint_from_before_the_layout_rename_resumes_and_samples(tmp_path, cache,
                                                                      uninterrupted,
                                                                      stopped_at_6):
    """Checkpoints written when the layout field was parallel.attention (and the record's
    'attention' key held it) resume with today's config and sample with sample.py."""
    tmp_path = copy_run(stopped_at_6, tmp_path)
    path = tmp_path / "checkpoints" / "6" / "meta" / "metadata"
    meta = json.loads(path.read_text())
    ran = meta["attention"]["layout"]  # before the rename, no layout was 'auto'
    meta["config"]["parallel"].pop("layout")
    meta["config"]["parallel"]["attention"] = ran
    meta["attention"] = ran  # the old record: the layout
    path.write_text(json.dumps(meta))
    sample = subprocess.run([sys.executable, "sample.py", "--workdir", str(tmp_path),
                             "--max_new_tokens", "4"], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert sample.returncode == 0, sample.stderr[-3000:]
    assert f"{ran} layout" in sample.stderr
    second = run_train(tmp_path, cache, "--config.stop_at_step=8")
    assert second.returncode == 0, second.stderr[-3000:]
    got, want = losses(read_metrics(tmp_path)), losses(read_metrics(uninterrupted))
    assert got[8] == want[8]  # resumed bitwise from the old record


@pytest.mark.programs
def test_parameters_alone_restore_as_in_the_whole_state(uninterrupted):
    """restore_params (sample.py's) reads state['params'] only, equal to a whole restore's."""
    import parallel
    from checkpoints import Checkpointer
    from configs import tiny
    from planner import resolve_run
    from run_config import build
    from training.state import create_train_state
    config = build(tiny.get_config())
    mesh = parallel.make_mesh(2, 2, devices=jax.devices()[:4])
    resolved = resolve_run(config, (2, 2), "cpu", "cpu")
    state, *_ = create_train_state(config, mesh, resolved, abstract=True)
    restored = []
    for read in (lambda c: c.restore_params(STEPS, state["params"]),
                 lambda c: c.restore(STEPS, state)[0]["params"]):
        checkpointer = Checkpointer(os.path.join(uninterrupted, "checkpoints"), keep=10)
        try:  # one Checkpointer per kind of restore: Orbax binds an item to its first handler
            restored.append(read(checkpointer))
        finally:
            checkpointer.close()
    params, whole = restored
    got, want = jax.tree.leaves(params), jax.tree.leaves(whole)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


@pytest.mark.programs
def test_ctrl_c_saves_the_current_step_and_the_same_command_resumes_as_if_uninterrupted(
        tmp_path, cache, uninterrupted):
    """Ctrl-C (SIGINT) stops as SIGTERM does: the step finishes, a checkpoint of it, exit 75, one
    line on stderr; the same command resumes, and the losses are the uninterrupted run's, bit
    for bit. (An eval at every step keeps the run going well past the signal; evaluation
    changes no training step.)"""
    command = (cache, "--config.eval_every_steps=1", "--config.log_every_steps=1")
    proc = start_train(tmp_path, *command)
    wait_for_step(tmp_path, 1, proc)  # past the first step: training, the handler in place
    code, out, err = terminate(proc, signal.SIGINT)
    assert code == 75, err[-3000:]  # not finished: a scheduler would start it again
    (line,) = err.strip().splitlines()
    assert "Ctrl-C: finishing this step and saving a checkpoint" in line
    stopped = [r for r in read_metrics(tmp_path) if r.get("event") == "stopped on request"]
    step = stopped[0]["step"]
    assert len(stopped) == 1 and 1 <= step < STEPS
    assert completed_checkpoints(tmp_path) == [step]
    resumed = run_train(tmp_path, *command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert next(r for r in rows if r.get("event") == "resumed")["restored_step"] == step
    got, want = losses(rows), losses(read_metrics(uninterrupted))
    assert sorted(got) == list(range(1, STEPS + 1)) and {s: got[s] for s in want} == want


def test_a_second_ctrl_c_stops_at_once_without_saving():
    """The second SIGINT ends the process inside its handler, exit 130 (a save that hangs, a step
    that never ends), with one line more."""
    code = ("import os, signal, time\n"
            "from checkpoints import StopRequest\n"
            "stop = StopRequest(None)\n"
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)\n"
            "assert stop.should_stop(1)\n"
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(10)\n"
            "print('still running')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 130 and "still running" not in result.stdout, result.stderr
    first, second = result.stderr.strip().splitlines()
    assert "Ctrl-C again stops at once" in first and "a second Ctrl-C: stopped at once" in second


@pytest.mark.programs
def test_sigkill_three_times_then_same_final_loss(tmp_path, cache, uninterrupted):
    """Kills land at varied moments, many while an asynchronous save is being written
    (a save every 2 steps); each restart must resume from the last completed checkpoint."""
    rng = random.Random(0)
    overrides = (cache, "--config.checkpoint_every_steps=2", "--config.log_every_steps=1")
    for attempt in range(3):
        before = completed_checkpoints(tmp_path)
        started = time.time()
        proc = start_train(tmp_path, *overrides)
        # Once this attempt is training (past the resumed step), kill at a random moment: with
        # a save every 2 steps of about 30 ms, many kills land while a save is being written.
        wait_for_step(tmp_path, (before[-1] if before else 0) + 1, proc, since=started)
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        resumes = [r for r in read_metrics(tmp_path) if r.get("event") == "resumed"]
        if before:
            assert resumes and resumes[-1]["restored_step"] == before[-1], (attempt, before)
        names = os.listdir(tmp_path / "checkpoints") if (tmp_path / "checkpoints").exists() else []
        leftovers = [d for d in names if not d.isdigit()]
        assert all("tmp" in d for d in leftovers)  # only unfinished saves, cleaned on restart
    final = run_train(tmp_path, *overrides)
    assert final.returncode == 0, final.stderr[-3000:]
    assert not [d for d in os.listdir(tmp_path / "checkpoints") if "tmp" in d]
    got, want = losses(read_metrics(tmp_path)), losses(read_metrics(uninterrupted))
    assert got[STEPS] == want[STEPS]
    # Steps logged after a checkpoint and before a kill were dropped when logged again.
    steps = [r["step"] for r in read_metrics(tmp_path) if "train/loss" in r]
    assert steps == sorted(set(steps)) == list(range(1, STEPS + 1))
    for a, b in zip(load_state(tmp_path, STEPS), load_state(uninterrupted, STEPS)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.programs
def test_nonfinite_loss_stops_without_touching_the_last_good_checkpoint(tmp_path, cache,
                                                                        uninterrupted):
    tmp_path = copy_run(uninterrupted, tmp_path)
    shutil.rmtree(tmp_path / "checkpoints" / str(STEPS))  # as if it had stopped after step 10
    files = {p: os.stat(p).st_mtime_ns for p in _files(tmp_path / "checkpoints")}
    bad = run_train(tmp_path, cache, "--config.optim.learning_rate=1e30")
    assert bad.returncode == 3
    step = re.search(r"is (nan|inf|-inf) at step (\d+)", bad.stderr)
    assert step and int(step.group(2)) > 10, bad.stderr[-2000:]
    assert "last good checkpoint: 10" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert completed_checkpoints(tmp_path) == [10]
    assert {p: os.stat(p).st_mtime_ns for p in _files(tmp_path / "checkpoints")} == files


@pytest.mark.programs
def test_nonfinite_batches_can_be_skipped(tmp_path, cache):
    result = run_train(tmp_path, cache, "--config.optim.learning_rate=1e30",
                       "--config.optim.skip_nonfinite=True", "--config.num_train_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path) if "train/loss" in r]
    assert any(r["learning/skipped"] == 1 for r in rows)
    assert completed_checkpoints(tmp_path) == [6]


def _files(directory):
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files]
