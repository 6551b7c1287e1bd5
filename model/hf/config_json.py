"""config.json in and out: a Hugging Face model's config as ModelConfig fields (`read_config`, in
either layout of the RoPE settings: transformers 5's `rope_parameters`, 4's `rope_theta` +
`rope_scaling`), and the config.json `hf.save` writes (`config_json`) in the family that holds
the model (model/hf/families/). HFError is the one-line error of any checkpoint that cannot be
read as this model.
"""

from __future__ import annotations

import json
import os

import storage
from model.config import FULL, SLIDING, ModelConfig
from model.hf.families import FAMILIES, Family, FamilyError, family_of
from model.rope import RopeScaling

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_READS = ", ".join(f.architecture for f in FAMILIES.values())


class HFError(ValueError):
    """A Hugging Face checkpoint that cannot be read as this model: a one-line message."""


def read_config(path: str) -> tuple[dict, str]:
    """(ModelConfig fields, the stored dtype) from PATH/config.json, in either layout of the RoPE
    settings (transformers 5's `rope_parameters`, or 4's `rope_theta` + `rope_scaling`)."""
    file = storage.join(path, "config.json")
    if not storage.is_remote(path) and not os.path.isdir(path):
        raise HFError(f"{path!r} is not a directory: point at a Hugging Face model directory "
                      f"(config.json and *.safetensors)")
    try:
        c = json.loads(storage.read_text(file))
    except OSError as e:
        raise HFError(f"cannot read {file} ({e.strerror or e}): a Hugging Face model directory "
                      f"has config.json beside its *.safetensors") from None
    except json.JSONDecodeError as e:
        raise HFError(f"{file} is not valid JSON ({e.msg}, line {e.lineno})") from None
    family = FAMILIES.get(c.get("model_type"))
    architectures = c.get("architectures") or [family.architecture if family else "?"]
    if family is None or architectures != [family.architecture]:
        raise HFError(f"{path}: {'/'.join(architectures)} (model_type {c.get('model_type')!r}) "
                      f"is not a family model.hf reads: {_READS}")
    try:
        options = family.read(c)
    except FamilyError as e:
        raise HFError(f"{file}: {e}") from None
    except KeyError as e:
        raise HFError(f"{file}: a {family.architecture} config.json lacks {e.args[0]}") from None
    quantized = (c.get("quantization_config") or {}).get("quant_method")
    if quantized and quantized != "mxfp4":  # MXFP4: model/hf/safetensors_dir.py reads it
        raise HFError(f"{file}: weights quantized by {quantized!r} are not read (unquantized "
                      f"safetensors, or GPT-OSS's MXFP4 experts): give a dequantized copy "
                      f"(DeepSeek-V3's FP8 blocks: its own fp8_cast_bf16.py makes one)")
    heads = c["num_attention_heads"]
    fields = dict(vocab_size=c["vocab_size"], d_model=c["hidden_size"],
                  num_layers=c["num_hidden_layers"], num_heads=heads,
                  num_kv_heads=c.get("num_key_value_heads") or heads,
                  head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                  mlp_dim=c["intermediate_size"], norm_eps=c.get("rms_norm_eps", 1e-6),
                  tie_embeddings=bool(c.get("tie_word_embeddings", False)))
    fields.update(options)
    fields.update(_read_rope(c, file, family))
    dtype = c.get("dtype") or c.get("torch_dtype") or "float32"
    return fields, DTYPES.get(dtype, "float32")


