"""Mixtral (`mixtral`): Mixtral 8x7B, 8x22B: Mistral's attention, experts in every block.
"""

from __future__ import annotations

from model.config import MoEConfig
from model.hf.families import llama, mistral
from model.hf.families.base import Family, FamilyError, experts_of


# A mixture-of-experts block (model/moe.py): the router, and each expert's matrices ({e}: the
# expert's index), stored [out, in] per expert as torch's Linear keeps them.
LAYER = {**llama.LAYER,
         ("mlp", "router"): "block_sparse_moe.gate.weight",
         ("mlp", "gate"): "block_sparse_moe.experts.{e}.w1.weight",
         ("mlp", "up"): "block_sparse_moe.experts.{e}.w3.weight",
         ("mlp", "down"): "block_sparse_moe.experts.{e}.w2.weight"}


def read(c):
    return dict(mistral.read(c), moe=MoEConfig(
        num_experts=c["num_local_experts"], top_k=c["num_experts_per_tok"],
        expert_mlp_dim=c["intermediate_size"], norm_topk_prob=True,
        aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0)))


def write(cfg):
    moe = experts_of(cfg)
    if moe.mlp_only_layers or moe.decoder_sparse_step != 1 or moe.router != "softmax_topk" \
            or not moe.norm_topk_prob:
        raise FamilyError("Mixtral's blocks are all sparse, routed softmax, top-k, renormalised")
    return {**mistral.write(cfg), "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "intermediate_size": cfg.expert_mlp_dim,
            "router_aux_loss_coef": moe.aux_loss_coef}


FAMILY = Family("mixtral", "MixtralForCausalLM", read, write, LAYER,
                models="Mixtral 8x7B, 8x22B", attention="full, or every layer a window",
                block="experts in every block")
