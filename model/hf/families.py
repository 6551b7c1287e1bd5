"""The Hugging Face model families model.hf reads and writes (FAMILIES, in the table below). A
family is how one `model_type`'s config.json
maps onto ModelConfig and back, and how its layers' tensors are named; one `Family` each, and
one line in FAMILIES.

What each holds (`models`: the checkpoints; `attention`: per layer; `block`: besides Llama's),
as the README's models table shows it: `python scripts/models_table.py` prints that table from
FAMILIES, and tests/test_docs.py keeps the README's equal to it.

Gemma and Qwen3-Next store their RMSNorm scales as (scale - 1) (the norm multiplies by 1 + weight):
`norm_offset` adds the 1 on reading and takes it off on writing. An option a family does not
have, or a model no family holds (sinks without GPT-OSS's block, latent attention with Qwen's
experts), is a one-line HFError, never a model that loads and computes something else. Each expert is
its own tensors in the files (model.layers.i.mlp.experts.e.*), as the hub's checkpoints and
transformers 5's save_pretrained keep them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

from model.config import (FULL, FUNCTION, SHAPE, SLIDING, LinearAttentionConfig,
                          MambaConfig, MLAConfig, ModelConfig, MoEConfig, weight_fields)
from model.mixers.gated_deltanet import LINEAR
from model.mixers.mamba2 import MAMBA
from model.hf.hybrid import granite_hybrid, granite_hybrid_json, qwen3_next, qwen3_next_json
from model.hf.tensors import (DEEPSEEK_MOE, GEMMA_NORMS, GLM4_MOE_LAYER, GPT_OSS_LAYER,
                              GRANITE_HYBRID_LAYER, LLAMA_LAYER, MIXTRAL_LAYER, MLA_LAYER,
                              QK_NORMS, QKV_BIASES, QWEN2_MOE_LAYER, QWEN3_MOE_LAYER,
                              QWEN3_NEXT_LAYER)
from model.hf.rules import (FamilyError, experts_of, layer_types_of, qwen2_experts,
                            qwen2_experts_json, refuse, rotary_of, sliding_window_of)
from model.moe import GPT_OSS_ALPHA


# ------------------------------------------------------------------------- config.json -> ours

def _llama(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]), ("mlp_bias", [False])])
    return {}


def _mistral(c):
    refuse(c, [("hidden_act", ["silu"])])
    window = sliding_window_of(c)
    return dict(layer_types=(SLIDING,) * c["num_hidden_layers"] if window else (),
                sliding_window=window)


def _qwen_layers(c) -> dict:
    """Qwen's sliding layers: none without use_sliding_window (transformers then ignores the
    window); where config.json has no layer_types (the hub's Qwen2.5 files), sliding from layer
    max_window_layers on."""
    window = sliding_window_of(c) if c.get("use_sliding_window") else 0
    first = c.get("max_window_layers", c["num_hidden_layers"])
    types = layer_types_of(c, lambda i: SLIDING if i >= first else FULL) if window else ()
    sliding = SLIDING in types
    return dict(layer_types=types if sliding else (), sliding_window=window if sliding else 0)


def _qwen2(c):
    refuse(c, [("hidden_act", ["silu"])])
    return dict(qkv_bias=True, **_qwen_layers(c))


def _qwen3(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False])])
    return dict(qk_norm=True, **_qwen_layers(c))


def _qwen3_moe(c):
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


def _mixtral(c):
    return dict(_mistral(c), moe=MoEConfig(
        num_experts=c["num_local_experts"], top_k=c["num_experts_per_tok"],
        expert_mlp_dim=c["intermediate_size"], norm_topk_prob=True,
        aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0)))


def _gpt_oss(c):
    refuse(c, [("hidden_act", ["silu"]), ("swiglu_alpha", [GPT_OSS_ALPHA]),
                ("attention_bias", [True])])
    types = layer_types_of(c, lambda i: SLIDING if (i + 1) % 2 else FULL)
    return dict(layer_types=types, sliding_window=sliding_window_of(c), attention_sinks=True,
                attention_bias=True, moe=MoEConfig(
                    num_experts=c["num_local_experts"], top_k=c["num_experts_per_tok"],
                    expert_mlp_dim=c["intermediate_size"], router="topk_softmax",
                    expert_bias=True, swiglu_limit=float(c.get("swiglu_limit", 7.0)),
                    aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0)))


def _deepseek_moe(c, router: str, norm_topk_prob: bool) -> MoEConfig:
    """The routed and shared experts of DeepSeek-V2/V3 and GLM-4.5's config.json."""
    refuse(c, [("moe_layer_freq", [1, None]), ("mlp_bias", [False, None])])
    return MoEConfig(
        num_experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"],
        expert_mlp_dim=c["moe_intermediate_size"], router=router, norm_topk_prob=norm_topk_prob,
        n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1),
        routed_scaling_factor=float(c.get("routed_scaling_factor") or 1.0),
        num_shared_experts=int(c.get("n_shared_experts") or 0),
        first_dense_layers=int(c.get("first_k_dense_replace") or 0))


