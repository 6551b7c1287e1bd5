"""Gemma 2 (`gemma2`) and Gemma 3's text model (`gemma3_text`): GeGLU, sandwich norms, an
embedding and query scale; Gemma 2 soft-caps its logits, Gemma 3 norms q and k and has a local
RoPE base for its sliding layers. Both store their RMSNorm scales as (scale - 1).
"""

from __future__ import annotations

from model.config import FULL, SLIDING
from model.hf.families import llama, qwen3
from model.hf.families.base import Family, layer_types_of, refuse, sliding_window_of


NORMS = {("mlp_norm", "scale"): "pre_feedforward_layernorm.weight",
         ("post_attention_norm", "scale"): "post_attention_layernorm.weight",
         ("post_mlp_norm", "scale"): "post_feedforward_layernorm.weight"}


def read(c, *, qk_norm: bool, default_types):
    refuse(c, [("hidden_activation", ["gelu_pytorch_tanh", "gelu_tanh"]),
                ("hidden_act", ["gelu_pytorch_tanh", "gelu_tanh", None]),
                ("attention_bias", [False]), ("use_bidirectional_attention", [False, None])])
    return dict(layer_types=layer_types_of(c, default_types), sliding_window=sliding_window_of(c),
                qk_norm=qk_norm, attn_logit_soft_cap=float(c.get("attn_logit_softcapping") or 0),
                final_logit_soft_cap=float(c.get("final_logit_softcapping") or 0),
                query_scale=float(c.get("query_pre_attn_scalar") or c["head_dim"]),
                mlp_activation="gelu_tanh", sandwich_norms=True, embed_scale=True,
                tie_embeddings=bool(c.get("tie_word_embeddings", True)))


def _int_if_whole(x):
    """transformers' Gemma configs type query_pre_attn_scalar as an int."""
    return int(x) if float(x).is_integer() else float(x)


def write(cfg):
    return {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
            "layer_types": [cfg.layer_type(i) for i in range(cfg.num_layers)],
            "sliding_window": cfg.sliding_window or None,
            "query_pre_attn_scalar": _int_if_whole(cfg.query_scale or cfg.head_dim),
            "attn_logit_softcapping": cfg.attn_logit_soft_cap or None,
            "final_logit_softcapping": cfg.final_logit_soft_cap or None}


GEMMA2 = Family("gemma2", "Gemma2ForCausalLM",
                lambda c: read(c, qk_norm=False, default_types=lambda i: (SLIDING, FULL)[i % 2]),
                write, {**llama.LAYER, **NORMS}, norm_offset=1.0,
                models="Gemma 2", attention="sliding and full alternating",
                block="GeGLU, sandwich norms, embedding and query scale, soft caps")
GEMMA3 = Family("gemma3_text", "Gemma3ForCausalLM",
                lambda c: read(c, qk_norm=True,
                               default_types=lambda i: FULL if (i + 1) % 6 == 0 else SLIDING),
                write, {**llama.LAYER, **NORMS, **qwen3.QK_NORMS}, norm_offset=1.0,
                rope_per_layer_type=True,
                models="Gemma 3 (text)", attention="5 sliding : 1 full, a local RoPE base",
                block="Gemma 2's with q/k norms, no caps")
