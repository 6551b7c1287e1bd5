"""GLM-4.5 (`glm4_moe`): GLM-4.5, GLM-4.5-Air: full attention with partial rotary, q/k/v biases
and q/k norms; DeepSeek-V3's experts.
"""

from __future__ import annotations

from model.hf.families import deepseek, llama, qwen2, qwen3
from model.hf.families.base import Family, refuse, rotary_of


def read(c):
    refuse(c, [("hidden_act", ["silu"])])
    return dict(qkv_bias=bool(c.get("attention_bias")), qk_norm=bool(c.get("use_qk_norm")),
                partial_rotary_factor=rotary_of(c, 0.5),
                moe=deepseek.experts(c, "sigmoid_topk", bool(c["norm_topk_prob"])))


def write(cfg):
    return {**deepseek.experts_json(cfg, "sigmoid_topk"), "attention_bias": cfg.qkv_bias,
            "use_qk_norm": cfg.qk_norm, "partial_rotary_factor": cfg.partial_rotary_factor,
            "num_nextn_predict_layers": 0}


FAMILY = Family("glm4_moe", "Glm4MoeForCausalLM", read, write,
                {**llama.LAYER, **qwen2.QKV_BIASES, **qwen3.QK_NORMS, **deepseek.EXPERTS},
                models="GLM-4.5, GLM-4.5-Air", attention="full, partial rotary, q/k/v biases",
                block="DeepSeek-V3's experts")
