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

# The cases, beside this file (python puts its folder first on the path)
from fixture_cases import (CASES, FAMILY_CASES, HYBRID_CASES, LATENT_CASES, MLA, MLA_ATTENTION,
                           OUT, SIZES, THETA, TOKENS)


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
