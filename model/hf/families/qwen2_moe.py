"""Qwen2-MoE (`qwen2_moe`): Qwen1.5-MoE, Qwen2-57B-A14B: q/k/v biases, softmax top-k experts
beside one sigmoid-gated shared expert (`experts`, `experts_json`: Qwen3-Next's too).
"""

from __future__ import annotations

from model.config import FULL, MoEConfig
from model.hf.families import llama, qwen2, qwen3, qwen3_moe
from model.hf.families.base import Family, FamilyError, experts_of, refuse


# q, k, v biases; Qwen3-MoE's experts; one shared expert, gated.
LAYER = {**llama.LAYER, **qwen2.QKV_BIASES,
         **{k: v for k, v in qwen3_moe.LAYER.items() if k not in llama.LAYER
            and k not in qwen3.QK_NORMS},
         **{("mlp", "shared", p, "kernel"): f"mlp.shared_expert.{p}_proj.weight"
            for p in ("gate", "up", "down")},
         ("mlp", "shared_gate", "kernel"): "mlp.shared_expert_gate.weight"}


def experts(c: dict) -> MoEConfig:
    """Qwen2-MoE's expert block (Qwen3-Next's too): softmax top-k routed experts beside one
    sigmoid-gated shared expert; the expert count under either of its names."""
    return MoEConfig(
        num_experts=c["num_experts"] if c.get("num_experts") else c["num_local_experts"],
        top_k=c["num_experts_per_tok"], expert_mlp_dim=c["moe_intermediate_size"],
        norm_topk_prob=bool(c["norm_topk_prob"]),
        decoder_sparse_step=int(c.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(c.get("mlp_only_layers") or ()),
        aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0), num_shared_experts=1,
        shared_expert_mlp_dim=c["shared_expert_intermediate_size"], shared_expert_gate=True)


def experts_json(cfg) -> dict:
    """experts written back (cfg.moe may hold no experts: Qwen3-Next's dense MLPs)."""
    moe = cfg.moe
    if moe.num_experts and (moe.num_shared_experts != 1 or not moe.shared_expert_gate
                            or moe.router != "softmax_topk"):
        raise FamilyError("Qwen2-MoE's experts: softmax top-k routing and one gated shared "
                          "expert")
    return {"num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": cfg.expert_mlp_dim, "norm_topk_prob": moe.norm_topk_prob,
            "decoder_sparse_step": moe.decoder_sparse_step,
            "mlp_only_layers": list(moe.mlp_only_layers),
            "shared_expert_intermediate_size": moe.shared_expert_mlp_dim or cfg.expert_mlp_dim,
            "router_aux_loss_coef": moe.aux_loss_coef}


def read(c):
    refuse(c, [("hidden_act", ["silu"]), ("use_sliding_window", [False, None])])
    return dict(qkv_bias=bool(c.get("qkv_bias", True)), moe=experts(c))


def write(cfg):
    experts_of(cfg)
    return {"hidden_act": "silu", "qkv_bias": cfg.qkv_bias, "use_sliding_window": False,
            "layer_types": [FULL] * cfg.num_layers, **experts_json(cfg)}


FAMILY = Family("qwen2_moe", "Qwen2MoeForCausalLM", read, write, LAYER,
                models="Qwen1.5-MoE, Qwen2-57B-A14B", attention="full, q/k/v biases",
                block="experts and a sigmoid-gated shared expert")
