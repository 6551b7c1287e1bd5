"""The ConfigDict a config file starts from (configs/default.py), made of run_config/schema.py's
defaults: the fields a config file may set, with the values of the embedded default run, so
that `--config.FIELD=VALUE` parses each by its default's type.

Three kinds of field are written so that a config file or a flag can give what the type allows:
a field whose default is 'auto' and that takes a value of another kind ('auto' or 512, 'auto' or
True) holds any type, and model.vocab_size and data.vocab_size are one value (the tokenizer's
pieces are the embedding's rows): setting either sets both.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from model.config import MemorySwitches, MoEConfig
from run_config.schema import RunConfig

# Sections that take a value of another type than their default's (a memory switch's 'auto' or
# its value; parallel.tile's 'auto', size or pair): not type-safe, as a copy of the config (a
# stage's, a plan's) must still take either (MemorySwitches and ParallelConfig check the kinds).
ANY_TYPE = {"parallel": ("tile",), "model": MemorySwitches.fields()}
NOT_FIELDS = {"model.moe": MoEConfig.DERIVED}  # set by the run, not a file


def default_config() -> ml_collections.ConfigDict:
    """A fresh ConfigDict of every run config field at its default (RunConfig())."""
    config = _section(RunConfig(), "")
    vocab_size = ml_collections.FieldReference(config.model.vocab_size)
    config.model.vocab_size = vocab_size
    config.data.vocab_size = vocab_size
    return config


def _section(node, name: str) -> ml_collections.ConfigDict:
    any_type = ANY_TYPE.get(name, ())
    out = ml_collections.ConfigDict(type_safe=not any_type)
    for field in dataclasses.fields(node):
        if field.name in NOT_FIELDS.get(name, ()):
            continue
        value = getattr(node, field.name)
        dotted = f"{name}.{field.name}".lstrip(".")
        if dataclasses.is_dataclass(value):
            out[field.name] = _section(value, dotted)
            continue
        if field.name in any_type:
            out[field.name] = config_dict.placeholder(object)
        out[field.name] = value
    return out
