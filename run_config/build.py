"""A RunConfig from a config's values: the config file's ConfigDict (or any nested mapping, such
as a checkpoint's record), every field it lacks at its default (run_config/schema.py).

    config = build(tiny.get_config())                  # RunConfig, frozen
    config.model.d_model, config.tokens_per_step       # 64, 512
    longer = replace(config, {"seq_len": 1024, "model.rope_theta": 1e5})
    to_dict(config)                                    # what a checkpoint records

A field the schema does not declare is an error (a typo would otherwise be ignored), as is a
renamed or moved one (run_config/errors.py); a record read back (strict=False) keeps what this
version knows and drops the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping

from model.config import LinearAttentionConfig, MambaConfig, MLAConfig, ModelConfig, MoEConfig
from model.rope import RopeScaling
from run_config.errors import ConfigError, check_renamed
from run_config.schema import (DataConfig, MeshConfig, OptimConfig, ParallelConfig, ProfileConfig,
                               RunConfig)

SECTIONS = {"parallel": ParallelConfig, "mesh": MeshConfig, "data": DataConfig,
            "optim": OptimConfig, "profile": ProfileConfig}
# Sections of the model that the config gives as a mapping, and their types.
MODEL_GROUPS = {"rope_scaling": RopeScaling, "moe": MoEConfig, "mla": MLAConfig,
                "linear_attention": LinearAttentionConfig, "mamba": MambaConfig}


@functools.cache
def _defaults() -> dict:
    return to_dict(RunConfig())  # run_config/schema.py: the one home of every default


def defaults() -> dict:
    """Every field at its default (configs/default.py's values), as nested dicts (a fresh
    copy)."""
    return copy.deepcopy(_defaults())


def plain(values):
    """A config's values as nested dicts, tuples and scalars (a ConfigDict's to_dict, with its
    references resolved; a mapping inside a tuple, as a stage's entry, a dict too)."""
    if hasattr(values, "to_dict"):  # a config file's ConfigDict (duck-typed: not imported)
        values = values.to_dict()
    if isinstance(values, Mapping):
        return {k: plain(v) for k, v in values.items()}
    if isinstance(values, list | tuple):
        return tuple(plain(v) for v in values)
    return values


def build(values, strict: bool = True) -> RunConfig:
    """The RunConfig of `values` (a ConfigDict or nested mapping); ConfigError, one line, for a
    renamed or unknown field, or a section whose values do not make one (model.moe)."""
    values = plain(values)
    check_renamed(values)
    merged = _merge(defaults(), values, strict, "")
    try:
        return _typed(merged)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def typed(config) -> RunConfig:
    """`config` as a RunConfig: itself, or build(config) for a config file's ConfigDict. The
    public entry points take either (training.train_and_evaluate, training.validate_config,
    planner.resolve_run); everything below them reads the RunConfig."""
    return config if isinstance(config, RunConfig) else build(config)


def _merge(base: dict, values: Mapping, strict: bool, prefix: str) -> dict:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if key not in base:
            if strict:
                raise ConfigError(f"config field {name} does not exist: remove it, or give a "
                                  f"field of run_config/schema.py or model/config.py (every "
                                  f"field is declared there)")
            continue
        if isinstance(base[key], dict) and isinstance(value, Mapping):
            base[key] = _merge(base[key], value, strict, f"{name}.")
        else:
            base[key] = value
    return base


def _typed(values: dict) -> RunConfig:
    model = dict(values["model"])
    groups = {name: (cls.from_config(model.pop(name)) if name == "moe" else
                     cls(**model.pop(name))) for name, cls in MODEL_GROUPS.items()}
    sections = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    top = {k: v for k, v in values.items() if k not in (*SECTIONS, "model")}
    return RunConfig(**top, **sections, model=ModelConfig(**model, **groups))


def to_dict(config: RunConfig) -> dict:
    """The config's fields as nested dicts, as a config file names them: what a
    checkpoint records and wandb shows (build(to_dict(c)) == c)."""
    out = dataclasses.asdict(config)
    for name in MoEConfig.DERIVED:
        out["model"]["moe"].pop(name)
    return out


def replace(config, updates: Mapping[str, object]):
    """`config` (a RunConfig or one of its sections) with the fields named in `updates` (dotted:
    'seq_len', 'model.rope_theta', 'model.moe.top_k') set, each section replaced once; a
    section given a mapping ('model.rope_scaling': {...}) keeps the fields it does not name.
    model.vocab_size carries data.vocab_size with it (one value in a config file:
    run_config/config_dict.py). ConfigError for a name that is no field, or a section its new
    values break."""
    tree: dict = {}
    for name, value in updates.items():
        *sections, field = name.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[field] = value
    model = tree.get("model", {})
    if isinstance(config, RunConfig) and "vocab_size" in model:
        tree.setdefault("data", {}).setdefault("vocab_size", model["vocab_size"])
    return _apply(config, tree, "")


def _apply(node, tree: Mapping, prefix: str):
    names = {f.name for f in dataclasses.fields(node)}
    changes = {}
    for key, value in tree.items():
        if key not in names:
            raise ConfigError(f"{prefix + key!r} is not a config field")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            value = _apply(current, value, f"{prefix}{key}.")
        elif isinstance(value, list):
            value = tuple(value)
        changes[key] = value
    try:
        return dataclasses.replace(node, **changes)
    except (TypeError, ValueError) as e:  # sections that no longer agree (model/config.py)
        raise ConfigError(str(e)) from None


def has_field(name: str) -> bool:
    """Whether `name` (dotted) is a field of the run config."""
    node = _defaults()
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def field_value(config, name: str):
    """The value of field `name` (dotted) of `config`."""
    for part in name.split("."):
        config = getattr(config, part)
    return config
