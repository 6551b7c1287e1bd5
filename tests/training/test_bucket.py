"""A run whose workdir is a Cloud Storage bucket (gs://), against a GCS emulator on 127.0.0.1:
killed in its first save and started again, killed, refused to a second trainer, resumed on a
"new machine" (an empty local mirror), its damaged step moved aside, sampled; two processes
stopped by Ctrl-C to one; the same losses as a run on a local disk."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support.gcs_emulator import BUCKET, Emulator, free_port
from tests.support.hf_checkpoints import make_model_dir, write_text
from tests.support.train_runs import (ROOT, clean_env, command, losses, read_metrics, run_train,
                              wait_for_step)

SCHEDULE = ["--config.num_train_steps=2000", "--config.checkpoint_every_steps=10",
            "--config.log_every_steps=1", "--config.eval_every_steps=1000"]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    with Emulator(hold_commits=tmp_path_factory.mktemp("emulator") / "hold_commits") as emulator:
        yield emulator


def _train(gcs, workdir, mirror, *overrides, **kw):
    return subprocess.run(command(workdir, *overrides), cwd=ROOT, env=gcs.env(clean_env(), mirror),
                          capture_output=True, text=True, timeout=600, **kw)


def _wait_for_checkpoint(gcs, prefix, step, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(s >= step for s in gcs.committed_steps(prefix)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint >= {step} (exit {proc.poll()}): "
                         f"{proc.communicate(timeout=60)[1][-3000:] if proc.poll() else ''}")


@pytest.mark.programs
def test_bucket_run_killed_and_resumed_elsewhere_matches_a_local_run(gcs, tmp_path):
    """Killed inside its first save, then again once trained a while; refused to a second
    trainer; resumed on a "new machine"; the losses of a local run."""
    workdir = f"gs://{BUCKET}/killed"
    # The first save begins (its arrays reach the bucket) and cannot finish (the emulator holds
    # its commit marker); the trainer is killed then, whatever the timing.
    gcs.hold_commits.touch()
    try:
        first = subprocess.Popen(command(workdir, *SCHEDULE), cwd=ROOT,
                                 env=gcs.env(clean_env(), tmp_path / "host1"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while (not any("/state/" in n for n in gcs.listing("killed/checkpoints/10/"))
               and first.poll() is None and time.monotonic() < deadline):
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
        assert first.returncode == -signal.SIGKILL and not gcs.committed_steps("killed/")
    finally:
        gcs.hold_commits.unlink()
    # The same command: the unfinished step is moved aside, in one line, and the run starts over.
    restarted = subprocess.Popen(command(workdir, *SCHEDULE), cwd=ROOT,
                                 env=gcs.env(clean_env(), tmp_path / "host1"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_checkpoint(gcs, "killed/checkpoints/", 20, restarted)
        # A second trainer on the same bucket path, from another machine's mirror: refused.
        second = _train(gcs, workdir, tmp_path / "host2", *SCHEDULE)
        assert restarted.poll() is None, "the trainer ended before the second was refused"
    finally:
        restarted.send_signal(signal.SIGKILL)
        out, _ = restarted.communicate(timeout=60)
    (line,) = [s for s in out.splitlines() if "never finished" in s]
    assert "checkpoint 10 in" in line and "starting from step 0" in line
    assert any(n.startswith("killed/damaged_checkpoints/10-") for n in gcs.listing("killed/"))
    assert second.returncode == 2, second.stderr[-3000:]
    # one error line (a loaded CI machine once added a library's line beside it)
    (line,) = [ln for ln in second.stderr.splitlines() if ln.startswith("error: ")]
    assert f"in use by pid {restarted.pid}" in line and "use another --workdir" in line, (
        second.stderr)

    kept = gcs.committed_steps("killed/checkpoints/")
    stop = kept[-1] + 5
    # A new machine: nothing in its mirror (the tokenizer and token cache come from the bucket),
    # and the dead trainer's lock is taken over.
    resumed = _train(gcs, workdir, tmp_path / "host3", *SCHEDULE, f"--config.stop_at_step={stop}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "taking over the lock" in resumed.stdout and f"pid {restarted.pid}" in resumed.stdout
    assert "data: training" not in resumed.stdout  # the bucket's tokenizer, not a new one
    assert "killed/LOCK" not in gcs.listing("killed/")  # released at the end

    cache = tmp_path / "host3" / BUCKET / "killed" / "cache"
    local = run_train(tmp_path / "local", *SCHEDULE, f"--config.stop_at_step={stop}",
                      f"--config.data.cache_dir={cache}")
    assert local.returncode == 0, local.stderr[-3000:]
    rows = [json.loads(line) for line in gcs.read("killed/metrics.jsonl").splitlines()]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == stop  # one row per step, none twice
    assert losses(rows) == losses(read_metrics(tmp_path / "local"))  # bitwise, every step

    # The newest checkpoint loses its arrays' data: it is moved aside within the bucket, and the
    # one before it restores.
    for name in gcs.listing(f"killed/checkpoints/{stop}/state/"):
        if "/d/" in name:
            gcs.delete(name)
    again = _train(gcs, workdir, tmp_path / "host3", *SCHEDULE, f"--config.stop_at_step={stop + 2}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"checkpoint {stop} in gs://{BUCKET}/killed/checkpoints is damaged" in again.stdout
    assert any(n.startswith(f"killed/damaged_checkpoints/{stop}-") for n in gcs.listing("killed/"))
    assert gcs.committed_steps("killed/checkpoints/")[-2:] == [kept[-1], stop + 2]

    sample = subprocess.run([sys.executable, "sample.py", "--workdir", workdir, "--prompt",
                             "def ", "--max_new_tokens", "8", "--temperature", "0"], cwd=ROOT,
                            env=gcs.env(clean_env(), tmp_path / "host4"), capture_output=True,
                            text=True, timeout=300)
    assert sample.returncode == 0, sample.stderr[-3000:]
    assert f"step {stop + 2}" in sample.stderr and sample.stdout.startswith("def ")


def _bucket_metrics(gcs, prefix):
    return [json.loads(line) for line in gcs.read(f"{prefix}/metrics.jsonl").splitlines()]


@pytest.mark.programs
def test_a_stop_signal_to_both_processes_of_a_bucket_run_checkpoints_one_step(gcs, tmp_path):
    """Two processes on 127.0.0.1 (two hosts, each with its own local mirror); process 0 alone
    gets Ctrl-C (SIGINT), which it passes on as the SIGTERM that JAX's preemption service hears
    (a pod's maintenance event). Both agree on one step, both write their part of its
    checkpoint into the bucket, and exit 75 (stopped, not finished); it restores in one process on a third machine, and
    the losses match one process's uninterrupted run."""
    workdir, address = f"gs://{BUCKET}/pod", f"127.0.0.1:{free_port()}"
    schedule = ("--config.num_train_steps=2000", "--config.checkpoint_every_steps=1000",
                "--config.log_every_steps=1")
    pair = [subprocess.Popen(
        [*command(workdir, "--config.cpu_devices=2", *schedule), "--coordinator_address",
         address, "--num_processes", "2", "--process_id", str(i)], cwd=ROOT,
        env=gcs.env(clean_env(processes=2), tmp_path / f"host{i}"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:  # process 0 writes its rows to its mirror as it goes
        wait_for_step(tmp_path / "host0" / BUCKET / "pod", 6, pair[0])
        pair[0].send_signal(signal.SIGINT)
        results = [proc.communicate(timeout=300) for proc in pair]
    finally:
        for proc in pair:
            proc.kill() if proc.poll() is None else None
    assert [p.returncode for p in pair] == [75, 75], [err[-2000:] for _, err in results]
    (step,) = gcs.committed_steps("pod/checkpoints/")
    stopped = [r for r in _bucket_metrics(gcs, "pod") if r.get("event") == "stopped on request"]
    assert [r["step"] for r in stopped] == [step]

    resumed = _train(gcs, workdir, tmp_path / "host2", *schedule,
                     f"--config.stop_at_step={step + 3}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    cache = tmp_path / "host2" / BUCKET / "pod" / "cache"  # the bucket's, as host 2 pulled it
    reference = run_train(tmp_path / "one", *schedule, f"--config.stop_at_step={step + 3}",
                          f"--config.data.cache_dir={cache}")
    assert reference.returncode == 0, reference.stderr[-3000:]
    got, want = losses(_bucket_metrics(gcs, "pod")), losses(read_metrics(tmp_path / "one"))
    assert sorted(got) == list(range(1, step + 4))  # one row per step across the restart
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)],
                               rtol=1e-4)  # two processes' reductions against one's


@pytest.mark.programs
def test_an_offline_wandb_run_in_a_bucket_outlives_its_machine(gcs, tmp_path):
    """Offline wandb files are written on the VM; killed after its first checkpoint, the run
    has left them in WORKDIR/wandb/ in the bucket (what `wandb sync` reads)."""
    env = dict(gcs.env(clean_env(), tmp_path / "host1"), WANDB_MODE="offline")
    proc = subprocess.Popen(command(f"gs://{BUCKET}/tracked", *SCHEDULE, "--config.tracker=wandb"),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for_checkpoint(gcs, "tracked/checkpoints/", 10, proc)
        deadline = time.monotonic() + 120
        while (not [n for n in gcs.listing("tracked/wandb/") if n.endswith(".wandb")]
               and time.monotonic() < deadline and proc.poll() is None):
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    (log,) = [n for n in gcs.listing("tracked/wandb/") if n.endswith(".wandb")]
    assert re.fullmatch(r"tracked/wandb/offline-run-[0-9_]+-(\w+)/run-\1\.wandb", log), log
    assert len(gcs.read(log)) > 0


@pytest.mark.programs
@pytest.mark.parametrize("case", ["default_untied_sharded", "qwen2_tied_window"])
def test_hugging_face_weights_in_a_bucket_train_as_their_local_copy(gcs, tmp_path, case):
    """A tiny Llama (sharded, with an index) and a tiny Qwen2 saved by transformers, with their
    tokenizer, in a bucket: init_from=hf:gs://... reads config.json, the tokenizer and ranges of
    the safetensors through the storage layer; the first loss is the local copy's."""
    corpus = write_text(str(tmp_path / "corpus.txt"))
    local = make_model_dir(str(tmp_path / "model"), corpus, case=case)
    for name in os.listdir(local):
        with open(os.path.join(local, name), "rb") as f:
            gcs.write(f"models/{case}/{name}", f.read())
    first = {}
    for where, path in (("local", local), ("bucket", f"gs://{BUCKET}/models/{case}")):
        result = _train(gcs, tmp_path / where, tmp_path / f"mirror-{where}",
                        f"--config.init_from=hf:{path}", f"--config.data.source={corpus}",
                        "--config.seq_len=64", "--config.global_batch_size=2",
                        "--config.num_train_steps=1", "--config.log_every_steps=1",
                        "--config.eval_batches=1")
        assert result.returncode == 0, result.stderr[-3000:]
        first[where] = losses(read_metrics(tmp_path / where))[1]
    assert first["bucket"] == first["local"], first


def test_a_bucket_that_does_not_exist_is_one_line_before_anything_is_built(gcs, tmp_path):
    result = _train(gcs, "gs://no-such-bucket/run", tmp_path / "host")
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert "workdir 'gs://no-such-bucket/run' cannot be written" in line
    assert not (tmp_path / "host").exists()


def test_checkpoints_written_through_a_mount_are_refused_not_deleted(gcs, tmp_path):
    """Saves renamed into place through gcsfuse carry no commit marker; Orbax on gs:// would
    take them for unfinished saves and delete them."""
    for name in ("mounted/checkpoints/10/state/manifest.ocdbt",
                 "mounted/checkpoints/20/state/manifest.ocdbt"):
        gcs.write(name, b"x")
    result = _train(gcs, f"gs://{BUCKET}/mounted", tmp_path / "host")
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert "checkpoints [10, 20]" in line and "commit_success.txt" in line
    assert gcs.listing("mounted/") == ["mounted/checkpoints/10/state/manifest.ocdbt",
                                       "mounted/checkpoints/20/state/manifest.ocdbt"]
