"""config.init_from: a run starts from a Hugging Face checkpoint or from another run's weights.

The reference for the first step is the loaded model itself on one device (model.hf, checked
against transformers in test_hf.py), on step 0's rows in their natural order: every layout
sharded over 4 devices must log exactly that loss at step 1 (a Gemma 3 model of local and global
layers; the Llama path is train.py's below and tests/model/test_hf.py's).
"""

import json
import os
import shutil

import numpy as np
import pytest
from flax import nnx

import data
from configs import tiny
from model import hf
from tests.support.hf_checkpoints import make_model_dir, write_text
from tests.support.train_runs import losses, read_metrics, run_train
from training import ConfigError, train_and_evaluate
from training import step as step_lib

SEQ_LEN, BATCH = 64, 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_text(str(tmp_path_factory.mktemp("text") / "corpus.txt"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("hf")
    return make_model_dir(str(root / "model"), corpus), corpus, str(root / "cache")


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, corpus):
    """Gemma 3 (text): a sliding layer (window 16, a device's block here) and a global one,
    q/k norms, GeGLU, sandwich norms: saved by transformers (tests/fixtures/hf)."""
    root = tmp_path_factory.mktemp("gemma3")
    return (make_model_dir(str(root / "model"), corpus, case="gemma3_local_global"), corpus,
            str(root / "cache"))


def run_config(model_dir, layout="zigzag", **changes):
    path, corpus, cache = model_dir
    config = tiny.get_config()
    config.init_from = f"hf:{path}"
    config.data.source, config.data.cache_dir = corpus, cache
    config.seq_len, config.global_batch_size = SEQ_LEN, BATCH
    config.num_train_steps, config.log_every_steps, config.eval_batches = 1, 1, 1
    config.mesh.data, config.mesh.seq = 2, 4  # the 8 devices of tests/conftest.py
    config.parallel.layout, config.tracker = layout, "jsonl"
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    return config


def single_device_loss(model_dir, batch: int = BATCH) -> float:
    """Step 0's rows in natural order through hf.load's model on one device."""
    path, corpus, cache_dir = model_dir
    tokenizer = data.load_tokenizer(os.path.join(path, "tokenizer.json"))
    cache = data.build_token_cache(tokenizer, corpus, cache_dir, eval_fraction=0.005)
    spec = data.BatchSpec(seq_len=SEQ_LEN, global_batch=batch, seed=0, layout="ring",
                          num_seq_shards=1, mask_documents=True, reset_positions=True,
                          eos_id=tokenizer.eos_id)
    batch = data.batch_rows(cache.train, spec, 0, np.arange(batch))
    graphdef, params = nnx.split(hf.load(path, param_dtype="float32"), nnx.Param)
    total, weight = step_lib.token_loss_sums(graphdef, params, batch, True)
    return float(total / weight)


@pytest.fixture(scope="module")
def gemma3_reference(gemma3_dir) -> float:
    return single_device_loss(gemma3_dir)


@pytest.mark.sweeps
@pytest.mark.parametrize("layout", ["ring", "striped", "zigzag", "balanced"])
def test_first_step_loss_is_the_loaded_models(layout, gemma3_dir, gemma3_reference, tmp_path):
    reference = gemma3_reference
    train_and_evaluate(run_config(gemma3_dir, layout), str(tmp_path / layout))
    first = losses(read_metrics(tmp_path / layout))[1]
    assert abs(first - reference) < 1e-5 * abs(reference), (layout, first, reference)


@pytest.mark.sweeps
def test_gpt_oss_with_its_experts_over_the_sequence_devices(corpus, tmp_path):
    """GPT-OSS saved by transformers (4 experts with biases, clamped SwiGLU, sinks, q/k/v/o
    biases, alternating windows), its experts in MXFP4 as the published checkpoints keep them:
    the experts come from config.json, split over the 4 devices of the sequence (mesh.expert,
    a 2 x 4 mesh), and the first step's loss is the loaded model's on one device."""
    gpt_oss = (make_model_dir(str(tmp_path / "model"), corpus, case="gpt_oss_mxfp4"), corpus,
               str(tmp_path / "cache"))
    train_and_evaluate(run_config(gpt_oss, "striped", **{"mesh.expert": 4}),
                       str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    first, reference = losses(rows)[1], single_device_loss(gpt_oss)
    assert abs(first - reference) < 1e-5 * abs(reference), (first, reference)
    assert "moe/share_max" in next(r for r in rows if r["step"] == 1)
    evaluated = next(r for r in rows if "eval/loss" in r)  # each expert's share, per layer
    shares = evaluated["moe/layer1/shares"]
    assert len(shares) == 4 and abs(sum(shares) - 1) < 1e-6
    assert max(shares) == evaluated["moe/layer1/share_max"]


@pytest.mark.sweeps
def test_deepseek_v3_passing_latents_over_the_sequence_devices(corpus, tmp_path):
    """DeepSeek-V3 saved by transformers (latent attention with a query latent, YaRN with its
    mscale, interleaved RoPE; sigmoid group-limited routing with its correction bias, a shared
    expert, a dense first block) trained on a 2 x 4 mesh whose ring passes latents: the first
    step's loss is the loaded model's on one device."""
    deepseek = (make_model_dir(str(tmp_path / "model"), corpus, case="deepseek_v3_mla"), corpus,
                str(tmp_path / "cache"))
    train_and_evaluate(run_config(deepseek, "zigzag", **{"parallel.mla_exchange": "latent"}),
                       str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    first, reference = losses(rows)[1], single_device_loss(deepseek)
    assert abs(first - reference) < 1e-5 * abs(reference), (first, reference)
    assert next(r for r in rows if r["step"] == 1)["attention/mla_exchange"] == "latent"


# Qwen3-Next's (Gated DeltaNet) hf.load is the same path: tests/model/test_hf.py, test_linear_attention
@pytest.mark.parametrize("case,layout,strategy,mesh", [
    ("granite_hybrid_mamba2", "zigzag", "heads", (4, 2))])  # its 2 groups over 2 devices
@pytest.mark.sweeps
def test_hybrids_over_the_sequence_devices(corpus, tmp_path, case, layout, strategy, mesh):
    """Granite 4.0's hybrid (Mamba2 layers, a softmax layer, experts beside a shared MLP, its
    multipliers) saved by transformers, trained on a 4 x 2 mesh with documents, its Mamba2
    layers split by heads (parallel.linear_strategy 'heads'): the first step's loss is the
    loaded model's on one device."""
    hybrid = (make_model_dir(str(tmp_path / "model"), corpus, case=case), corpus,
              str(tmp_path / "cache"))
    train_and_evaluate(run_config(hybrid, layout, **{"parallel.linear_strategy": strategy,
                                                     "model.scan_layers": False,
                                                     "mesh.data": mesh[0], "mesh.seq": mesh[1],
                                                     "global_batch_size": 2 * mesh[0]}),
                       str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    first, reference = losses(rows)[1], single_device_loss(hybrid, 2 * mesh[0])
    assert abs(first - reference) < 1e-5 * abs(reference), (first, reference)
    assert next(r for r in rows if r["step"] == 1)["attention/linear_strategy"] == strategy


@pytest.mark.programs
def test_train_py_then_a_new_stage_from_the_run(model_dir, tmp_path):
    """train.py from the Hugging Face directory (its tokenizer, config.json's shapes and RoPE),
    then a second stage from that run at twice the length, another mesh and another RoPE base:
    the weights carry over (its first loss is near where stage 1 ended, far below the start)."""
    path, corpus, cache = model_dir
    common = [f"--config.data.source={corpus}", f"--config.data.cache_dir={cache}",
              "--config.global_batch_size=2", "--config.log_every_steps=1",
              "--config.eval_batches=1"]
    stage1 = tmp_path / "stage1"
    result = run_train(stage1, f"--config.init_from=hf:{path}", "--config.seq_len=64",
                       "--config.num_train_steps=4", "--config.optim.warmup_steps=1", *common)
    assert result.returncode == 0, result.stderr[-2000:]
    first = losses(read_metrics(stage1))
    exported_equals_the_run(stage1, tmp_path / "exported")
    stage2 = tmp_path / "stage2"
    result = run_train(stage2, f"--config.init_from=run:{stage1}@4", "--config.seq_len=128",
                       "--config.mesh.data=1", "--config.mesh.seq=4",
                       "--config.model.rope_theta=40000", "--config.num_train_steps=1", *common)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "initial weights from run:" in result.stdout
    second = losses(read_metrics(stage2))[1]
    assert second < first[1] - 0.3, (first, second)


@pytest.mark.parametrize("edit,expected", [
    ({"init_from": "hf:/nonexistent/model"}, "is not a directory"),
    ({"init_from": "hf2:/x"}, "use 'hf:PATH'"),
    ({"init_from": "run:/nonexistent/run"}, "no checkpoints in"),
])
def test_bad_sources_are_refused_before_anything_is_written(edit, expected, model_dir,
                                                              tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=expected) as e:
        train_and_evaluate(run_config(model_dir, **edit), str(workdir))
    assert "\n" not in str(e.value) and not workdir.exists()


@pytest.mark.parametrize("change,expected", [
    ({"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"]},
     "DeepseekV32ForCausalLM .* is not a family model.hf reads"),  # sparse attention
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]},  # no expert counts
     "lacks num_local_experts"),
    ({"intermediate_size": 64}, "has shape"),  # the tensors are 96 wide
])
def test_a_checkpoint_that_is_not_what_it_says_is_refused(change, expected, model_dir,
                                                           tmp_path):
    path = tmp_path / "model"
    shutil.copytree(model_dir[0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=expected) as e:
        train_and_evaluate(run_config(model_dir, init_from=f"hf:{path}"), str(workdir))
    assert "\n" not in str(e.value) and not workdir.exists()


def test_contradictions_and_a_foreign_tokenizer_are_refused(model_dir, tmp_path):
    """(train.py prints a ConfigError in one line and exits 2: tests/project/test_bad_input.py.)"""
    path, corpus, _ = model_dir
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match="model.d_model=64 contradicts hf:"):
        train_and_evaluate(run_config(model_dir, **{"model.d_model": 64}), str(workdir),
                           explicit={"model.d_model"})
    big = make_model_dir(str(tmp_path / "big_vocab"), corpus, vocab_size=200)
    with pytest.raises(ConfigError, match="has 200 pieces but the model") as e:
        train_and_evaluate(run_config(model_dir, init_from=f"hf:{big}"), str(workdir))
    assert "\n" not in str(e.value) and not workdir.exists()


