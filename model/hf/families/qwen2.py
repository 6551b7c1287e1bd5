"""Qwen2 (`qwen2`): Qwen2, Qwen2.5 (dense): Llama's block with q/k/v biases, full attention or
sliding from a layer on (its sliding layers, `layers` and `layers_json`, are Qwen3's too).
"""

from __future__ import annotations

from model.config import FULL, SLIDING
from model.hf.families import llama
from model.hf.families.base import Family, FamilyError, layer_types_of, refuse, sliding_window_of


QKV_BIASES = {("attention", p, "bias"): f"self_attn.{p}_proj.bias" for p in "qkv"}


def layers(c) -> dict:
    """Qwen's sliding layers: none without use_sliding_window (transformers then ignores the
    window); where config.json has no layer_types (the hub's Qwen2.5 files), sliding from layer
    max_window_layers on."""
    window = sliding_window_of(c) if c.get("use_sliding_window") else 0
    first = c.get("max_window_layers", c["num_hidden_layers"])
    types = layer_types_of(c, lambda i: SLIDING if i >= first else FULL) if window else ()
    sliding = SLIDING in types
    return dict(layer_types=types if sliding else (), sliding_window=window if sliding else 0)


def layers_json(cfg) -> dict:
    """`layers` written back: every layer's type and where the sliding ones start."""
    types = [cfg.layer_type(i) for i in range(cfg.num_layers)]
    first = types.index(SLIDING) if SLIDING in types else cfg.num_layers
    return {"layer_types": types, "use_sliding_window": SLIDING in types,
            "sliding_window": cfg.sliding_window or None, "max_window_layers": first}


def read(c):
    refuse(c, [("hidden_act", ["silu"])])
    return dict(qkv_bias=True, **layers(c))


def write(cfg):
    if not cfg.qkv_bias:
        raise FamilyError("Qwen2's attention has q, k and v biases")
    return {"hidden_act": "silu", **layers_json(cfg)}


FAMILY = Family("qwen2", "Qwen2ForCausalLM", read, write, {**llama.LAYER, **QKV_BIASES},
                models="Qwen2, Qwen2.5 (dense)", attention="full, or sliding from a layer on",
                block="q/k/v biases")
