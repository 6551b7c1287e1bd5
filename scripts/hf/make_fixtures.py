"""Writes tests/fixtures/hf/: tiny checkpoints saved by Hugging Face `transformers` (Llama under
every RoPE rule; Mistral, Qwen3, Gemma 2 and Gemma 3 with sliding windows shorter than the
reference; Qwen3-MoE, Mixtral and GPT-OSS with 4 experts, 2 a token), and the logits its own PyTorch
models compute from them, the reference tests/model/test_hf.py checks model.hf against (make test
reads the files; it needs no PyTorch).

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers numpy
    /tmp/ref/bin/python scripts/hf/make_fixtures.py        # then commit tests/fixtures/hf
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --mxfp4-only   # add (or redo) that case
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --latent-only  # add (or redo) LATENT_CASES
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --hybrid-only  # add (or redo) HYBRID_CASES
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --qwen2-only   # add (or redo) QWEN2_CASES
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --mla-attention  # one MLA layer alone
    /tmp/ref/bin/python scripts/hf/make_fixtures.py --gated-deltanet  # one Gated DeltaNet layer

gpt_oss_mxfp4 keeps its experts in MXFP4, as GPT-OSS's published checkpoints do: quantized
here (each block of 32 weights scaled by the power of two that brings its largest under 6, every
weight rounded to the nearest e2m1 value), its reference logits from transformers' own
dequantization (`Mxfp4Config(dequantize=True)`). Written with torch 2.13.0 and transformers
5.24.0, as LATENT_CASES (DeepSeek-V3 and V2-Lite with latent attention, GLM-4.5's and Qwen2-MoE's
shared experts) and HYBRID_CASES (Qwen3-Next's Gated DeltaNet and Granite 4.0's Mamba2 hybrids:
issue 63's families, which model.hf does not read yet); the other cases:
torch 2.14.1 and transformers 5.24.0. Each case is a 2-layer model with grouped
query heads (4 query, 2 key/value heads) under one RoPE rule, tied or untied, float32 or
bfloat16, one file or sharded with an index; one case keeps the older config.json layout
(`rope_theta` and `rope_scaling` at the top level, as Llama 3.1's files on the hub have it).
Weights are drawn wide (norm scales included, which transformers starts at 1) so a swapped or
transposed tensor shows in the logits. The reference logits are float32, over positions past the
RoPE rules' original context.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "hf")
SIZES = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
             max_position_embeddings=256)
THETA, TOKENS = 10_000.0, 96  # the reference runs 96 tokens; the scaled rules' context is 64
CASES = {  # name: (rope_parameters without theta, tied, dtype, shard size, old config layout)
    "default_untied_sharded": ({"rope_type": "default"}, False, torch.float32, "60KB", False),
    "linear_tied": ({"rope_type": "linear", "factor": 4.0}, True, torch.float32, None, False),
    "llama3_untied_bf16": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                           False, torch.bfloat16, None, True),
    "yarn_tied": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                  True, torch.float32, "60KB", False),
}


# The other families, each with windows shorter than the reference's 96 tokens and the options
# that set it apart: (transformers classes, config keywords, tied, dtype).
FAMILY_CASES = {
    "mistral_window": ("MistralConfig", "MistralForCausalLM",
                       dict(sliding_window=16, rope_parameters={"rope_type": "default",
                                                                "rope_theta": THETA}),
                       False, torch.float32),
    "qwen3_window": ("Qwen3Config", "Qwen3ForCausalLM",  # layer 0 full, layer 1 sliding
                     dict(use_sliding_window=True, sliding_window=16, max_window_layers=1,
                          rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                     True, torch.float32),
    "gemma2_caps": ("Gemma2Config", "Gemma2ForCausalLM",  # sliding, full; caps that bite
                    dict(sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                         final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
                         rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                    True, torch.bfloat16),
    "gemma3_local_global": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                            dict(sliding_window=16, query_pre_attn_scalar=12,
                                 layer_types=["sliding_attention", "full_attention"],
                                 hidden_activation="gelu_pytorch_tanh",
                                 rope_parameters={
                                     "sliding_attention": {"rope_type": "default",
                                                           "rope_theta": THETA},
                                     "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 1_000_000.0}}),
                            False, torch.float32),
    # Mixtures of experts, 4 experts of width 32, 2 a token: Qwen3-MoE with a dense first layer
    # and the top-2 weights not renormalised; Mixtral (renormalised) with a window.
    "qwen3_moe_experts": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                          dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               norm_topk_prob=False, mlp_only_layers=[0],
                               rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                          False, torch.float32),
    "mixtral_experts": ("MixtralConfig", "MixtralForCausalLM",
                        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                             sliding_window=16,
                             rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                        False, torch.float32),
    # GPT-OSS: sliding and full layers, sinks, q/k/v/o and expert biases (drawn, not zero),
    # a SwiGLU limit low enough to clamp, YaRN without truncation.
    "gpt_oss_experts": ("GptOssConfig", "GptOssForCausalLM",
                        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                             sliding_window=16, swiglu_limit=1.5,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "truncate": False,
                                              "original_max_position_embeddings": 64,
                                              "rope_theta": THETA}),
                        False, torch.float32),
}


# Issue 62's families (latent attention, shared experts, sigmoid routing with a correction bias,
# group-limited routing, a dense first layer), added by --latent-only: MLA of a 16-wide latent,
# queries through a 24-wide one (DeepSeek-V3) or not (V2-Lite), heads of 8 + 4 (RoPE) for
# queries and keys and 8 for values, 8 routed experts of width 16 and one shared.
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=4,
           num_key_value_heads=4, moe_intermediate_size=16, n_shared_experts=1,
           first_k_dense_replace=1)
LATENT_CASES = {
    "deepseek_v3_mla": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                        dict(**MLA, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2,
                             n_group=2, topk_group=1, routed_scaling_factor=2.5,
                             norm_topk_prob=True, rope_interleave=True,
                             rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "mscale": 1.0, "mscale_all_dim": 1.0,
                                              "rope_theta": THETA}),
                        False, torch.float32),
    "deepseek_v2_lite_mla": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                             dict(**MLA, q_lora_rank=None, n_routed_experts=8,
                                  num_experts_per_tok=2, n_group=1, topk_group=1,
                                  topk_method="greedy", routed_scaling_factor=1.0,
                                  norm_topk_prob=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                             False, torch.float32),
    "glm4_moe_shared": ("Glm4MoeConfig", "Glm4MoeForCausalLM",  # partial rotary, q/k/v biases
                        dict(moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
                             num_experts_per_tok=2, n_group=1, topk_group=1,
                             first_k_dense_replace=1, routed_scaling_factor=2.5,
                             norm_topk_prob=True, attention_bias=True,
                             rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                              "partial_rotary_factor": 0.5}),
                        False, torch.float32),
    "qwen2_moe_shared": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",  # sigmoid-gated shared expert
                         dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=32, norm_topk_prob=False,
                              mlp_only_layers=[0],
                              rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                         False, torch.float32),
}


# Issue 63's hybrids, added by --hybrid-only: Qwen3-Next (three Gated DeltaNet layers of 2 key
# heads of 8 for 4 value heads of 8, a causal convolution of 4, then a gated softmax layer with
# partial rotary (a quarter of heads of 16, as Qwen3-Next's 64 of 256); experts with a sigmoid-gated shared one) and Granite 4.0's GraniteMoeHybrid
# (Mamba2 layers of 6 heads of 16 (2 x d_model), state 16, 2 groups, chunks of 16 over the 96
# tokens, an attention layer; experts with a shared MLP; Granite's multipliers).
HYBRID_CASES = {
    "qwen3_next_hybrid": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                          dict(num_hidden_layers=4, layer_types=["linear_attention"] * 3
                               + ["full_attention"], head_dim=16, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8, linear_conv_kernel_dim=4,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=32, norm_topk_prob=True,
                               rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                                "partial_rotary_factor": 0.25}),
                          False, torch.float32),
    "granite_hybrid_mamba2": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                              dict(num_hidden_layers=4, layer_types=["mamba", "mamba",
                                                                     "attention", "mamba"],
                                   mamba_n_heads=6, mamba_d_head=16, mamba_d_state=16,
                                   mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
                                   mamba_chunk_size=16, num_local_experts=4,
                                   num_experts_per_tok=2, shared_intermediate_size=32,
                                   intermediate_size=16, embedding_multiplier=2.0,
                                   logits_scaling=4.0, residual_multiplier=0.5,
                                   attention_multiplier=0.3, position_embedding_type="rope",
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": THETA}),
                              False, torch.float32),
}


def hub_qwen2_layout(path: str) -> None:
    """config.json as the hub's Qwen2.5 files have it (transformers 4's layout): the RoPE base on
    top, no layer_types (the sliding layers follow from max_window_layers)."""
    old_layout(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    del config["layer_types"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


# Qwen2 and Qwen2.5 dense (issue 71), added by --qwen2-only: q/k/v biases (drawn, not zero),
# Qwen2.5's RoPE base of 1e6; tied with its layer 1 sliding (layer 0 full: max_window_layers),
# and untied in bfloat16 in the hub's layout of config.json.
QWEN2_CASES = {
    "qwen2_tied_window": ("Qwen2Config", "Qwen2ForCausalLM",
                          dict(use_sliding_window=True, sliding_window=16, max_window_layers=1,
                               rope_parameters={"rope_type": "default",
                                                "rope_theta": 1_000_000.0}),
                          True, torch.float32),
    "qwen2_hub_layout": ("Qwen2Config", "Qwen2ForCausalLM",
                         dict(use_sliding_window=False, sliding_window=131072,
                              max_window_layers=1,
                              rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
                         False, torch.bfloat16, hub_qwen2_layout),
}


def old_layout(path: str) -> None:
    """Rewrites config.json as transformers 4 wrote it: rope_theta and rope_scaling on top."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., in, out] float32 -> (blocks uint8 [..., out, in / 32, 16], scales uint8 [..., out,
    in / 32]): the layout of GPT-OSS's published experts (the low nibble first)."""
    rows = np.swapaxes(w, -1, -2)  # [..., out, in]
    groups = rows.reshape(*rows.shape[:-1], -1, 32)
    largest = np.maximum(np.abs(groups).max(axis=-1), 1e-30)
    exponent = np.ceil(np.log2(largest / 6.0)).astype(np.int32)  # largest / 2^e <= 6
    scaled = groups / np.ldexp(1.0, exponent)[..., None]
    codes = np.abs(scaled[..., None] - E2M1[:8]).argmin(axis=-1) + 8 * (scaled < 0)
    codes = codes.astype(np.uint8).reshape(*groups.shape[:-1], 16, 2)
    return codes[..., 0] | (codes[..., 1] << 4), (exponent + 127).astype(np.uint8)


