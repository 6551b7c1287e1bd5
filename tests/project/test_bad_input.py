"""Bad input to train.py: one line naming the problem and the fix, a non-zero exit, no traceback,
and nothing written or overwritten."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.tiers import split
from tests.support.train_runs import (ROOT, clean_env, completed_checkpoints, read_metrics,
                                      run_train)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    """A workdir with checkpoints at steps 6 and 12, and its tokenizer."""
    workdir = tmp_path_factory.mktemp("trained")
    result = run_train(workdir, f"--config.data.cache_dir={cache}", "--config.stop_at_step=12",
                       "--config.checkpoint_every_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert completed_checkpoints(workdir) == [6, 12]
    tokenizer = next(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".model"))
    return workdir, tokenizer


def assert_user_error(result, *fragments, code=2):
    """Exit `code`, and stderr is one line holding every fragment."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr[-3000:]


def snapshot(directory):
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(directory) for f in files}


def test_value_of_wrong_type(tmp_path):
    result = run_train(tmp_path / "run", "--config.seq_len=long")
    assert_user_error(result, "--config.seq_len=long", "give a value of the field's type")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_processes_not_dividing_the_batch(tmp_path):
    from training.validate import ConfigError, validate_config
    from configs import tiny

    # One row over 2 processes (data 1 x seq 2): each builds its half of the row.
    config = tiny.get_config()
    config.global_batch_size = 1
    config.mesh.data, config.mesh.seq = 1, 2
    validate_config(config, device_count=2, process_count=2)
    config.global_batch_size = 6  # divisible by data shards (2), not by 4 processes: fine too
    config.mesh.data, config.mesh.seq = 2, 2
    validate_config(config, device_count=4, process_count=4)
    config.global_batch_size = 1  # the data shards still need whole rows
    with pytest.raises(ConfigError, match="not divisible by the data shards \\(2\\)"):
        validate_config(config, device_count=4, process_count=4)


def test_tpu_kernel_tiles_too_small_for_a_tpu():
    from training.validate import ConfigError, validate_config
    from configs import tiny

    config = tiny.get_config()  # 128 tokens / 2 seq shards: default tiles of 64
    config.parallel.kernel = "pallas_tpu"
    validate_config(config, device_count=4, process_count=1)  # a CPU: interpreted, any tile
    with pytest.raises(ConfigError, match="'pallas_tpu' needs tile_q and tile_k that are "
                                          "multiples of 128 on a TPU; got 64 x 64"):
        validate_config(config, device_count=4, process_count=1, platform="tpu")


@pytest.mark.parametrize("field,value,message", [
    ("loss_chunk", 48, "model.loss_chunk=48 does not divide the per-device block of 64 tokens"),
    ("mlp_chunk", -8, "model.mlp_chunk=-8 does not divide the per-device block of 64 tokens"),
    ("remat_policy", "some", "model.remat_policy='some': choose one of nothing, dots, attention, "
                     "offload"),
])
def test_memory_switches_that_cannot_work(field, value, message):
    from training.validate import ConfigError, validate_config
    from configs import tiny

    config = tiny.get_config()  # 128 tokens / 2 seq shards: blocks of 64
    config.model[field] = value
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config, device_count=4, process_count=1)


@pytest.mark.parametrize("make_source,fragments", split([
    (lambda d: str(d / "missing.txt"), ["data.source", "no such file or directory"]),
    (lambda d: str(_mkdir(d / "empty")), ["data.source", "empty"]),
    (lambda d: str(_write(d / "blob.bin", bytes(range(256)) * 64)), ["data.source"]),
], fast=[0], rest="programs"))
def test_bad_data_source(tmp_path, make_source, fragments):
    source = make_source(tmp_path)
    result = run_train(tmp_path / "run", f"--config.data.source={source}")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "run").exists()


@pytest.mark.programs
def test_corpus_smaller_than_one_sequence(tmp_path, trained):
    corpus = _write(tmp_path / "small.txt", b"def f():\n    return 1\n")
    result = run_train(tmp_path / "run", f"--config.data.source={corpus}",
                       f"--config.data.tokenizer_path={trained[1]}")
    # Refused before a token is read: 22 bytes make at most 3 x 22 + 1 tokens.
    assert_user_error(result, "can make at most 67 tokens", "bring a larger corpus")
    assert not (tmp_path / "run").exists()


def test_tokenizer_missing(tmp_path):
    result = run_train(tmp_path / "run", f"--config.data.tokenizer_path={tmp_path / 'no.model'}")
    assert_user_error(result, "data.tokenizer_path", "does not exist")
    assert not (tmp_path / "run").exists()


@pytest.mark.programs
def test_tokenizer_corrupt(tmp_path, cache):
    bad = _write(tmp_path / "bad.model", b"this is not a sentencepiece model" * 10)
    result = run_train(tmp_path / "run", f"--config.data.tokenizer_path={bad}",
                       f"--config.data.cache_dir={cache}")
    assert_user_error(result, str(bad))


@pytest.mark.programs
def test_tokenizer_vocabulary_not_matching_model(tmp_path, trained, cache):
    _, tokenizer = trained
    result = run_train(tmp_path / "run", f"--config.data.tokenizer_path={tokenizer}",
                       "--config.model.vocab_size=1024", f"--config.data.cache_dir={cache}")
    assert_user_error(result, "has 512 pieces but model.vocab_size is 1024",
                      "--config.model.vocab_size=512")
    assert not read_metrics(tmp_path / "run")


