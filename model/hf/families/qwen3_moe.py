"""Qwen3-MoE (`qwen3_moe`): Qwen3-30B-A3B, Qwen3-235B-A22B: Qwen3's attention, experts (top-k
weights renormalised or not), no shared expert.
"""

from __future__ import annotations

from model.config import MoEConfig
from model.hf.families import llama, qwen3
from model.hf.families.base import Family, experts_of, refuse


# A mixture-of-experts block (model/moe.py): the router, and each expert's matrices ({e}: the
# expert's index), stored [out, in] per expert as torch's Linear keeps them.
LAYER = {**llama.LAYER, **qwen3.QK_NORMS,
         ("mlp", "router"): "mlp.gate.weight",
         ("mlp", "gate"): "mlp.experts.{e}.gate_proj.weight",
         ("mlp", "up"): "mlp.experts.{e}.up_proj.weight",
         ("mlp", "down"): "mlp.experts.{e}.down_proj.weight"}


def read(c):
    # No shared expert (Qwen2-MoE's), no sliding layers (its config has no layer_types)
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
                ("shared_expert_intermediate_size", [0, None]),
                ("use_sliding_window", [False, None])])
    return dict(qk_norm=True, moe=MoEConfig(
        # the hub's files say num_experts; transformers 5 writes num_local_experts
        num_experts=c["num_experts"] if c.get("num_experts") else c["num_local_experts"],
        top_k=c["num_experts_per_tok"], expert_mlp_dim=c["moe_intermediate_size"],
        norm_topk_prob=bool(c["norm_topk_prob"]),
        decoder_sparse_step=int(c.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(c.get("mlp_only_layers") or ()),
        aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0)))


def write(cfg):
    moe = experts_of(cfg)
    return {"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
            "sliding_window": None, "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": cfg.expert_mlp_dim,
            "norm_topk_prob": moe.norm_topk_prob, "decoder_sparse_step": moe.decoder_sparse_step,
            "mlp_only_layers": list(moe.mlp_only_layers),
            "router_aux_loss_coef": moe.aux_loss_coef}


FAMILY = Family("qwen3_moe", "Qwen3MoeForCausalLM", read, write, LAYER,
                models="Qwen3-30B-A3B, Qwen3-235B-A22B", attention="full",
                block="Qwen3's, and experts (top-k weights renormalised or not)")
