"""Qwen3 (`qwen3`): Qwen3 (dense): Qwen2's layers without biases, an RMSNorm of each q and k head.
"""

from __future__ import annotations

from model.hf.families import llama, qwen2
from model.hf.families.base import Family, refuse


QK_NORMS = {("attention", "q_norm", "scale"): "self_attn.q_norm.weight",
            ("attention", "k_norm", "scale"): "self_attn.k_norm.weight"}


def read(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False])])
    return dict(qk_norm=True, **qwen2.layers(c))


def write(cfg):
    return {"hidden_act": "silu", "attention_bias": False, **qwen2.layers_json(cfg)}


FAMILY = Family("qwen3", "Qwen3ForCausalLM", read, write, {**llama.LAYER, **QK_NORMS},
                models="Qwen3 (dense)", attention="full, or sliding from a layer on",
                block="RMSNorm of q and k heads")
