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
from model.hf_rules import FamilyError, layer_types_of, refuse


def _rotary(c: dict, default: float) -> float:
    """partial_rotary_factor, on top (transformers 4) or among rope_parameters (5)."""
    return float(c.get("partial_rotary_factor") or (c.get("rope_parameters") or {}).get(
        "partial_rotary_factor") or default)


def qwen3_next(c: dict) -> dict:
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
               ("linear_hidden_act", ["silu", None])])
    interval = int(c.get("full_attention_interval") or 4)
    types = layer_types_of(c, lambda i: FULL if (i + 1) % interval == 0 else LINEAR)
    unknown = sorted(set(types) - {FULL, LINEAR})
    if unknown:
        raise FamilyError(f"layer_types {unknown[0]!r} is not a Qwen3-Next layer (this model "
                          f"has {FULL!r} and {LINEAR!r})")
    experts = int(c.get("num_experts") or 0)
    moe = MoEConfig(
        num_experts=experts, top_k=c["num_experts_per_tok"],
        expert_mlp_dim=c["moe_intermediate_size"], norm_topk_prob=bool(c["norm_topk_prob"]),
        decoder_sparse_step=int(c.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(c.get("mlp_only_layers") or ()),
        aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0), num_shared_experts=1,
        shared_expert_mlp_dim=c["shared_expert_intermediate_size"],
        shared_expert_gate=True) if experts else MoEConfig()
    return dict(qk_norm=True, attention_output_gate=True, layer_types=types,
                partial_rotary_factor=_rotary(c, 0.25), moe=moe,
                linear_attention=LinearAttentionConfig(
                    num_key_heads=c["linear_num_key_heads"],
                    num_value_heads=c["linear_num_value_heads"],
                    key_head_dim=c["linear_key_head_dim"],
                    value_head_dim=c["linear_value_head_dim"],
                    conv_kernel=c["linear_conv_kernel_dim"]))


def qwen3_next_json(cfg) -> dict:
    la, moe = cfg.linear_attention, cfg.moe
    if not (la.enabled and cfg.qk_norm and cfg.attention_output_gate) or cfg.qkv_bias \
            or cfg.attention_bias or cfg.sliding_window or cfg.mla.enabled:
        raise FamilyError("Qwen3-Next: Gated DeltaNet layers, softmax layers with q/k norms "
                          "and an output gate, no biases or windows")
    if moe.num_experts and (moe.num_shared_experts != 1 or not moe.shared_expert_gate
                            or moe.router != "softmax_topk"):
        raise FamilyError("Qwen3-Next's experts: softmax top-k, one gated shared expert")
    out = {"hidden_act": "silu", "attention_bias": False,
           "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
           "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
           "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
           "linear_conv_kernel_dim": la.conv_kernel, "num_experts": moe.num_experts,
           "num_experts_per_tok": moe.top_k, "moe_intermediate_size": cfg.expert_mlp_dim,
           "norm_topk_prob": moe.norm_topk_prob, "decoder_sparse_step": moe.decoder_sparse_step,
           "mlp_only_layers": list(moe.mlp_only_layers),
           "shared_expert_intermediate_size": moe.shared_expert_mlp_dim or cfg.expert_mlp_dim,
           "router_aux_loss_coef": moe.aux_loss_coef,
           "partial_rotary_factor": cfg.partial_rotary_factor}
    return out
