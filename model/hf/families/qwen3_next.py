"""Qwen3-Next (`qwen3_next`): Qwen3-Next-80B-A3B: Gated DeltaNet layers
(model/mixers/gated_deltanet.py), every full_attention_interval-th layer softmax with an output
gate, q/k norms and partial rotary; Qwen2-MoE's experts; zero-centred norms (stored as
scale - 1). A config.json option the model here does not compute is a one-line FamilyError.
"""

from __future__ import annotations

from model.config import FULL, LinearAttentionConfig, MoEConfig
from model.hf.families import qwen2, qwen2_moe, qwen3
from model.hf.families.base import Family, FamilyError, Stored, layer_types_of, refuse, rotary_of
from model.mixers.gated_deltanet import LINEAR


# Qwen2-MoE's experts (a gated shared one), Qwen3's q/k norms; its Gated DeltaNet layers beside
# the softmax ones, each block one or the other.
GATED_DELTANET = {("attention", "qkvz", "kernel"): "linear_attn.in_proj_qkvz.weight",
                  ("attention", "ba", "kernel"): "linear_attn.in_proj_ba.weight",
                  ("attention", "conv"): Stored("linear_attn.conv1d.weight", depthwise=True),
                  ("attention", "dt_bias"): "linear_attn.dt_bias",
                  ("attention", "a_log"): "linear_attn.A_log",
                  ("attention", "norm"): "linear_attn.norm.weight",
                  ("attention", "out", "kernel"): "linear_attn.out_proj.weight"}


LAYER = {**{k: v for k, v in qwen2_moe.LAYER.items() if k not in qwen2.QKV_BIASES},
         **qwen3.QK_NORMS, **GATED_DELTANET}


def read(c: dict) -> dict:
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
               ("linear_hidden_act", ["silu", None])])
    interval = int(c.get("full_attention_interval") or 4)
    types = layer_types_of(c, lambda i: FULL if (i + 1) % interval == 0 else LINEAR)
    unknown = sorted(set(types) - {FULL, LINEAR})
    if unknown:
        raise FamilyError(f"layer_types {unknown[0]!r} is not a Qwen3-Next layer (this model "
                          f"has {FULL!r} and {LINEAR!r})")
    moe = qwen2_moe.experts(c) if c.get("num_experts") else MoEConfig()
    return dict(qk_norm=True, attention_output_gate=True, layer_types=types,
                partial_rotary_factor=rotary_of(c, 0.25), moe=moe,
                linear_attention=LinearAttentionConfig(
                    num_key_heads=c["linear_num_key_heads"],
                    num_value_heads=c["linear_num_value_heads"],
                    key_head_dim=c["linear_key_head_dim"],
                    value_head_dim=c["linear_value_head_dim"],
                    conv_kernel=c["linear_conv_kernel_dim"]))


def write(cfg) -> dict:
    la = cfg.linear_attention
    if not (la.enabled and cfg.qk_norm and cfg.attention_output_gate) or cfg.qkv_bias \
            or cfg.attention_bias or cfg.sliding_window or cfg.mla.enabled:
        raise FamilyError("Qwen3-Next: Gated DeltaNet layers, softmax layers with q/k norms "
                          "and an output gate, no biases or windows")
    return {"hidden_act": "silu", "attention_bias": False,
           "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
           "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
           "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
           "linear_conv_kernel_dim": la.conv_kernel, **qwen2_moe.experts_json(cfg),
           "partial_rotary_factor": cfg.partial_rotary_factor}


FAMILY = Family("qwen3_next", "Qwen3NextForCausalLM", read, write, LAYER, norm_offset=1.0,
                models="Qwen3-Next-80B-A3B",
                attention="Gated DeltaNet, gated softmax every 4th layer",
                block="Qwen2-MoE's experts, zero-centred norms")
