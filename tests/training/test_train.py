"""End to end: train.py with configs/tiny.py, as a user runs it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import parallel
from tests.tiers import split
from tests.support.train_runs import ROOT, clean_env, read_metrics, run_train

METRIC_NAMES = ["train/loss", "throughput/tokens_per_sec", "throughput/tokens_per_sec_per_device",
                "throughput/step_time_s", "throughput/model_tflops_per_device", "throughput/mfu",
                "learning/lr", "learning/grad_norm"]


# A layout by name runs the ring strategy; 'memory': striped with every memory option of model/
# on (the block is 64 tokens per device); 'auto': the config's defaults, every attention and
# memory setting left to the planner (tiny sets its tile: 'auto' here as in configs/default.py).
PINNED = ["--config.parallel.strategy=ring"]
KIND_FLAGS = {"memory": ["--config.parallel.layout=striped", *PINNED,
                         "--config.model.loss_chunk=16", "--config.model.mlp_chunk=32",
                         "--config.model.scan_layers=True", "--config.model.remat=True"],
              "auto": ["--config.parallel.tile=auto"]}


class Runs(dict):
    """train.py's run of each kind, started the first time a test asks for it (the fast tier
    asks for 'auto' alone, the programs tier for the rest)."""

    def __init__(self, tmp_path_factory, cache):
        super().__init__()
        self.tmp_path_factory, self.cache = tmp_path_factory, cache

    def __missing__(self, kind):
        workdir = self.tmp_path_factory.mktemp(kind)
        flags = KIND_FLAGS.get(kind, [f"--config.parallel.layout={kind}", *PINNED])
        result = run_train(workdir, *flags, f"--config.data.cache_dir={self.cache}")
        assert result.returncode == 0, result.stderr[-3000:]
        self[kind] = (read_metrics(workdir), result, workdir)
        return self[kind]

    def curve(self, kind):
        return np.array([r["train/loss"] for r in self[kind][0]])


@pytest.fixture(scope="module")
def losses_by_kind(tmp_path_factory, token_cache):
    # ring against striped through train.py is tests/project/test_figures.py's bench_train case.
    return Runs(tmp_path_factory, token_cache)


def test_tiny_run_writes_metrics_and_learns(losses_by_kind):
    rows, result, _ = losses_by_kind["auto"]  # the defaults, as a user's first run has them
    # Step 1 compiles: its loss is logged, its time is not (no throughput for it).
    assert [r["step"] for r in rows] == [1] + list(range(2, 21, 2))
    assert np.isfinite(rows[0]["train/loss"]) and "throughput/tokens_per_sec" not in rows[0]
    for row in rows[1:]:
        for name in METRIC_NAMES:
            assert np.isfinite(row[name]), (row["step"], name)
    losses = [r["train/loss"] for r in rows]
    assert losses[-1] < losses[0] - 0.5, losses
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [10, 20]
    assert evals[-1]["eval/loss"] < np.log(512)
    assert np.isclose(evals[-1]["eval/perplexity"], np.exp(evals[-1]["eval/loss"]), rtol=1e-5)
    assert "step 1/20" in result.stdout and "(compiled)" in result.stdout
    assert "tokens/s" in result.stdout


@pytest.mark.programs
def test_zigzag_trains_the_same_loss_curve_as_striped(losses_by_kind):
    np.testing.assert_allclose(losses_by_kind.curve("zigzag"), losses_by_kind.curve("striped"),
                               rtol=2e-4)


@pytest.mark.programs
def test_chunked_loss_tiled_mlp_and_scanned_layers_train_as_the_plain_model(losses_by_kind):
    """Same weights at the start (scan_layers stacks the blocks the unrolled model draws), the
    same gradients within float32 rounding, so the same curve."""
    memory, striped = losses_by_kind.curve("memory"), losses_by_kind.curve("striped")
    print("largest |memory - striped| loss:", np.abs(memory - striped).max())
    np.testing.assert_allclose(memory, striped, rtol=1e-5)


def test_bad_config_is_one_line_error(tmp_path):
    """train.py refuses a bad config with one line, exit 2, before anything is written; the
    other bad configs below take the same path (validate_config), checked in-process."""
    result = run_train(tmp_path / "run", "--config.parallel.layout=spiral")
    assert result.returncode == 2
    assert "parallel.layout='spiral' is not a known layout" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("fields,message", [
    ({"mesh.data": 3}, "mesh.data x mesh.seq = 3 x 2 does not match the 4 devices"),
    ({"seq_len": 130, "parallel.layout": "zigzag"},
     "seq_len 130 is not divisible by 4 (zigzag needs 2 x 2 seq shards)"),
    ({"parallel.tile": 48}, "parallel.tile=48: 48 does not divide the per-device block of 64"),
    ({"parallel.tile": "64x"}, "parallel.tile='64x' is not a tile"),
    ({"model.num_kv_heads": 3}, "model.num_heads=4 is not a multiple of model.num_kv_heads=3"),
    ({"data.loader": "dali"}, "data.loader='dali': choose one of thread, grain"),
    ({"tracker": "tensorboard"}, "tracker='tensorboard': choose one of wandb, jsonl, none"),
    ({"global_batch_size": 3}, "global_batch_size=3 is not divisible by the data shards"),
])
def test_bad_config_message(fields, message):
    from configs import tiny
    from training.validate import ConfigError, validate_config
    config = tiny.get_config()
    for field, value in fields.items():
        section, _, name = field.rpartition(".")
        (config[section] if section else config)[name] = value
    with pytest.raises(ConfigError) as error:
        validate_config(config, device_count=4, process_count=1)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_unknown_config_key_is_rejected(tmp_path):
    result = run_train(tmp_path / "run", "--config.num_train_step=1")
    assert result.returncode == 2
    assert result.stderr.startswith(  # the field as written, and ml_collections' guess
        "error: unknown config field 'num_train_step' (Did you mean \"num_train_steps\" "
        "instead of \"num_train_step\"?): every --config.FIELD must exist"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text,argv,message", [
    (None, ["--config=configs/nope.py"], "config file 'configs/nope.py' does not exist: give a "
     "file such as configs/tiny.py"),
    ("x = (\n", [], "does not load: SyntaxError: '(' was never closed (line 1): fix the file"),
    ("def get_config():\n    return {}['seq']\n", [], "does not load: KeyError: 'seq'"),
    ("x = 1\n", [], "defines no get_config()"),
    ("def get_config():\n    return 3\n", [], "returned an object of type int, not an "
     "ml_collections.ConfigDict"),
])
def test_a_config_file_mistake_is_one_line(text, argv, message, tmp_path, capsys):
    """What train.py, scripts/plan.py and scripts/bench/window.py parse their flags with."""
    from absl import flags
    from ml_collections import config_flags

    from training.cli import parse_flags
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "a config", flag_values=values,
                                    lock_config=True)
    if text is not None:
        (tmp_path / "mine.py").write_text(text)
        argv = [f"--config={tmp_path / 'mine.py'}"]
    with pytest.raises(SystemExit) as e:
        parse_flags(["train.py", *argv], flag_values=values)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("command", split([  # train.py and bench/window.py parse as plan.py does
    ["scripts/plan.py"], ["scripts/bench/train.py"], ["scripts/bench/bound.py"],
    ["scripts/bench/extension.py", "--workdir", "/tmp/never", "--out", "/tmp/never/x.png",
     "--json", "/tmp/never/x.json"]], fast=[0], rest="programs"))
def test_a_missing_config_file_is_one_line_in_every_entry_point(command):
    result = subprocess.run([sys.executable, *command, "--config", "configs/nope.py"],
                            cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr == ("error: config file 'configs/nope.py' does not exist: give a file "
                             "such as configs/tiny.py\n")
    assert not os.path.exists("/tmp/never")


@pytest.mark.programs
def test_the_old_layout_and_tile_fields_name_the_new_ones(tmp_path):
    """parallel.attention became parallel.layout, model.tile_q/tile_k parallel.tile: on the
    command line and in a config file."""
    result = run_train(tmp_path / "run", "--config.parallel.attention=striped")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --config.parallel.attention was renamed: use "
                                     "--config.parallel.layout"), result.stderr
    result = run_train(tmp_path / "run", "--config.model.tile_q=64")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --config.model.tile_q moved into parallel.tile: use "
                                     "--config.parallel.tile=VALUE (512, '256x128' (query x key) "
                                     "or 'auto')"), result.stderr
    old = tmp_path / "old_config.py"
    old.write_text("from configs import tiny\n\ndef get_config():\n    c = tiny.get_config()\n"
                   "    c.parallel.attention = c.parallel.layout\n    del c.parallel['layout']\n"
                   "    return c\n")
    result = run_train(tmp_path / "run", config=str(old))
    assert result.returncode == 2
    assert "parallel.attention was renamed parallel.layout" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


def test_auto_is_recorded_as_what_it_resolved_to(losses_by_kind):
    """The defaults leave the layout, strategy, tile and memory switches 'auto': they are
    resolved before anything is built, the first line says to what, the metrics and the
    checkpoint record carry the resolved values, never 'auto'."""
    rows, result, workdir = losses_by_kind["auto"]
    said = next(line for line in result.stdout.splitlines() if line.startswith(
        "ringstripe: auto (layout, strategy, tile, remat, remat_policy, scan_layers, "
        "loss_chunk, mlp_chunk) ->"))
    first = rows[0]
    layout, strategy = first["attention/layout"], first["attention/strategy"]
    assert layout in parallel.LAYOUTS and strategy in parallel.STRATEGIES
    assert first["attention/kernel"] == "xla"
    assert f"{layout} attention ({strategy}" in said
    meta = json.loads((workdir / "checkpoints" / "20" / "meta" / "metadata").read_text())
    assert {k: meta["attention"][k] for k in ("layout", "strategy", "tile_q")} == \
        {"layout": layout, "strategy": strategy, "tile_q": first["attention/tile_q"]}
    assert meta["config"]["parallel"]["strategy"] == "auto"  # what the user asked for, kept
    # tiny fits its devices many times over: auto turns no memory switch on
    assert "; no memory switches: predicted" in said and "(fits)" in said
    off = {"remat": False, "remat_policy": "nothing", "scan_layers": False, "loss_chunk": 0,
           "mlp_chunk": 0, "linear_chunk": 0}
    assert meta["memory_switches"] == off and meta["config"]["model"]["scan_layers"] == "auto"
    assert {k: first[f"memory/{k}"] for k in off} == off


@pytest.mark.programs
def test_auto_written_out_by_hand_gives_the_same_run(tmp_path, token_cache, losses_by_kind):
    """Everything 'auto' resolved to (layout, strategy and degree, tile, memory switches)
    written out by hand, and the grain loader: the same losses as the defaults' run."""
    rows = losses_by_kind["auto"][0]
    first = rows[0]
    by_hand = [f"--config.parallel.{k}={first[f'attention/{k}']}"
               for k in ("layout", "strategy", "ulysses_degree")]
    by_hand.append(f"--config.parallel.tile={first['attention/tile_q']}x"
                   f"{first['attention/tile_k']}")
    by_hand += [f"--config.model.{k}={first[f'memory/{k}']}" for k in (
        "remat", "remat_policy", "scan_layers", "loss_chunk", "mlp_chunk", "linear_chunk")]
    result = run_train(tmp_path, "--config.data.loader=grain", *by_hand,
                       f"--config.data.cache_dir={token_cache}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ringstripe: auto" not in result.stdout  # nothing left to the planner
    got = [r["train/loss"] for r in read_metrics(tmp_path)]
    assert got == [r["train/loss"] for r in rows]


@pytest.mark.programs
def test_train_and_evaluate_is_importable_and_runs_in_process(tmp_path, token_cache):
    """`from train import train_and_evaluate`, as in Flax's examples (in a fresh interpreter:
    train.py defines absl flags, which other modules imported by the tests define too)."""
    script = f"""
import jax
jax.config.update("jax_num_cpu_devices", 4)
from train import train_and_evaluate
from configs import tiny
config = tiny.get_config()
config.num_train_steps, config.eval_every_steps = 4, 4
config.data.cache_dir = {token_cache!r}
last = train_and_evaluate(config, {str(tmp_path)!r})
print("LOSS", last["train/loss"], last["eval/loss"])
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(x) for x in result.stdout.split("LOSS")[1].split()]
    assert all(np.isfinite(losses))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 4]
