"""What every Hugging Face family's reading and writing share (model/hf_families.py,
model/hf_hybrid.py): the one-line FamilyError, refusing config.json values the model here does
not compute, the layer types and window a config.json gives."""

from __future__ import annotations

from typing import Callable


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