def exported_equals_the_run(workdir, out):
    """scripts/hf/export.py's function: the run's weights and tokenizer as a Hugging Face
    directory that model.hf loads to the same logits (transformers loads it too:
    scripts/hf/check_transformers.py, run with PyTorch installed)."""
    from training.saved_run import export_hf, load_run
    files = export_hf(str(workdir), str(out))
    assert files == ["model.safetensors", "config.json", "tokenizer.json"]
    config, _, graphdef, params, _ = load_run(str(workdir), None, 1)
    tokens = np.random.default_rng(1).integers(0, 120, (1, 128))
    np.testing.assert_allclose(hf.load(str(out))(tokens), nnx.merge(graphdef, params)(tokens),
                               rtol=1e-5, atol=1e-5)  # tiled differently
    saved = hf.read_config(str(out))[0]
    assert saved["rope_scaling"]["rope_type"] == "linear" and config.seq_len == 64


def test_the_command_line_amends_the_checkpoints_rope(model_dir, tmp_path):
    """config.json's RoPE rule (linear, factor 4) with one parameter and the base changed on the
    command line; the shape comes from config.json whatever the config file said; the config
    as read is left as it was (the run's is a copy)."""
    from training import init_from
    given = run_config(model_dir)
    given.model.rope_scaling.factor, given.model.rope_theta = 8.0, 50_000.0
    read = given.to_dict()
    from run_config import build
    config, _ = init_from.resolve(build(given), str(tmp_path),
                                  explicit={"model.rope_scaling.factor", "model.rope_theta"})
    assert given.to_dict() == read and config is not given  # the config as read: unchanged
    assert config.model.rope_scaling.rope_type == "linear"
    assert config.model.rope_scaling.factor == 8.0 and config.model.rope_theta == 50_000.0
    assert (config.model.d_model, config.model.head_dim, config.model.vocab_size) == (48, 12, 128)
    assert config.data.tokenizer_path.endswith("tokenizer.json")