def _read_rope(c: dict, file: str, family: Family) -> dict:
    """rope_theta and rope_scaling (a dict of RopeScaling's fields) from a config.json, and for
    a family with a RoPE per layer type (Gemma 3) rope_local_theta: the sliding layers' base,
    unscaled. Where both layouts are present transformers reads the older one, and so do we."""
    if family.rope_per_layer_type:
        per_type = c.get("rope_parameters") or {}
        if FULL in per_type or SLIDING in per_type:  # transformers 5: one entry per type
            local = dict(per_type.get(SLIDING) or {})
            if local.get("rope_type", "default") != "default":
                raise HFError(f"{file}: a scaled RoPE on sliding layers "
                              f"({local['rope_type']!r}) is not supported")
            flat = {k: v for k, v in c.items() if k not in ("rope_parameters", "rope_theta",
                                                             "rope_scaling")}
            out = _read_rope({**flat, "rope_parameters": per_type.get(FULL) or {}}, file,
                             FAMILIES["llama"])
            return {**out, "rope_local_theta": float(local.get("rope_theta", 10_000.0))}
        out = _read_rope({k: v for k, v in c.items() if k != "rope_parameters"}, file,
                         FAMILIES["llama"])
        return {**out, "rope_local_theta": float(c.get("rope_local_base_freq", 10_000.0))}
    if "rope_scaling" in c or "rope_theta" in c or not c.get("rope_parameters"):
        params = dict(c.get("rope_scaling") or {})
        theta = c.get("rope_theta", 10_000.0)
    else:
        params = dict(c["rope_parameters"])
        theta = params.pop("rope_theta", 10_000.0)
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type in ("llama3", "yarn") and not params.get("original_max_position_embeddings"):
        params["original_max_position_embeddings"] = c.get("max_position_embeddings")
    if rope_type == "yarn" and params.get("factor") is None:
        params["factor"] = c["max_position_embeddings"] / params["original_max_position_embeddings"]
    known = {f for f in RopeScaling.__dataclass_fields__}
    scaling = {"rope_type": rope_type, **{k: v for k, v in params.items()
                                          if k in known and v is not None}}
    problem = RopeScaling.from_config(scaling).problem()
    if problem:
        raise HFError(f"{file}: rope {problem}")
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def config_json(cfg: ModelConfig, dtype: str, max_position_embeddings: int = 0,
                eos_token_id: int | None = None) -> dict:
    """What `save` writes as config.json, in the family that holds the model (family_of):
    transformers 5's layout, with the RoPE settings also in transformers 4's keys (which 5
    reads first) so that either version loads them; Gemma 3's RoPE per layer type."""
    family = family_for(cfg)
    scaling = cfg.rope_scaling.parameters()
    if cfg.partial_rotary_factor != 1.0:  # transformers 5 keeps it with RoPE's parameters
        scaling["partial_rotary_factor"] = cfg.partial_rotary_factor
    out = {"architectures": [family.architecture], "model_type": family.model_type,
           "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim,
           "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
           "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
           "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
           "dtype": dtype, **family.write(cfg)}
    if family.rope_per_layer_type:  # transformers 4: the full layers' rule, the local base
        local = cfg.rope_local_theta or cfg.rope_theta
        out["rope_parameters"] = {FULL: {**scaling, "rope_theta": cfg.rope_theta},
                                  SLIDING: {"rope_type": "default", "rope_theta": local}}
        out.update({"rope_theta": cfg.rope_theta, "rope_local_base_freq": local,
                    "rope_scaling": None if scaling["rope_type"] == "default" else scaling})
    else:
        out.update({"rope_parameters": {**scaling, "rope_theta": cfg.rope_theta},
                    "rope_theta": cfg.rope_theta,
                    "rope_scaling": None if scaling["rope_type"] == "default" else scaling})
    original = cfg.rope_scaling.original_max_position_embeddings
    if not max_position_embeddings and original and cfg.rope_scaling.rope_type != "default":
        max_position_embeddings = original * cfg.rope_scaling.factor  # the extended context
    if max_position_embeddings:
        out["max_position_embeddings"] = int(max_position_embeddings)
    if eos_token_id is not None:
        out["eos_token_id"] = int(eos_token_id)
    return out



def family_for(cfg: ModelConfig) -> Family:
    """The family that holds this model (HFError, one line, for none)."""
    try:
        return family_of(cfg)
    except FamilyError as e:
        raise HFError(f"hf: {e}") from None
