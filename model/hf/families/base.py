"""What every Hugging Face family shares (one family a file beside this one, registered in
families/__init__.py): the `Family` record, the one-line FamilyError, the config.json readings
several families make, and `Stored` for a tensor kept otherwise than as a plain [out, in]
matrix or a vector.

A family is how one `model_type`'s config.json maps onto ModelConfig and back (`read`, `write`)
and how its layers' tensors are named (`layer`: our parameter's path inside a block -> the
tensor's name inside model.layers.i); model/hf/checkpoint.py reads and writes through it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

from model.config import (FUNCTION, SHAPE, SLIDING, LinearAttentionConfig, MambaConfig,
                          MLAConfig, ModelConfig, MoEConfig, weight_fields)
from model.mixers.gated_deltanet import LINEAR
from model.mixers.mamba2 import MAMBA


class FamilyError(ValueError):
    """config.json asks for something the family's model here does not compute (one line)."""


def refuse(c: dict, checks) -> None:
    """FamilyError for the first (key, allowed values) config.json contradicts."""
    for key, allowed in checks:
        if key in c and c[key] not in allowed:
            raise FamilyError(f"{key}={c[key]!r} is not supported (this model has "
                              f"{key} in {list(allowed)})")


def sliding_window_of(c: dict) -> int:
    return int(c.get("sliding_window") or 0)


def layer_types_of(c: dict, default: Callable[[int], str]) -> tuple[str, ...]:
    """config.json's layer_types, or the family's rule for files written before it had them."""
    n = c["num_hidden_layers"]
    return tuple(c.get("layer_types") or [default(i) for i in range(n)])


def experts_of(cfg):
    """cfg.moe, or FamilyError for a model without experts (a dense family holds it)."""
    if not cfg.moe.num_experts:
        raise FamilyError("no experts")
    return cfg.moe


def rotary_of(c: dict, default: float) -> float:
    """partial_rotary_factor, on top (transformers 4) or among rope_parameters (5)."""
    return float(c.get("partial_rotary_factor") or (c.get("rope_parameters") or {}).get(
        "partial_rotary_factor") or default)


@dataclasses.dataclass(frozen=True)
class Stored:
    """How a family stores one of our parameters when not as a plain [out, in] matrix or
    vector: `transposed` or not (the last two axes swapped: ours [.., in, out]), as part `part`
    of `parts` interleaved along the last axis of one tensor (GPT-OSS keeps gate and up as the
    even and odd columns of gate_up_proj) or, with `halves`, one after the other along the
    stored out axis (Granite's input_linear: gate, then up), or as torch's depthwise Conv1d
    weight."""
    name: str
    transposed: bool = False
    part: int = 0
    parts: int = 1
    depthwise: bool = False  # a depthwise conv: ours [K, C], the file's [C, 1, K] (torch's Conv1d)
    halves: bool = False  # the parts contiguous along the stored [.., out, in]'s out axis


def stored(path: tuple, entry) -> Stored:
    """A family's entry as a Stored: a bare name is transposed when it is a kernel or an
    expert layer's matrix ([out, in], as torch's Linear keeps them)."""
    if isinstance(entry, Stored):
        return entry
    return Stored(entry, transposed=path[-1] in ("kernel", "router", "gate", "up", "down"))


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
