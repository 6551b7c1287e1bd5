"""The Hugging Face model families model.hf reads and writes: one file a family (two for Gemma's
and DeepSeek's generations, which share their readers), each holding its config.json
translation both ways and its tensor names, and one line in FAMILIES below (base.py says what a
family is).

What each holds (`models`: the checkpoints; `attention`: per layer; `block`: besides Llama's),
as the README's models table shows it: `python scripts/hf/models_table.py` prints that table from
FAMILIES, and tests/project/test_docs.py keeps the README's equal to it.

Gemma and Qwen3-Next store their RMSNorm scales as (scale - 1) (the norm multiplies by 1 +
weight): `norm_offset` adds the 1 on reading and takes it off on writing. An option a family
does not have, or a model no family holds (sinks without GPT-OSS's block, latent attention with
Qwen's experts), is a one-line HFError, never a model that loads and computes something else.
Each expert is its own tensors in the files (model.layers.i.mlp.experts.e.*), as the hub's
checkpoints and transformers 5's save_pretrained keep them.
"""

from __future__ import annotations

from model.config import ModelConfig
from model.hf.families import (deepseek, gemma, glm4_moe, gpt_oss, granite_hybrid, llama,
                               mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next)
from model.hf.families.base import Family, FamilyError

# In this order family_of tries them (the first whose files hold a model exactly), and the
# README's table lists them.
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    llama.FAMILY, mistral.FAMILY, qwen2.FAMILY, qwen3.FAMILY, qwen3_moe.FAMILY, mixtral.FAMILY,
    gpt_oss.FAMILY, gemma.GEMMA2, gemma.GEMMA3, deepseek.V3, deepseek.V2, glm4_moe.FAMILY,
    qwen2_moe.FAMILY, qwen3_next.FAMILY, granite_hybrid.FAMILY)}


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


__all__ = ["FAMILIES", "Family", "FamilyError", "family_of", "models_table"]
