"""config.stages: one config, several trainings in a row, each from the last weights of the one
before, on one time axis, resumable inside any stage."""

import numpy as np
import pytest

from checkpoints import Checkpointer
from configs import tiny
from tests.support.train_runs import read_metrics
from training import ConfigError, train_and_evaluate


def staged_config(stop_at_step=0, **second):
    config = tiny.get_config()
    config.mesh.data, config.mesh.seq = 2, 4  # the 8 devices of tests/conftest.py
    config.log_every_steps, config.eval_batches = 1, 1
    config.eval_position_buckets, config.data.eval_fraction = 4, 0.05  # the loss by position
    config.data.max_bytes = 500_000
    config.stop_at_step = stop_at_step
    with config.unlocked():
        long = dict(name="long", steps=2, seq_len=256, global_batch_size=2,
                    model=dict(rope_theta=40_000.0,
                               rope_scaling=dict(rope_type="linear", factor=2.0)))
        config.stages = (dict(name="short", steps=2), {**long, **second})
    return config


def saved(workdir, step):
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    try:
        return checkpointer.read_meta(step)
    finally:
        checkpointer.close()


@pytest.mark.programs
def test_two_stages_with_a_resume_inside_the_second(tmp_path, capsys):
    workdir = tmp_path / "run"
    train_and_evaluate(staged_config(stop_at_step=2), str(workdir))  # stage 1's last step
    assert "ringstripe: stage 1/2 (short): 128 tokens a sequence, 2 steps, in" \
        in capsys.readouterr().out
    assert not (workdir / "stage2").exists()  # the next stage waits
    train_and_evaluate(staged_config(stop_at_step=3), str(workdir))  # stops at stage 2's step 1
    assert sorted(p.name for p in (workdir / "stage2" / "checkpoints").iterdir()) == ["1"]
    last = train_and_evaluate(staged_config(), str(workdir))  # resumes inside stage 2
    assert np.isfinite(last["train/loss"])
    out = capsys.readouterr().out
    assert "ringstripe: stage 1/2 (short) finished earlier, 2 steps: skipped" in out
    assert f"ringstripe: stage 2/2 (long): 256 tokens a sequence, 2 steps, in {workdir}" in out
    rows = [r for r in read_metrics(workdir) if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # one time axis, each step once
    assert [r["progress/stage"] for r in rows] == [1, 1, 2, 2]
    # At each eval (here the end of each stage), the loss by original position: as many values
    # as buckets, over the stage's own length.
    curves = {r["step"]: r for r in rows if "eval/loss_by_position" in r}
    assert sorted(curves) == [2, 4] and len(curves[4]["eval/loss_by_position"]) == 4
    assert (curves[2]["eval/position_bucket_tokens"], curves[4]["eval/position_bucket_tokens"]) \
        == (32.0, 64.0)
    # Stage 2 started from stage 1's last weights (its first loss continues the curve rather
    # than starting over from a random model's) and ran with its own settings.
    assert rows[2]["train/loss"] < rows[0]["train/loss"] - 0.05
    meta = saved(workdir / "stage2", 2)
    assert meta["config"]["seq_len"] == 256 and meta["config"]["model"]["rope_theta"] == 40_000.0
    assert meta["config"]["model"]["rope_scaling"]["rope_type"] == "linear"
    assert meta["config"]["init_from"] == f"run:{workdir / 'stage1'}@2"
    # One tokenizer and token cache for every stage; the run's counters continue.
    assert sorted(p.name for p in workdir.iterdir()) == ["cache", "metrics.jsonl", "stage1",
                                                         "stage2"]
    assert meta["train_tokens"] > saved(workdir / "stage1", 2)["train_tokens"]
    assert meta["wandb_run_id"] == saved(workdir / "stage1", 2)["wandb_run_id"]
    # A finished staged run is not trained again.
    before = read_metrics(workdir)
    assert train_and_evaluate(staged_config(), str(workdir)) == {}
    assert read_metrics(workdir) == before
    # sample.py, hf/export.py and the probes given the run's workdir read its last stage.
    from training.saved_run import load_run
    config, *_, step = load_run(str(workdir), None, 1)
    assert (config.seq_len, step) == (256, 2)


@pytest.mark.parametrize("second,expected", [
    (dict(model=dict(rope_thta=1.0)), "sets 'model.rope_thta', which is not a config field"),
    (dict(init_from="hf:/x"), "sets 'init_from'"),
    (dict(seq_len=250), "seq_len"),  # 250 tokens do not split over 4 seq shards
])
def test_a_bad_stage_is_refused_before_the_first_trains(second, expected, tmp_path):
    with pytest.raises(ConfigError, match=expected):
        train_and_evaluate(staged_config(**second), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def _parse(*args):
    from absl import flags
    from ml_collections import config_flags

    from training.cli import parse_flags
    argv = ["train.py", "--config", "configs/extend_8k.py", *args]
    flag_values = flags.FlagValues()  # (the overrides are read from sys_argv, as from sys.argv)
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                    lock_config=True, sys_argv=argv)
    parse_flags(argv, flag_values)
    return flag_values.config


def test_the_command_line_sets_every_stage_s_steps_or_one_stage_s_fields(tmp_path, capsys):
    """--config.num_train_steps=N: every stage N steps; --config.stages.K.FIELD=VALUE: stage K's
    field (K as in WORKDIR/stageK), typed as the config's field, set or not in the file; other
    fields: the config's, so every stage's that does not set its own."""
    from training import stages
    config = _parse("--config.num_train_steps=20", "--config.stages.2.steps=5",
                    "--config.stages.2.optim.learning_rate=3e-4", "--config.stages.1.seq_len=512",
                    "--config.stages.2.data.mask_documents=false", "--config.seed=7")
    from run_config import build
    planned = stages.plan(build(config), str(tmp_path))
    assert [c.num_train_steps for _, c in planned] == [20, 5]
    assert [c.seq_len for _, c in planned] == [512, 8192]  # stage 2 sets its own
    assert [c.optim.learning_rate for _, c in planned] == [config.optim.learning_rate, 3e-4]
    assert [c.data.mask_documents for _, c in planned] == [config.data.mask_documents, False]
    assert [c.seed for _, c in planned] == [7, 8]
    assert planned[1][0].explicit == ("seq_len", "global_batch_size", "model.rope_theta",
                                      "parallel.tile", "optim.learning_rate",
                                      "optim.warmup_steps", "eval_every_steps",
                                      "checkpoint_every_steps", "data.mask_documents")
    for args, expected in [
            (("--config.stages.3.steps=5",), "the config has stages 1 to 2"),
            (("--config.stages.1.seq_lenn=5",), "'seq_lenn' is not a config field"),
            (("--config.stages.1.steps=five",), "give a value of the field's type (int)")]:
        with pytest.raises(SystemExit) as exit_:
            _parse(*args)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and expected in line, line


def test_a_checkpoint_from_before_parallel_tile_reads_with_its_tiles():
    """A run saved with model.tile_q/tile_k (before they moved into parallel.tile) samples and
    resumes with the tiles it ran with; 0 x 0 stays the kernel's default. A layout left 'auto'
    reads as the one the run resolved."""
    from configs import tiny
    from training.resume import saved_config
    for old, now in (((64, 32), (64, 32)), ((0, 0), (0, 0))):
        saved = tiny.get_config().to_dict()
        del saved["parallel"]["tile"]
        saved["model"].update(tile_q=old[0], tile_k=old[1])
        config = saved_config({"config": saved, "memory_switches": {}})
        assert config.parallel.tiles == now
        assert not hasattr(config.model, "tile_q") and not hasattr(config.model, "tile_k")
    saved = tiny.get_config().to_dict()
    saved["parallel"]["layout"] = "auto"  # a reader lays out its prompts as the run did
    config = saved_config({"config": saved, "attention": {"layout": "zigzag"}})
    assert config.parallel.layout == "zigzag"