def _mla(c) -> MLAConfig:
    return MLAConfig(kv_lora_rank=c["kv_lora_rank"], q_lora_rank=int(c.get("q_lora_rank") or 0),
                     qk_nope_head_dim=c["qk_nope_head_dim"],
                     qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
                     rope_interleave=bool(c.get("rope_interleave", True)))


def _deepseek_v3(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False])])
    return dict(mla=_mla(c), moe=_deepseek_moe(c, "sigmoid_topk", bool(c["norm_topk_prob"])))


def _deepseek_v2(c):
    # transformers' V2 router: softmax, greedy or group-limited (a group's best expert), never
    # renormalised (it ignores norm_topk_prob); its RoPE always interleaved
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
                ("topk_method", ["greedy", "group_limited_greedy", None])])
    c = {k: v for k, v in c.items() if k != "rope_interleave"}
    moe = _deepseek_moe(c, "softmax_topk", False)
    if c.get("topk_method", "greedy") == "greedy":
        moe = dataclasses.replace(moe, n_group=1, topk_group=1)
    return dict(mla=_mla(c), moe=moe)


def _glm4_moe(c):
    refuse(c, [("hidden_act", ["silu"])])
    return dict(qkv_bias=bool(c.get("attention_bias")), qk_norm=bool(c.get("use_qk_norm")),
                partial_rotary_factor=rotary_of(c, 0.5),
                moe=_deepseek_moe(c, "sigmoid_topk", bool(c["norm_topk_prob"])))


def _qwen2_moe(c):
    refuse(c, [("hidden_act", ["silu"]), ("use_sliding_window", [False, None])])
    return dict(qkv_bias=bool(c.get("qkv_bias", True)), moe=qwen2_experts(c))


def _gemma(c, *, qk_norm: bool, default_types):
    refuse(c, [("hidden_activation", ["gelu_pytorch_tanh", "gelu_tanh"]),
                ("hidden_act", ["gelu_pytorch_tanh", "gelu_tanh", None]),
                ("attention_bias", [False]), ("use_bidirectional_attention", [False, None])])
    return dict(layer_types=layer_types_of(c, default_types), sliding_window=sliding_window_of(c),
                qk_norm=qk_norm, attn_logit_soft_cap=float(c.get("attn_logit_softcapping") or 0),
                final_logit_soft_cap=float(c.get("final_logit_softcapping") or 0),
                query_scale=float(c.get("query_pre_attn_scalar") or c["head_dim"]),
                mlp_activation="gelu_tanh", sandwich_norms=True, embed_scale=True,
                tie_embeddings=bool(c.get("tie_word_embeddings", True)))


# ------------------------------------------------------------------------- ours -> config.json

