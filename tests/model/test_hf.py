"""model.hf against Hugging Face transformers' own models, every family of model/hf/families/
(DeepSeek-V3 and V2-Lite: latent attention, YaRN with DeepSeek's mscale, sigmoid group-limited
routing with a correction bias, shared experts, a dense first layer; GLM-4.5: partial rotary,
q/k/v biases; Qwen2-MoE: a gated shared expert; Qwen2: q/k/v biases, the hub's config.json).

The checkpoints under tests/fixtures/hf were saved by transformers, and logits.npz holds the
logits its PyTorch model computed from them (scripts/hf/make_fixtures.py: every RoPE rule, GQA,
tied and untied, float32 and bfloat16, sharded and single-file, both config.json layouts).
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

import parallel
from model import hf
from model.hf.safetensors_dir import RangeFile, SafetensorsDir
from model.transformer import scan_period
from tests.tiers import split
from tests.support.model_cases import attention
from tests.support import FIXTURES

FIXTURES = os.path.join(FIXTURES, "hf")
CASES = ["default_untied_sharded", "linear_tied", "llama3_untied_bf16", "yarn_tied",
         "mistral_window", "qwen3_window", "gemma2_caps", "gemma3_local_global",
         "qwen3_moe_experts", "mixtral_experts", "gpt_oss_experts",
         "gpt_oss_mxfp4",  # experts in MXFP4, as GPT-OSS's published files keep them
         "deepseek_v3_mla", "deepseek_v2_lite_mla", "glm4_moe_shared", "qwen2_moe_shared",
         "qwen3_next_hybrid",  # Gated DeltaNet layers and a gated softmax one
         "granite_hybrid_mamba2",  # Mamba2 layers, a softmax one, experts, Granite's multipliers
         "qwen2_tied_window",  # q/k/v biases, tied, its layer 1 sliding
         "qwen2_hub_layout"]  # config.json as the hub's Qwen2.5 files: no layer_types


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(os.path.join(FIXTURES, "logits.npz")))


def relative_error(ours, theirs) -> float:
    return float(np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max())


# Loading and saving in the fast tier: every family but those with experts or recurrent layers at
# a size that takes seconds each (deepseek_v3_mla and qwen3_moe_experts stand for them); the
# sweeps tier: those.
WIDE = ("mixtral_experts", "gpt_oss_experts", "gpt_oss_mxfp4", "deepseek_v2_lite_mla",
        "glm4_moe_shared", "qwen2_moe_shared", "qwen3_next_hybrid", "granite_hybrid_mamba2")


def families(cases):
    return split(cases, fast=[i for i, case in enumerate(cases) if case not in WIDE])


@pytest.mark.parametrize("case", families(CASES))
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
                choice=attention("ring", tile=0))  # contiguous chunks: the natural order
    q = m.blocks.attention.q.kernel[...]
    assert q.shape == (2, 48, 48) and len(q.addressable_shards) == 4
    assert q.addressable_shards[0].data.shape == (2, 12, 48)
    with jax.set_mesh(mesh):
        assert relative_error(m(reference["tokens"]), reference["yarn_tied"]) < 1e-4


def test_a_hybrid_stacked_a_period_at_a_time(reference, tmp_path):
    """Qwen3-Next's 3 : 1 read with scan_layers: one stack per position of the period (3
    Gated DeltaNet stacks and a softmax one, each [1, ...]), the same logits; hf.save writes
    the same tensors back."""
    source = os.path.join(FIXTURES, "qwen3_next_hybrid")
    m = hf.load(source, scan_layers=True, param_dtype="float32")
    assert scan_period(m.cfg) == 4 and m.blocks[3].attention.q.kernel[...].shape[0] == 1
    assert relative_error(m(reference["tokens"]), reference["qwen3_next_hybrid"]) < 1e-4
    hf.save(m, str(tmp_path / "saved"))
    ours, theirs = SafetensorsDir(str(tmp_path / "saved")), SafetensorsDir(source)
    assert ours.names() == theirs.names()
    for name in theirs.names():  # norms stored as scale - 1: one unit in the last place of 1
        np.testing.assert_allclose(ours.read(name), theirs.read(name), rtol=0, atol=2.0 ** -23)


def test_deepseek_stacked_after_its_dense_first_block(reference, tmp_path):
    """DeepSeek-V3 read with scan_layers: its dense block 0 alone (first_blocks), the sparse
    blocks 1.. stacked; the same logits, and hf.save writes the same tensors back."""
    source = os.path.join(FIXTURES, "deepseek_v3_mla")
    m = hf.load(source, scan_layers=True)
    assert m.cfg.first_stacked == 1 and m.blocks.attention.kv_b.kernel[...].shape[0] == 1
    assert relative_error(m(reference["tokens"]), reference["deepseek_v3_mla"]) < 1e-4
    hf.save(m, str(tmp_path / "saved"))
    ours, theirs = SafetensorsDir(str(tmp_path / "saved")), SafetensorsDir(source)
    assert ours.names() == theirs.names()
    for name in theirs.names():
        np.testing.assert_array_equal(ours.read(name), theirs.read(name))


# Saved in the fast tier: the families without experts, one with experts and one with latents.
@pytest.mark.parametrize("case", split([
    "default_untied_sharded", "yarn_tied", "qwen3_window", "gemma2_caps", "gemma3_local_global",
    "qwen3_moe_experts", "mixtral_experts", "gpt_oss_experts", "deepseek_v3_mla",
    "deepseek_v2_lite_mla", "glm4_moe_shared", "qwen2_moe_shared", "qwen3_next_hybrid",
    "granite_hybrid_mamba2", "qwen2_tied_window"], fast=[0, 1, 2, 3, 4, 5, 8, 14]))
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
        # Gemma's norms are read as 1 + w and written as (1 + w) - 1: float32 keeps w to within
        # one unit in the last place of 1
        offset = "gemma" in case or "qwen3_next" in case  # Qwen3-Next's norms: the same rule
        atol = 2.0 ** -23 if offset and name.endswith("norm.weight") else 0.0
        np.testing.assert_allclose(ours.read(name), theirs.read(name), rtol=0, atol=atol)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(source, "config.json")) as f:
        original = json.load(f)
    for key in ("architectures", "model_type", "hidden_size", "num_key_value_heads", "head_dim",
                "tie_word_embeddings", "intermediate_size", "layer_types", "sliding_window",
                "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                "mlp_only_layers", "swiglu_limit", "attention_bias", "n_routed_experts",
                "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "rope_interleave", "n_group", "topk_group",
                "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace",
                "topk_method", "qkv_bias", "shared_expert_intermediate_size", "use_qk_norm",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_n_heads",
                "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv",
                "mamba_conv_bias", "mamba_expand", "shared_intermediate_size",
                "attention_multiplier", "embedding_multiplier", "residual_multiplier",
                "logits_scaling", "position_embedding_type"):
        if key == "sliding_window":  # 0 or None: no window
            assert (config.get(key) or None) == (original.get(key) or None)
        elif key == "layer_types" and case.startswith("granite"):
            # the published files' names, which transformers 4 needs and 5 reads as its own
            assert config[key] == [LEGACY[t] for t in original[key]]
        else:
            assert config.get(key) == original.get(key), key
    # the expert count under either of its names (transformers 5 writes num_local_experts)
    count = lambda c: c.get("num_experts") or c.get("num_local_experts")  # noqa: E731
    assert count(config) == count(original)
    # what transformers wrote, and the rule's optional parameters at their defaults besides
    for rule, written in ([(original["rope_parameters"], config["rope_parameters"])]
                          if "rope_type" in original["rope_parameters"] else
                          [(original["rope_parameters"][t], config["rope_parameters"][t])
                           for t in original["rope_parameters"]]):  # Gemma 3: per layer type
        assert rule.items() <= written.items()
    if "gemma3" in case:  # transformers 4's keys beside 5's rope_parameters, the same rules
        assert config["rope_theta"] == original["rope_parameters"]["full_attention"]["rope_theta"]
        assert config["rope_local_base_freq"] == original["rope_parameters"][
            "sliding_attention"]["rope_theta"]
        assert config["rope_scaling"].items() <= original["rope_parameters"][
            "full_attention"].items()
    elif "rope_type" in original["rope_parameters"]:
        assert config["rope_theta"] == original["rope_parameters"]["rope_theta"]
    assert relative_error(hf.load(out, param_dtype="float32")(reference["tokens"]),
                          reference[case]) < 1e-4


# transformers 5's layer names -> the older ones (the hub's Granite files, transformers 4)
LEGACY = {"linear_attention": "mamba", "full_attention": "attention"}


def test_a_file_read_by_byte_ranges_gives_what_safetensors_reads():
    """RangeFile (how a bucket's files are read, a range a slice) against safetensors' own
    reader, on files transformers saved: every tensor whole, rows, columns, strided rows;
    float32 and bfloat16, one file and shards."""
    for case in ("default_untied_sharded", "llama3_untied_bf16"):
        folder = os.path.join(FIXTURES, case)
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            ours = RangeFile(os.path.join(folder, file))
            theirs = safe_open(os.path.join(folder, file), "np")
            assert sorted(ours.keys()) == sorted(theirs.keys())
            for name in theirs.keys():
                a, b = ours.get_slice(name), theirs.get_slice(name)
                assert (a.get_shape(), a.get_dtype()) == (b.get_shape(), b.get_dtype())
                rank = len(b.get_shape())
                for index in [(slice(None),) * rank, (slice(1, 3),), (slice(5, 5),),
                              (slice(0, 9, 2),), (slice(None), slice(2, 5))[:rank]]:
                    np.testing.assert_array_equal(a[index], b[index])


def test_save_in_bfloat16_replaces_the_directory(tmp_path):
    m = hf.load(os.path.join(FIXTURES, "linear_tied"), scan_layers=True)  # layers stacked
    out = tmp_path / "saved"
    out.mkdir()
    (out / "stale.safetensors").write_bytes(b"old")
    assert hf.save(m, str(out), dtype="bfloat16") == ["model.safetensors", "config.json"]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    # The weights readable by whoever may read config.json (safetensors alone writes 0600).
    modes = {name: os.stat(out / name).st_mode & 0o777 for name in os.listdir(out)}
    assert modes["model.safetensors"] == modes["config.json"] and modes["config.json"] & 0o044
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
     "is not a family model.hf reads"),
    (lambda p: _edit_config(p, attention_bias=True), "attention_bias=True is not supported"),
    (lambda p: _edit_config(p, hidden_size=64), "has shape"),
    (lambda p: _edit_config(p, num_hidden_layers=3), "tensor model.layers.2"),
    (lambda p: _edit_config(p, tie_word_embeddings=False), "lm_head.weight is missing"),
    (lambda p: (p / "model.safetensors").unlink(), "neither model.safetensors"),
    (lambda p: _edit_config(p, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
     "rope"),
    (lambda p: _edit_config(p, quantization_config={"quant_method": "gptq", "bits": 4}),
     "quantized by 'gptq' are not read"),
])
def test_bad_checkpoints_are_one_line(edit, expected, tmp_path):
    path = _copy(tmp_path)
    edit(path)
    with pytest.raises(hf.HFError, match=expected) as e:
        hf.load(str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("case,change,expected", [
    ("qwen3_window", dict(attention_bias=True), "attention_bias=True is not supported"),
    ("gemma3_local_global", dict(use_bidirectional_attention=True),
     "use_bidirectional_attention=True is not supported"),
    ("gemma2_caps", dict(hidden_activation="relu"), "hidden_activation='relu' is not supported"),
    ("mistral_window", dict(model_type="mixtral", architectures=["MixtralForCausalLM"]),
     "a MixtralForCausalLM config.json lacks num_local_experts"),
    ("qwen3_moe_experts", dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"]),
     "a Qwen2MoeForCausalLM config.json lacks shared_expert_intermediate_size"),
    ("deepseek_v3_mla", dict(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"],
                             index_topk=2048),  # DeepSeek-V3.2's sparse attention
     "DeepseekV32ForCausalLM .* is not a family model.hf reads"),
    ("deepseek_v2_lite_mla", dict(topk_method="noaux_tc"), "topk_method='noaux_tc' is not"),
    ("deepseek_v3_mla", dict(moe_layer_freq=2), "moe_layer_freq=2 is not supported"),
    ("qwen3_next_hybrid", dict(layer_types=["linear_attention", "sliding_attention"] * 2),
     "layer_types 'sliding_attention' is not a Qwen3-Next layer"),
    ("gemma3_local_global", dict(rope_parameters={
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     "a scaled RoPE on sliding layers"),
])
def test_options_a_family_here_does_not_have_are_one_line(case, change, expected, tmp_path):
    path = _copy(tmp_path, case)
    _edit_config(path, **change)
    with pytest.raises(hf.HFError, match=expected) as e:
        hf.load(str(path))
    assert "\n" not in str(e.value)


def test_a_model_no_family_holds_is_not_saved(tmp_path):
    import model
    cfg = model.ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=8, mlp_dim=64, attention_sinks=True)
    m = model.create(cfg, parallel.make_mesh(1, 1, devices=jax.devices()[:1]), seed=0)
    with pytest.raises(hf.HFError, match="attention sinks"):
        hf.save(m, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_a_multi_token_prediction_head_is_refused_in_one_line(tmp_path):
    """DeepSeek-V3's published files keep its MTP module as layer 61 of 61 (0-based): not a
    tensor to drop silently, nor one to load into nothing."""
    from safetensors.numpy import save_file
    path = _copy(tmp_path, "deepseek_v3_mla")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.2.eh_proj.weight"] = np.zeros((48, 96), np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(hf.HFError, match="layers.2.eh_proj.weight is a multi-token prediction"
                                         ) as e:
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
