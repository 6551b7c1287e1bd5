"""Mistral (`mistral`): Mistral 7B, every layer a sliding window, Llama's tensors.
"""

from __future__ import annotations

from model.config import SLIDING
from model.hf.families import llama
from model.hf.families.base import Family, refuse, sliding_window_of


def read(c):
    refuse(c, [("hidden_act", ["silu"])])
    window = sliding_window_of(c)
    return dict(layer_types=(SLIDING,) * c["num_hidden_layers"] if window else (),
                sliding_window=window)


def write(cfg):
    return {"hidden_act": "silu", "sliding_window": cfg.sliding_window or None}


FAMILY = Family("mistral", "MistralForCausalLM", read, write, llama.LAYER,
                models="Mistral 7B", attention="every layer a sliding window",
                block="-")