def mxfp4_case(tokens: np.ndarray, seed: int) -> np.ndarray:
    """gpt_oss_mxfp4 (module docstring): written, then run by transformers; its logits."""
    from safetensors.numpy import load_file, save_file
    torch.manual_seed(seed)
    _, model_class, options, _, _ = FAMILY_CASES["gpt_oss_experts"]
    config = transformers.GptOssConfig(**{**SIZES, **options, "hidden_size": 64},
                                       tie_word_embeddings=False, initializer_range=0.2)
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(0.5 + 0.3 * torch.randn_like(p))
            elif pname.endswith(("bias", "sinks")):
                p.copy_(0.3 * torch.randn_like(p))
    path = os.path.join(OUT, "gpt_oss_mxfp4")
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    os.remove(os.path.join(path, "generation_config.json"))
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(tensors.pop(name))
    save_file(tensors, file, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    reloaded = transformers.GptOssForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager",
        quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        out = reloaded(torch.from_numpy(tokens)).logits
    print("gpt_oss_mxfp4", sorted(os.listdir(path)), float(out.abs().mean()))
    return out.numpy().astype(np.float32)


def family_case(name: str, case: tuple, tokens: np.ndarray, seed: int) -> np.ndarray:
    """One of FAMILY_CASES or LATENT_CASES written to OUT/name and run by transformers (eager
    attention, float32); its logits."""
    config_class, model_class, options, tied, dtype, *rewrite = case
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**SIZES, **options},
                                                 tie_word_embeddings=tied, initializer_range=0.2)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(0.5 + 0.3 * torch.randn_like(p))  # Gemma adds 1, the others not
            elif pname.endswith(("bias", "sinks")):  # GPT-OSS's, DeepSeek's routing bias...
                p.copy_(0.3 * torch.randn_like(p))  # ...which start at zero
            if pname.endswith("linear_attn.A_log"):
                # Gated DeltaNet decays of exp(A) = 0.5 .. 2 a token, not the init's up to 16: a
                # state forgotten within a token reads almost nothing, and the gated RMSNorm
                # then scales float32 rounding up (logits 1e-4 off per 1e-7 change in a weight)
                p.copy_(torch.empty_like(p).uniform_(0.5, 2.0).log())
        for bname, b in model.named_buffers():  # DeepSeek-V3's correction bias is a buffer
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn_like(b))
    model = model.to(dtype)
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    os.remove(os.path.join(path, "generation_config.json"))
    for change in rewrite:  # config.json as other writers lay it out, read back so
        change(path)
    reloaded = getattr(transformers, model_class).from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = reloaded(torch.from_numpy(tokens)).logits
    print(name, sorted(os.listdir(path)), float(out.abs().mean()))
    return out.numpy().astype(np.float32)


