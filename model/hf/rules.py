"""What every Hugging Face family's reading and writing share (model/hf/families.py,
model/hf/hybrid.py): the one-line FamilyError, refusing config.json values the model here does
not compute, the layer types and window a config.json gives."""

from __future__ import annotations

from typing import Callable

from model.config import MoEConfig


class FamilyError(ValueError):
    """config.json asks for something the family's model here does not compute (one line)."""


def refuse(c: dict, checks) -> None:
    """FamilyError for the first (key, allowed values) config.json contradicts."""
    for key, allowed in checks:
        if key in c and c[key] not in allowed:
            raise FamilyError(f"{key}={c[key]!r} is not supported (this model has "
                              f"{key} in {list(allowed)})")


def sliding_window_of(c: dict) -> int:
    return int(c.get("sliding_window") or 0)


def layer_types_of(c: dict, default: Callable[[int], str]) -> tuple[str, ...]:
    """config.json's layer_types, or the family's rule for files written before it had them."""
    n = c["num_hidden_layers"]
    return tuple(c.get("layer_types") or [default(i) for i in range(n)])


def experts_of(cfg):
    """cfg.moe, or FamilyError for a model without experts (a dense family holds it)."""
    if not cfg.moe.num_experts:
        raise FamilyError("no experts")
    return cfg.moe


def rotary_of(c: dict, default: float) -> float:
    """partial_rotary_factor, on top (transformers 4) or among rope_parameters (5)."""
    return float(c.get("partial_rotary_factor") or (c.get("rope_parameters") or {}).get(
        "partial_rotary_factor") or default)


def qwen2_experts(c: dict) -> MoEConfig:
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


def qwen2_experts_json(cfg) -> dict:
    """qwen2_experts written back (cfg.moe may hold no experts: Qwen3-Next's dense MLPs)."""
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
