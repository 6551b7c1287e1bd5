"""Llama (`llama`): Llama 2, Llama 3, 3.1, 3.2, 3.3, TinyLlama. The block every other family here
starts from: RMSNorm, q/k/v/o projections without biases, RoPE, SwiGLU; LAYER's tensor names
are the ones most families reuse.
"""

from __future__ import annotations

from model.hf.families.base import Family, refuse


# Our parameter path (inside a block) -> the tensor's name inside model.layers.i.
LAYER = {("attention_norm", "scale"): "input_layernorm.weight",
         ("attention", "q", "kernel"): "self_attn.q_proj.weight",
         ("attention", "k", "kernel"): "self_attn.k_proj.weight",
         ("attention", "v", "kernel"): "self_attn.v_proj.weight",
         ("attention", "o", "kernel"): "self_attn.o_proj.weight",
         ("mlp_norm", "scale"): "post_attention_layernorm.weight",
         ("mlp", "gate", "kernel"): "mlp.gate_proj.weight",
         ("mlp", "up", "kernel"): "mlp.up_proj.weight",
         ("mlp", "down", "kernel"): "mlp.down_proj.weight"}


def read(c):
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]), ("mlp_bias", [False])])
    return {}


def write(cfg):
    return {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


FAMILY = Family("llama", "LlamaForCausalLM", read, write, LAYER,
                models="Llama 2, Llama 3, 3.1, 3.2, 3.3, TinyLlama", attention="full",
                block="-")