def _llama_json(cfg):
    return {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def _mistral_json(cfg):
    return {"hidden_act": "silu", "sliding_window": cfg.sliding_window or None}


def _qwen2_json(cfg):
    if not cfg.qkv_bias:
        raise FamilyError("Qwen2's attention has q, k and v biases")
    return {k: v for k, v in _qwen3_json(cfg).items() if k != "attention_bias"}


def _qwen3_json(cfg):
    types = [cfg.layer_type(i) for i in range(cfg.num_layers)]
    first = types.index(SLIDING) if SLIDING in types else cfg.num_layers
    return {"hidden_act": "silu", "attention_bias": False, "layer_types": types,
            "use_sliding_window": SLIDING in types, "sliding_window": cfg.sliding_window or None,
            "max_window_layers": first}


def _qwen3_moe_json(cfg):
    moe = experts_of(cfg)
    return {"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
            "sliding_window": None, "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": cfg.expert_mlp_dim,
            "norm_topk_prob": moe.norm_topk_prob, "decoder_sparse_step": moe.decoder_sparse_step,
            "mlp_only_layers": list(moe.mlp_only_layers),
            "router_aux_loss_coef": moe.aux_loss_coef}


def _mixtral_json(cfg):
    moe = experts_of(cfg)
    if moe.mlp_only_layers or moe.decoder_sparse_step != 1 or moe.router != "softmax_topk" \
            or not moe.norm_topk_prob:
        raise FamilyError("Mixtral's blocks are all sparse, routed softmax, top-k, renormalised")
    return {**_mistral_json(cfg), "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "intermediate_size": cfg.expert_mlp_dim,
            "router_aux_loss_coef": moe.aux_loss_coef}


def _gpt_oss_json(cfg):
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


def _deepseek_moe_json(cfg, router: str) -> dict:
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


def _mla_json(cfg) -> dict:
    mla = cfg.mla
    if not mla.enabled:
        raise FamilyError("no latent attention")
    return {"kv_lora_rank": mla.kv_lora_rank, "q_lora_rank": mla.q_lora_rank or None,
            "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
            "v_head_dim": mla.v_head_dim, "head_dim": mla.qk_rope_head_dim,
            "attention_bias": False,
            "num_key_value_heads": cfg.num_heads}


def _deepseek_v3_json(cfg):
    return {**_mla_json(cfg), **_deepseek_moe_json(cfg, "sigmoid_topk"),
            "rope_interleave": cfg.mla.rope_interleave, "num_nextn_predict_layers": 0}


def _deepseek_v2_json(cfg):
    out = {**_mla_json(cfg), **_deepseek_moe_json(cfg, "softmax_topk"), "mlp_bias": False}
    if cfg.moe.norm_topk_prob or not cfg.mla.rope_interleave:
        raise FamilyError("DeepSeek-V2 never renormalises its top-k weights, and interleaves "
                          "RoPE's pairs")
    grouped = cfg.moe.n_group > 1
    return {**out, "topk_method": "group_limited_greedy" if grouped else "greedy"}


def _glm4_moe_json(cfg):
    return {**_deepseek_moe_json(cfg, "sigmoid_topk"), "attention_bias": cfg.qkv_bias,
            "use_qk_norm": cfg.qk_norm, "partial_rotary_factor": cfg.partial_rotary_factor,
            "num_nextn_predict_layers": 0}


def _qwen2_moe_json(cfg):
    experts_of(cfg)
    return {"hidden_act": "silu", "qkv_bias": cfg.qkv_bias, "use_sliding_window": False,
            "layer_types": [FULL] * cfg.num_layers, **qwen2_experts_json(cfg)}


def _int_if_whole(x):
    """transformers' Gemma configs type query_pre_attn_scalar as an int."""
    return int(x) if float(x).is_integer() else float(x)


def _gemma_json(cfg):
    return {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
            "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
            "sliding_window": cfg.sliding_window or None,
            "query_pre_attn_scalar": _int_if_whole(cfg.query_scale or cfg.head_dim),
            "attn_logit_softcapping": cfg.attn_logit_soft_cap or None,
            "final_logit_softcapping": cfg.final_logit_soft_cap or None}


# The ModelConfig fields a family decides (beyond Llama's shapes and RoPE).
OPTIONS = ("layer_types", "sliding_window", "rope_local_theta", "qk_norm", "attn_logit_soft_cap",
           "final_logit_soft_cap", "attention_sinks", "attention_bias", "query_scale",
           "mlp_activation", "sandwich_norms", "embed_scale", "qkv_bias",
           "partial_rotary_factor", "mla", "attention_output_gate", "linear_attention", "mamba",
           "embedding_multiplier", "residual_multiplier", "logits_scaling")


def _moe_options(moe, mlp_dim: int) -> dict:
    """What a family's files hold of a MoEConfig (or its asdict): its architecture, written one
    way; {} for none."""
    moe = MoEConfig.from_config(
        {k: v for k, v in moe.items() if k not in MoEConfig.DERIVED}) if isinstance(moe, dict) \
        else moe or MoEConfig()
    if not moe.num_experts:
        return {}
    out = {k: getattr(moe, k) for k in weight_fields(MoEConfig, SHAPE, FUNCTION)}
    out["expert_mlp_dim"] = moe.width(mlp_dim)
    out["shared_expert_mlp_dim"] = (moe.shared_expert_mlp_dim or out["expert_mlp_dim"]
                                    if moe.num_shared_experts else 0)
    if out["router"] == "topk_softmax":
        out["norm_topk_prob"] = True  # a softmax over the k: the flag means nothing there
    return out


def _options(fields: dict, head_dim: int) -> dict:
    """The OPTIONS of a config, written one way: all-full layer types as (), no window without
    sliding layers, Gemma's query scale equal to head_dim as the default 0; the experts'
    architecture."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in OPTIONS}
    out = {**defaults, **{k: v for k, v in fields.items() if k in OPTIONS}}
    out["moe"] = _moe_options(fields.get("moe"), fields.get("mlp_dim", 0))
    out["mla"] = MLAConfig.from_config(out["mla"])
    # what the files hold of the Gated DeltaNet layers: not the chunk the rule is computed in
    out["linear_attention"] = dataclasses.replace(
        LinearAttentionConfig.from_config(out["linear_attention"]),
        chunk_size=LinearAttentionConfig.chunk_size)
    out["mamba"] = dataclasses.replace(MambaConfig.from_config(out["mamba"]),
                                       chunk_size=MambaConfig.chunk_size)
    types = tuple(out["layer_types"])
    out["layer_types"] = types if {SLIDING, LINEAR, MAMBA} & set(types) else ()
    if SLIDING not in types:
        out["sliding_window"] = 0
    if out["query_scale"] == head_dim:
        out["query_scale"] = 0.0
    return out


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str
    read: Callable[[dict], dict]  # config.json -> ModelConfig fields besides Llama's
    write: Callable[[ModelConfig], dict]  # ModelConfig -> config.json keys besides Llama's
    layer: dict  # our block parameter path -> tensor name in model.layers.i
    norm_offset: float = 0.0  # stored norm scale = ours - norm_offset
    rope_per_layer_type: bool = False  # rope_parameters keyed by layer type (Gemma 3)
    models: str = ""  # the published checkpoints this family's files hold
    attention: str = ""  # its attention, layer by layer
    block: str = ""  # what its block has besides Llama's

    def matches(self, cfg: ModelConfig) -> bool:
        """Whether this family's files hold a model with this config exactly: what `write`
        puts in config.json, `read` gives back."""
        try:
            written = self.write(cfg)
        except FamilyError:
            return False
        c = json.loads(json.dumps({"num_hidden_layers": cfg.num_layers, "head_dim": cfg.head_dim,
                                   "intermediate_size": cfg.mlp_dim, **written}))
        ours = _options(dataclasses.asdict(cfg), cfg.head_dim)
        try:
            back = _options(dict(self.read(c), mlp_dim=c["intermediate_size"]), cfg.head_dim)
        except (KeyError, FamilyError):
            return False
        if self.rope_per_layer_type:  # config.json's per-type RoPE (model/hf/checkpoint.py) holds it
            back["rope_local_theta"] = ours["rope_local_theta"]
        return back == ours


FAMILIES = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", _llama, _llama_json, LLAMA_LAYER,
           models="Llama 2, Llama 3, 3.1, 3.2, 3.3, TinyLlama", attention="full",
           block="-"),
    Family("mistral", "MistralForCausalLM", _mistral, _mistral_json, LLAMA_LAYER,
           models="Mistral 7B", attention="every layer a sliding window",
           block="-"),
    Family("qwen2", "Qwen2ForCausalLM", _qwen2, _qwen2_json, {**LLAMA_LAYER, **QKV_BIASES},
           models="Qwen2, Qwen2.5 (dense)", attention="full, or sliding from a layer on",
           block="q/k/v biases"),
    Family("qwen3", "Qwen3ForCausalLM", _qwen3, _qwen3_json, {**LLAMA_LAYER, **QK_NORMS},
           models="Qwen3 (dense)", attention="full, or sliding from a layer on",
           block="RMSNorm of q and k heads"),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", _qwen3_moe, _qwen3_moe_json, QWEN3_MOE_LAYER,
           models="Qwen3-30B-A3B, Qwen3-235B-A22B", attention="full",
           block="Qwen3's, and experts (top-k weights renormalised or not)"),
    Family("mixtral", "MixtralForCausalLM", _mixtral, _mixtral_json, MIXTRAL_LAYER,
           models="Mixtral 8x7B, 8x22B", attention="full, or every layer a window",
           block="experts in every block"),
    Family("gpt_oss", "GptOssForCausalLM", _gpt_oss, _gpt_oss_json, GPT_OSS_LAYER,
           models="GPT-OSS 20B, 120B (MXFP4 experts dequantized)",
           attention="sliding and full alternating",
           block="sinks, q/k/v/o biases; experts with biases, clamped SwiGLU"),
    Family("gemma2", "Gemma2ForCausalLM",
           lambda c: _gemma(c, qk_norm=False, default_types=lambda i: (SLIDING, FULL)[i % 2]),
           _gemma_json, {**LLAMA_LAYER, **GEMMA_NORMS}, norm_offset=1.0,
           models="Gemma 2", attention="sliding and full alternating",
           block="GeGLU, sandwich norms, embedding and query scale, soft caps"),
    Family("gemma3_text", "Gemma3ForCausalLM",
           lambda c: _gemma(c, qk_norm=True,
                            default_types=lambda i: FULL if (i + 1) % 6 == 0 else SLIDING),
           _gemma_json, {**LLAMA_LAYER, **GEMMA_NORMS, **QK_NORMS}, norm_offset=1.0,
           rope_per_layer_type=True,
           models="Gemma 3 (text)", attention="5 sliding : 1 full, a local RoPE base",
           block="Gemma 2's with q/k norms, no caps"),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", _deepseek_v3, _deepseek_v3_json,
           {**MLA_LAYER, **DEEPSEEK_MOE},
           models="DeepSeek-V3, Kimi K2, Moonlight", attention="latent attention",
           block="experts: sigmoid, correction bias, groups; shared experts"),
    Family("deepseek_v2", "DeepseekV2ForCausalLM", _deepseek_v2, _deepseek_v2_json,
           {**MLA_LAYER, **{k: v for k, v in DEEPSEEK_MOE.items() if k[-1] != "correction_bias"}},
           models="DeepSeek-V2, DeepSeek-V2-Lite", attention="latent attention",
           block="experts: softmax, greedy or by group; shared experts"),
    Family("glm4_moe", "Glm4MoeForCausalLM", _glm4_moe, _glm4_moe_json, GLM4_MOE_LAYER,
           models="GLM-4.5, GLM-4.5-Air", attention="full, partial rotary, q/k/v biases",
           block="DeepSeek-V3's experts"),
    Family("qwen2_moe", "Qwen2MoeForCausalLM", _qwen2_moe, _qwen2_moe_json, QWEN2_MOE_LAYER,
           models="Qwen1.5-MoE, Qwen2-57B-A14B", attention="full, q/k/v biases",
           block="experts and a sigmoid-gated shared expert"),
    Family("qwen3_next", "Qwen3NextForCausalLM", qwen3_next, qwen3_next_json, QWEN3_NEXT_LAYER,
           norm_offset=1.0,
           models="Qwen3-Next-80B-A3B", attention="Gated DeltaNet, gated softmax every 4th layer",
           block="Qwen2-MoE's experts, zero-centred norms"),
    Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", granite_hybrid,
           granite_hybrid_json, GRANITE_HYBRID_LAYER,
           models="Granite 4.0 hybrid", attention="Mamba2, a few softmax layers (RoPE or none)",
           block="Granite's multipliers; experts beside a shared MLP"),
)}


def models_table() -> str:
    """The README's table of the families, one row each, from FAMILIES."""
    rows = ["| family (`model_type`) | checkpoints | attention | block, besides Llama's |",
            "|---|---|---|---|"]
    rows += [f"| `{f.model_type}` | {f.models} | {f.attention} | {f.block} |"
             for f in FAMILIES.values()]
    return "\n".join(rows)


def family_of(cfg: ModelConfig) -> Family:
    """The family whose files hold this model exactly (the first in FAMILIES order), or
    FamilyError naming what none of them has."""
    for family in FAMILIES.values():
        if family.matches(cfg):
            return family
    if cfg.attention_sinks:
        raise FamilyError("attention sinks: only GPT-OSS has them, with its experts, biases and "
                          "clamped SwiGLU")
    raise FamilyError("no Hugging Face family here holds this combination of attention "
                      "options (layer_types, qk_norm, soft caps, Gemma's block)")
