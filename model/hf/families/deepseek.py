"""DeepSeek-V3 (`deepseek_v3`: DeepSeek-V3, Kimi K2, Moonlight) and DeepSeek-V2 (`deepseek_v2`:
DeepSeek-V2, DeepSeek-V2-Lite): latent attention (model/mixers/latent.py) and routed experts
beside ungated shared ones, the first k blocks dense; V3 routes by sigmoid with a correction
bias, V2 by softmax, greedy or by group. GLM-4.5 takes its experts (`moe`, `experts_json`).
"""

from __future__ import annotations

import dataclasses

from model.config import MLAConfig, MoEConfig
from model.hf.families import llama
from model.hf.families.base import Family, FamilyError, experts_of, refuse


# Latent attention's tensors; the MoE block: the router with the correction bias beside the
# routed experts, and the shared experts as one gated MLP (GLM-4.5's too).
LAYER = {("attention_norm", "scale"): "input_layernorm.weight",
         ("attention", "q", "kernel"): "self_attn.q_proj.weight",
         ("attention", "q_a", "kernel"): "self_attn.q_a_proj.weight",
         ("attention", "q_a_norm", "scale"): "self_attn.q_a_layernorm.weight",
         ("attention", "q_b", "kernel"): "self_attn.q_b_proj.weight",
         ("attention", "kv_a", "kernel"): "self_attn.kv_a_proj_with_mqa.weight",
         ("attention", "kv_a_norm", "scale"): "self_attn.kv_a_layernorm.weight",
         ("attention", "kv_b", "kernel"): "self_attn.kv_b_proj.weight",
         ("attention", "o", "kernel"): "self_attn.o_proj.weight",
         **{k: v for k, v in llama.LAYER.items() if k[0].startswith("mlp")}}


SHARED_EXPERTS = {("mlp", "shared", p, "kernel"): f"mlp.shared_experts.{p}_proj.weight"
                  for p in ("gate", "up", "down")}
EXPERTS = {("mlp", "router"): "mlp.gate.weight",
           ("mlp", "correction_bias"): "mlp.gate.e_score_correction_bias",
           **{("mlp", p): f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
           **SHARED_EXPERTS}


def experts(c, router: str, norm_topk_prob: bool) -> MoEConfig:
    """The routed and shared experts of DeepSeek-V2/V3 and GLM-4.5's config.json."""
    refuse(c, [("moe_layer_freq", [1, None]), ("mlp_bias", [False, None])])
    return MoEConfig(
        num_experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"],
        expert_mlp_dim=c["moe_intermediate_size"], router=router, norm_topk_prob=norm_topk_prob,
        n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1),
        routed_scaling_factor=float(c.get("routed_scaling_factor") or 1.0),
        num_shared_experts=int(c.get("n_shared_experts") or 0),
        first_dense_layers=int(c.get("first_k_dense_replace") or 0))


def mla(c) -> MLAConfig:
    return MLAConfig(kv_lora_rank=c["kv_lora_rank"], q_lora_rank=int(c.get("q_lora_rank") or 0),
                     qk_nope_head_dim=c["qk_nope_head_dim"],
                     qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
                     rope_interleave=bool(c.get("rope_interleave", True)))


def read_v3(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False])])
    return dict(mla=mla(c), moe=experts(c, "sigmoid_topk", bool(c["norm_topk_prob"])))


def read_v2(c):
    # transformers' V2 router: softmax, greedy or group-limited (a group's best expert), never
    # renormalised (it ignores norm_topk_prob); its RoPE always interleaved
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
                ("topk_method", ["greedy", "group_limited_greedy", None])])
    c = {k: v for k, v in c.items() if k != "rope_interleave"}
    moe = experts(c, "softmax_topk", False)
    if c.get("topk_method", "greedy") == "greedy":
        moe = dataclasses.replace(moe, n_group=1, topk_group=1)
    return dict(mla=mla(c), moe=moe)


def experts_json(cfg, router: str) -> dict:
    moe = experts_of(cfg)
    if (moe.router != router or moe.mlp_only_layers or moe.decoder_sparse_step != 1
            or moe.shared_expert_gate or moe.expert_bias or moe.swiglu_limit
            or moe.shared_expert_mlp_dim not in (0, cfg.expert_mlp_dim)):
        raise FamilyError(f"DeepSeek's experts: {router}, ungated shared experts of the routed "
                          f"width, the first k blocks dense")
    return {"hidden_act": "silu", "n_routed_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": cfg.expert_mlp_dim,
            "norm_topk_prob": moe.norm_topk_prob, "n_group": moe.n_group,
            "topk_group": moe.topk_group, "routed_scaling_factor": moe.routed_scaling_factor,
            "n_shared_experts": moe.num_shared_experts,
            "first_k_dense_replace": moe.first_dense_layers}


def mla_json(cfg) -> dict:
    mla = cfg.mla
    if not mla.enabled:
        raise FamilyError("no latent attention")
    return {"kv_lora_rank": mla.kv_lora_rank, "q_lora_rank": mla.q_lora_rank or None,
            "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
            "v_head_dim": mla.v_head_dim, "head_dim": mla.qk_rope_head_dim,
            "attention_bias": False,
            "num_key_value_heads": cfg.num_heads}


def write_v3(cfg):
    return {**mla_json(cfg), **experts_json(cfg, "sigmoid_topk"),
            "rope_interleave": cfg.mla.rope_interleave, "num_nextn_predict_layers": 0}


def write_v2(cfg):
    out = {**mla_json(cfg), **experts_json(cfg, "softmax_topk"), "mlp_bias": False}
    if cfg.moe.norm_topk_prob or not cfg.mla.rope_interleave:
        raise FamilyError("DeepSeek-V2 never renormalises its top-k weights, and interleaves "
                          "RoPE's pairs")
    grouped = cfg.moe.n_group > 1
    return {**out, "topk_method": "group_limited_greedy" if grouped else "greedy"}


V3 = Family("deepseek_v3", "DeepseekV3ForCausalLM", read_v3, write_v3, {**LAYER, **EXPERTS},
            models="DeepSeek-V3, Kimi K2, Moonlight", attention="latent attention",
            block="experts: sigmoid, correction bias, groups; shared experts")
V2 = Family("deepseek_v2", "DeepseekV2ForCausalLM", read_v2, write_v2,
            {**LAYER, **{k: v for k, v in EXPERTS.items() if k[-1] != "correction_bias"}},
            models="DeepSeek-V2, DeepSeek-V2-Lite", attention="latent attention",
            block="experts: softmax, greedy or by group; shared experts")