# One latent-attention layer alone (transformers' DeepseekV3Attention, eager, a causal mask),
# for model/mixers/latent.py: DeepSeek-V3's shape (queries through a latent, YaRN with its softmax
# mscale, interleaved RoPE), V2-Lite's (no query latent, plain RoPE, interleaved) and one with
# the halves convention (rope_interleave=False). Positions 70..93, past YaRN's original 64.
MLA_ATTENTION = {
    "v3": dict(q_lora_rank=24, rope_interleave=True, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "rope_theta": THETA}),
    "v2_lite": dict(q_lora_rank=None, rope_interleave=True,
                    rope_parameters={"rope_type": "default", "rope_theta": THETA}),
    "halves": dict(q_lora_rank=24, rope_interleave=False,
                   rope_parameters={"rope_type": "default", "rope_theta": THETA}),
}


def mla_attention_cases() -> dict:
    """{case/NAME: array}: the layer's weights (transformers' names), its input x [2, 24, 48],
    positions [2, 24] and output [2, 24, 48], float32."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    out = {}
    for i, (case, options) in enumerate(MLA_ATTENTION.items()):
        torch.manual_seed(100 + i)
        config = transformers.DeepseekV3Config(**{**SIZES, **MLA, **options},
                                               attn_implementation="eager")
        layer = deepseek.DeepseekV3Attention(config, layer_idx=0).eval()
        with torch.no_grad():
            for name, p in layer.named_parameters():
                p.copy_(0.5 + 0.3 * torch.randn_like(p) if name.endswith("norm.weight")
                        else 0.3 * torch.randn_like(p))
        x = torch.randn(2, 24, SIZES["hidden_size"])
        positions = torch.arange(70, 94).repeat(2, 1)
        rotary = deepseek.DeepseekV3RotaryEmbedding(config)
        mask = torch.triu(torch.full((24, 24), float("-inf")), diagonal=1)[None, None]
        with torch.no_grad():
            y, _ = layer(x, rotary(x, positions), mask.expand(2, 1, 24, 24))
        for name, p in layer.state_dict().items():
            out[f"{case}/{name}"] = p.numpy().astype(np.float32)
        out.update({f"{case}/x": x.numpy(), f"{case}/positions": positions.numpy(),
                    f"{case}/out": y.numpy()})
        print(case, float(y.abs().mean()))
    return out


def gated_deltanet_case() -> dict:
    """{NAME: array}: one Qwen3NextGatedDeltaNet layer alone (qwen3_next_hybrid's shapes; its
    torch path: the conv, then the chunked rule in chunks of 64), its weights (transformers'
    names), input x [2, 96, 48] and output [2, 96, 48], float32."""
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next
    torch.manual_seed(200)
    _, _, options, _, _ = HYBRID_CASES["qwen3_next_hybrid"]
    config = transformers.Qwen3NextConfig(**{**SIZES, **options})
    layer = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(0.5 + 0.3 * torch.randn_like(p) if name.endswith("norm.weight")
                    else 0.3 * torch.randn_like(p))
    x = torch.randn(2, TOKENS, SIZES["hidden_size"])
    with torch.no_grad():
        y = layer(x)
    out = {name: p.numpy().astype(np.float32) for name, p in layer.state_dict().items()}
    print("gated_deltanet", float(y.abs().mean()))
    return {**out, "x": x.numpy(), "out": y.numpy()}


def main() -> None:
    if "--qwen2-only" in sys.argv:  # issue 71's family, added to what is there
        logits = dict(np.load(os.path.join(OUT, "logits.npz")))
        start = len(CASES) + len(FAMILY_CASES) + len(LATENT_CASES) + len(HYBRID_CASES) + 1
        for i, (name, case) in enumerate(QWEN2_CASES.items(), start=start):
            logits[name] = family_case(name, case, logits["tokens"], i)
        np.savez(os.path.join(OUT, "logits.npz"), **logits)
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    if "--gated-deltanet" in sys.argv:
        np.savez(os.path.join(OUT, "gated_deltanet.npz"), **gated_deltanet_case())
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    if "--mla-attention" in sys.argv:
        np.savez(os.path.join(OUT, "mla_attention.npz"), **mla_attention_cases())
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    if "--hybrid-only" in sys.argv:  # issue 63's families, added to what is there
        logits = dict(np.load(os.path.join(OUT, "logits.npz")))
        start = len(CASES) + len(FAMILY_CASES) + len(LATENT_CASES) + 1
        for i, (name, case) in enumerate(HYBRID_CASES.items(), start=start):
            logits[name] = family_case(name, case, logits["tokens"], i)
        np.savez(os.path.join(OUT, "logits.npz"), **logits)
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    if "--latent-only" in sys.argv:  # issue 62's families, added to what is there
        logits = dict(np.load(os.path.join(OUT, "logits.npz")))
        start = len(CASES) + len(FAMILY_CASES) + 1
        for i, (name, case) in enumerate(LATENT_CASES.items(), start=start):
            logits[name] = family_case(name, case, logits["tokens"], i)
        np.savez(os.path.join(OUT, "logits.npz"), **logits)
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    if "--mxfp4-only" in sys.argv:  # the one case, added to what is there
        logits = dict(np.load(os.path.join(OUT, "logits.npz")))
        logits["gpt_oss_mxfp4"] = mxfp4_case(logits["tokens"], len(CASES) + len(FAMILY_CASES))
        np.savez(os.path.join(OUT, "logits.npz"), **logits)
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
    shutil.rmtree(OUT, ignore_errors=True)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SIZES["vocab_size"], (2, TOKENS))
    logits = {"tokens": tokens.astype(np.int32)}
    for i, (name, (rope, tied, dtype, shard, old)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        config = LlamaConfig(**SIZES, tie_word_embeddings=tied, initializer_range=0.2,
                             rope_parameters={**rope, "rope_theta": THETA})
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
        model = model.to(dtype)
        path = os.path.join(OUT, name)
        model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
        os.remove(os.path.join(path, "generation_config.json"))
        if old:
            old_layout(path)
        reloaded = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            out = reloaded(torch.from_numpy(tokens)).logits
        logits[name] = out.numpy().astype(np.float32)
        print(name, sorted(os.listdir(path)), float(out.abs().mean()))
    for i, (name, case) in enumerate(FAMILY_CASES.items(), start=len(CASES)):
        logits[name] = family_case(name, case, tokens, i)
    start = len(CASES) + len(FAMILY_CASES) + 1
    for i, (name, case) in enumerate(LATENT_CASES.items(), start=start):
        logits[name] = family_case(name, case, tokens, i)
    start = len(CASES) + len(FAMILY_CASES) + len(LATENT_CASES) + 1
    for i, (name, case) in enumerate(HYBRID_CASES.items(), start=start):
        logits[name] = family_case(name, case, tokens, i)
    start += len(HYBRID_CASES)
    for i, (name, case) in enumerate(QWEN2_CASES.items(), start=start):
        logits[name] = family_case(name, case, tokens, i)
    logits["gpt_oss_mxfp4"] = mxfp4_case(tokens, len(CASES) + len(FAMILY_CASES))
    np.savez(os.path.join(OUT, "logits.npz"), **logits)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
