"""Recurrent strategies: how a recurrent layer's rule (Gated DeltaNet's, Mamba2's) crosses the
'seq' devices, a run's parallel.linear_strategy. See base.py.

    state   each device scans its contiguous block from a zero state and the devices pass the
            blocks' state summaries: bytes constant in the length (state.py)
    heads   all-to-alls give each device the whole row for groups / N of the layer's groups
            (Ulysses for the recurrence): bytes grow with the length (heads.py)

pieces.py runs either layer a piece of each device's tokens at a time (model.linear_chunk).
A new strategy is one file with a `RecurrentStrategy` subclass (its run, check and cost) and
its `STRATEGY` instance, and one entry in the tuple below (tests/model/test_linear_attention.py adds
one).
"""

from __future__ import annotations

from parallel.recurrent import heads, state
from parallel.recurrent.base import Recurrence, RecurrentShape, RecurrentStrategy

RECURRENT_STRATEGIES: dict[str, RecurrentStrategy] = {m.STRATEGY.name: m.STRATEGY
                                                      for m in (state, heads)}
# What runs on every mesh and needs nothing of the layer's groups: a model without recurrent
# layers, or one 'seq' device, resolves to it.
BASELINE = state.STRATEGY.name


def get_recurrent_strategy(name) -> RecurrentStrategy:
    """The registered recurrent strategy called `name`; ValueError naming the choices
    otherwise."""
    if isinstance(name, RecurrentStrategy):
        return name
    try:
        return RECURRENT_STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"parallel.linear_strategy={name!r}: choose "
                         f"{', '.join(repr(n) for n in RECURRENT_STRATEGIES)} or 'auto'"
                         ) from None


__all__ = ["BASELINE", "RECURRENT_STRATEGIES", "Recurrence", "RecurrentShape",
           "RecurrentStrategy", "get_recurrent_strategy"]
