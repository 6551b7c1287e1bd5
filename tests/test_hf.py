"""model.hf against Hugging Face transformers' own LlamaForCausalLM.

The checkpoints under tests/fixtures/hf were saved by transformers, and logits.npz holds the
logits its PyTorch model computed from them (scripts/make_hf_fixtures.py: every RoPE rule, GQA,
tied and untied, float32 and bfloat16, sharded and single-file, both config.json layouts).
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import parallel
from model import hf
from model.safetensors_dir import SafetensorsDir

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
CASES = ["default_untied_sharded", "linear_tied", "llama3_untied_bf16", "yarn_tied"]


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(os.path.join(FIXTURES, "logits.npz")))


def relative_error(ours, theirs) -> float:
    return float(np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case, reference):
    m = hf.load(os.path.join(FIXTURES, case), param_dtype="float32")
    logits = m(reference["tokens"])
    assert logits.shape == reference[case].shape and logits.dtype == np.float32
    assert relative_error(logits, reference[case]) < 1e-4


def test_loaded_config_follows_config_json():
    m = hf.load(os.path.join(FIXTURES, "llama3_untied_bf16"))  # the older config.json layout
    cfg = m.cfg
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_embeddings) == (4, 2, 12, False)
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == ("llama3", 8.0)
    assert cfg.rope_scaling.original_max_position_embeddings == 64
    assert cfg.param_dtype == "bfloat16"  # the stored dtype, unless asked otherwise
    assert m.embed.embedding[...].dtype == jax.numpy.bfloat16


def test_onto_a_sharded_mesh_with_stacked_layers(reference):
    """Tensor by tensor onto 4 devices' FSDP shards, layers stacked for lax.scan."""
    mesh = parallel.make_mesh(1, 4, devices=jax.devices()[:4])
    m = hf.load(os.path.join(FIXTURES, "yarn_tied"), mesh=mesh, scan_layers=True,
                attention_layout="ring")  # contiguous chunks: the natural order
    q = m.blocks.attention.q.kernel[...]
    assert q.shape == (2, 48, 48) and len(q.addressable_shards) == 4
    assert q.addressable_shards[0].data.shape == (2, 12, 48)
    with jax.set_mesh(mesh):
        assert relative_error(m(reference["tokens"]), reference["yarn_tied"]) < 1e-4


@pytest.mark.parametrize("case", ["default_untied_sharded", "yarn_tied"])
def test_save_writes_what_transformers_writes(case, reference, tmp_path):
    """hf.save: the tensors transformers saved (names, shapes, values), sharded with an index
    past the shard size, a config.json that loads back to the same model and logits."""
    source = os.path.join(FIXTURES, case)
    m = hf.load(source)
    out = str(tmp_path / "saved")
    files = hf.save(m, out, max_shard_bytes=40_000)
    assert "model.safetensors.index.json" in files and len(files) > 3
    ours, theirs = SafetensorsDir(out), SafetensorsDir(source)
    assert ours.names() == theirs.names()
    for name in theirs.names():
        np.testing.assert_array_equal(ours.read(name), theirs.read(name))
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(source, "config.json")) as f:
        original = json.load(f)
    for key in ("architectures", "model_type", "hidden_size", "num_key_value_heads", "head_dim",
                "tie_word_embeddings", "intermediate_size"):
        assert config[key] == original[key], key
    # what transformers wrote, and the rule's optional parameters at their defaults besides
    assert original["rope_parameters"].items() <= config["rope_parameters"].items()
    assert relative_error(hf.load(out)(reference["tokens"]), reference[case]) < 1e-4


def test_save_in_bfloat16_replaces_the_directory(tmp_path):
    m = hf.load(os.path.join(FIXTURES, "linear_tied"), scan_layers=True)  # layers stacked
    out = tmp_path / "saved"
    out.mkdir()
    (out / "stale.safetensors").write_bytes(b"old")
    assert hf.save(m, str(out), dtype="bfloat16") == ["model.safetensors", "config.json"]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    tensors = load_file(str(out / "model.safetensors"))
    assert all(a.dtype == np.dtype("bfloat16") for a in tensors.values())
    assert "lm_head.weight" not in tensors  # tied
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    original = SafetensorsDir(os.path.join(FIXTURES, "linear_tied"))
    assert sorted(tensors) == original.names()
    np.testing.assert_array_equal(  # layer 1's query projection, unstacked and transposed back
        tensors["model.layers.1.self_attn.q_proj.weight"],
        original.read("model.layers.1.self_attn.q_proj.weight").astype("bfloat16"))


def _copy(tmp_path, case="linear_tied"):
    target = tmp_path / case
    shutil.copytree(os.path.join(FIXTURES, case), target)
    return target


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("edit,expected", [
    (lambda p: shutil.rmtree(p), "is not a directory"),
    (lambda p: (p / "config.json").unlink(), "cannot read"),
    (lambda p: _edit_config(p, model_type="gpt2", architectures=["GPT2LMHeadModel"]),
     "is not a Llama checkpoint"),
    (lambda p: _edit_config(p, attention_bias=True), "attention_bias=True is not supported"),
    (lambda p: _edit_config(p, hidden_size=64), "has shape"),
    (lambda p: _edit_config(p, num_hidden_layers=3), "tensor model.layers.2"),
    (lambda p: _edit_config(p, tie_word_embeddings=False), "lm_head.weight is missing"),
    (lambda p: (p / "model.safetensors").unlink(), "neither model.safetensors"),
    (lambda p: _edit_config(p, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
     "rope"),
])
def test_bad_checkpoints_are_one_line(edit, expected, tmp_path):
    path = _copy(tmp_path)
    edit(path)
    with pytest.raises(hf.HFError, match=expected) as e:
        hf.load(str(path))
    assert "\n" not in str(e.value)


def test_a_tensor_the_model_has_no_place_for(tmp_path):
    """A bias (Qwen2-style attention) must not be dropped silently."""
    from safetensors.numpy import save_file
    path = _copy(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(48, np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(hf.HFError, match="q_proj.bias has no place"):
        hf.load(str(path))
