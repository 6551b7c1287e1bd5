"""GPT-OSS (`gpt_oss`): GPT-OSS 20B, 120B (MXFP4 experts dequantized): sliding and full layers
alternating, sinks, q/k/v/o biases, experts with biases and a clamped SwiGLU.
"""

from __future__ import annotations

from model.config import FULL, SLIDING, MoEConfig
from model.hf.families import llama
from model.hf.families.base import (Family, FamilyError, Stored, experts_of, layer_types_of,
                                     refuse, sliding_window_of)
from model.moe import GPT_OSS_ALPHA


# GPT-OSS: q, k, v, o with biases, sinks; the router [E, D] with a bias; every expert's
# matrices in one tensor a layer, [E, in, out] (not transposed), gate and up interleaved.
LAYER = {**{k: v for k, v in llama.LAYER.items() if k[0] != "mlp"},
         **{("attention", p, "bias"): f"self_attn.{p}_proj.bias" for p in "qkvo"},
         ("attention", "sinks"): "self_attn.sinks",
         ("mlp", "router"): "mlp.router.weight",
         ("mlp", "router_bias"): "mlp.router.bias",
         ("mlp", "gate"): Stored("mlp.experts.gate_up_proj", part=0, parts=2),
         ("mlp", "up"): Stored("mlp.experts.gate_up_proj", part=1, parts=2),
         ("mlp", "gate_bias"): Stored("mlp.experts.gate_up_proj_bias", part=0, parts=2),
         ("mlp", "up_bias"): Stored("mlp.experts.gate_up_proj_bias", part=1, parts=2),
         ("mlp", "down"): Stored("mlp.experts.down_proj"),
         ("mlp", "down_bias"): "mlp.experts.down_proj_bias"}


def read(c):
    refuse(c, [("hidden_act", ["silu"]), ("swiglu_alpha", [GPT_OSS_ALPHA]),
                ("attention_bias", [True])])
    types = layer_types_of(c, lambda i: SLIDING if (i + 1) % 2 else FULL)
    return dict(layer_types=types, sliding_window=sliding_window_of(c), attention_sinks=True,
                attention_bias=True, moe=MoEConfig(
                    num_experts=c["num_local_experts"], top_k=c["num_experts_per_tok"],
                    expert_mlp_dim=c["intermediate_size"], router="topk_softmax",
                    expert_bias=True, swiglu_limit=float(c.get("swiglu_limit", 7.0)),
                    aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0)))


def write(cfg):
    moe = experts_of(cfg)
    if not (cfg.attention_sinks and cfg.attention_bias and moe.expert_bias and moe.swiglu_limit
            and moe.router == "topk_softmax" and not moe.mlp_only_layers
            and moe.decoder_sparse_step == 1):
        raise FamilyError("GPT-OSS: sinks, biases, clamped SwiGLU, top-k then softmax")
    return {"hidden_act": "silu", "attention_bias": True,
            "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
            "sliding_window": cfg.sliding_window or None, "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "intermediate_size": cfg.expert_mlp_dim,
            "swiglu_limit": moe.swiglu_limit, "swiglu_alpha": GPT_OSS_ALPHA,
            "router_aux_loss_coef": moe.aux_loss_coef}


FAMILY = Family("gpt_oss", "GptOssForCausalLM", read, write, LAYER,
                models="GPT-OSS 20B, 120B (MXFP4 experts dequantized)",
                attention="sliding and full alternating",
                block="sinks, q/k/v/o biases; experts with biases, clamped SwiGLU")