@pytest.mark.parametrize("override,fragments", [
    ("--config.model.d_model=128", ["model.d_model=64", "model.d_model=128"]),
    # stacked blocks are another parameter tree: a scanned run cannot continue an unrolled one
    ("--config.model.scan_layers=True", ["model.scan_layers=False", "model.scan_layers=True"]),
    # a norm's weights of each query and key head: parameters the checkpoint does not have
    ("--config.model.qk_norm=True", ["model.qk_norm=False", "model.qk_norm=True"]),
])
@pytest.mark.programs
def test_incompatible_checkpoint_is_refused_and_kept(tmp_path, trained, cache, override,
                                                     fragments):
    workdir = tmp_path / "copy"
    shutil.copytree(trained[0], workdir)
    before = snapshot(workdir)
    result = run_train(workdir, f"--config.data.cache_dir={cache}", override)
    assert_user_error(result, *fragments, "another --workdir")
    assert snapshot(workdir) == before


@pytest.mark.programs
def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path, trained, cache):
    workdir = tmp_path / "copy"
    shutil.copytree(trained[0], workdir)
    for path in snapshot(workdir / "checkpoints" / "12" / "state"):  # truncate every array file
        if os.path.getsize(path) > 64:
            with open(path, "r+b") as f:
                f.truncate(16)
    # Saving every 6 steps, the run reaches step 12 again: the damaged step must be out of its way.
    result = run_train(workdir, f"--config.data.cache_dir={cache}",
                       "--config.checkpoint_every_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoint 12" in result.stdout and "damaged" in result.stdout
    resumed = [r for r in read_metrics(workdir) if r.get("event") == "resumed"]
    assert resumed[-1]["restored_step"] == 6
    assert 12 in completed_checkpoints(workdir)  # written anew
    (moved,) = os.listdir(workdir / "damaged_checkpoints")  # kept, not deleted
    assert moved.startswith("12-")


def test_workdir_not_writable(tmp_path):
    blocker = _write(tmp_path / "a_file", b"x")
    result = run_train(os.path.join(blocker, "run"))
    assert_user_error(result, "not writable", "choose another --workdir")


@pytest.mark.programs
def test_workdir_that_cannot_be_created():
    """/proc passes a permission check as root, yet no directory can be made in it."""
    before = set(os.listdir("/proc"))
    result = run_train("/proc/ringstripe/run")
    assert_user_error(result, "workdir '/proc/ringstripe/run' cannot be created",
                      "choose another --workdir")
    assert not os.path.exists("/proc/ringstripe") and "ringstripe" not in before


def _mkdir(path):
    path.mkdir()
    return path


def _write(path, content: bytes):
    path.write_bytes(content)
    return str(path)


def _sample(*args):
    return subprocess.run([sys.executable, "sample.py", *args], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=300)


def test_sample_without_checkpoints(tmp_path):
    result = _sample("--workdir", str(tmp_path / "nothing"), "--prompt", "x")
    assert_user_error(result, "no checkpoints in", "train first")


@pytest.mark.programs
def test_sample_at_a_step_that_was_not_saved(trained):
    workdir, _ = trained
    result = _sample("--workdir", str(workdir), "--step", "7", "--prompt", "x")
    assert_user_error(result, "no checkpoint at step 7", "(available: [6, 12])",
                      "choose one of those steps")


def test_a_corpus_too_small_for_the_window_is_refused_before_anything_is_built(tmp_path):
    """No tokenizer trained, no workdir made: the file's size bounds its tokens."""
    corpus = tmp_path / "small.txt"
    corpus.write_text("def f(x):\n    return x\n" * 100)  # 2,300 bytes
    workdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
         f"--config.data.source={corpus}", "--config.seq_len=2048", "--config.parallel.tile=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "can make at most 6,901 tokens" in line  # 3 per byte, an EOS per file
    assert "bring a larger corpus" in line
    assert not workdir.exists()


@pytest.mark.parametrize("field", ["checkpoint_every_steps", "checkpoint_keep"])
def test_checkpoint_cadence_and_count_must_be_positive(field):
    """0 every steps divided by zero after compiling; keeping 0 checkpoints kept none."""
    from training.validate import ConfigError, validate_config
    from configs import tiny
    config = tiny.get_config()
    config[field] = 0
    with pytest.raises(ConfigError, match=f"^{field}=0 must be at least 1$"):
        validate_config(config, device_count=4, process_count=1)


@pytest.mark.parametrize("field,value,message", [
    ("stop_at_step", -1, "stop_at_step=-1: must be 0 (never) or a step"),
    ("data.eval_fraction", 1.0, "data.eval_fraction=1.0: must be a fraction in [0, 1), e.g. 0.005"),
    ("optim.learning_rate", 0.0, "optim.learning_rate=0.0: must be a positive rate"),
    ("data.passkey_weight", 0.0,
     "data.passkey_weight=0.0: must be a positive loss weight (1 = like any token)"),
    ("data.passkey_repeats", 1.5,
     "data.passkey_repeats=1.5: must be a share of the keys in [0, 1] (0 = as drawn, about a "
     "third)"),
    ("wandb_mode", "onlin", "wandb_mode='onlin': must be online, offline or disabled"),
    ("optim.max_skipped_steps", 0, "optim.max_skipped_steps=0 must be at least 1"),
])
def test_fields_that_would_fail_later_are_refused_first(field, value, message):
    """A bad eval_fraction was refused only after the tokenizer was trained; the others failed
    after compiling, or did nothing."""
    from training.validate import ConfigError, validate_config
    from configs import tiny
    config = tiny.get_config()
    section, _, name = field.rpartition(".")
    (config[section] if section else config)[name] = value
    with pytest.raises(ConfigError) as error:
        validate_config(config, device_count=4, process_count=1)
    assert str(error.value) == message
