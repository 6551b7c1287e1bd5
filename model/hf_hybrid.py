"""The hybrid families model.hf reads and writes, whose blocks mix tokens by a recurrence or by
softmax attention (model/hf_families.py registers them):

    family        token mixing per layer                         besides Llama's block
    qwen3_next    Gated DeltaNet (model/linear_attention.py),     zero-centred norms (stored as
                  every full_attention_interval-th layer softmax  scale - 1), q/k norms; experts
                  with an output gate and partial rotary          with a sigmoid-gated shared one

A config.json option the model here does not compute is a one-line FamilyError.
"""

from __future__ import annotations

from model.config import FULL, LINEAR, LinearAttentionConfig, MoEConfig
from model.hf_rules import (FamilyError, layer_types_of, qwen2_experts, qwen2_experts_json,
                            refuse, rotary_of)


def qwen3_next(c: dict) -> dict:
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
               ("linear_hidden_act", ["silu", None])])
    interval = int(c.get("full_attention_interval") or 4)
    types = layer_types_of(c, lambda i: FULL if (i + 1) % interval == 0 else LINEAR)
    unknown = sorted(set(types) - {FULL, LINEAR})
    if unknown:
        raise FamilyError(f"layer_types {unknown[0]!r} is not a Qwen3-Next layer (this model "
                          f"has {FULL!r} and {LINEAR!r})")
    moe = qwen2_experts(c) if c.get("num_experts") else MoEConfig()
    return dict(qk_norm=True, attention_output_gate=True, layer_types=types,
                partial_rotary_factor=rotary_of(c, 0.25), moe=moe,
                linear_attention=LinearAttentionConfig(
                    num_key_heads=c["linear_num_key_heads"],
                    num_value_heads=c["linear_num_value_heads"],
                    key_head_dim=c["linear_key_head_dim"],
                    value_head_dim=c["linear_value_head_dim"],
                    conv_kernel=c["linear_conv_kernel_dim"]))


def qwen3_next_json(cfg) -> dict:
    la = cfg.linear_attention
    if not (la.enabled and cfg.qk_norm and cfg.attention_output_gate) or cfg.qkv_bias \
            or cfg.attention_bias or cfg.sliding_window or cfg.mla.enabled:
        raise FamilyError("Qwen3-Next: Gated DeltaNet layers, softmax layers with q/k norms "
                          "and an output gate, no biases or windows")
    return {"hidden_act": "silu", "attention_bias": False,
           "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
           "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
           "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
           "linear_conv_kernel_dim": la.conv_kernel, **qwen2_experts_json(cfg),
           "partial_rotary_factor": cfg.partial_rotary_factor}
