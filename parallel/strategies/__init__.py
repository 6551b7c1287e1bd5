"""Strategies: how keys and values meet queries across the 'seq' shards. See base.py.

    ring       K/V blocks hop around the ring with ppermute, N steps, compute overlapping transfer
    allgather  one all_gather of K/V, then the ring's block order locally; dK/dV reduce-scattered
    ulysses    all_to_all sequence -> heads, attention over the whole sequence for H/N heads, back
    usp        ulysses within groups of u devices x a ring over the N/u groups (ulysses_degree=u)

A new strategy is one file and one entry in the tuple below.
"""

from __future__ import annotations

import inspect

from parallel.strategies import allgather, ring, ulysses, usp
from parallel.strategies.base import Strategy
from parallel.strategy_cost import LayerShape, Network

STRATEGIES: dict[str, Strategy] = {m.STRATEGY.name: m.STRATEGY
                                   for m in (ring, allgather, ulysses, usp)}
# The strategy that runs on every mesh and head count and needs no option: what the planner's
# tables compare the others against, what stands in for 'auto' while the switches are priced,
# and what a saved model decodes with (its K/V cache holds each device's own keys).
BASELINE = ring.STRATEGY.name


def parse_label(label: str) -> tuple[str, int]:
    """(strategy, degree) from a label as Strategy.label writes it: 'usp 4x16' -> ('usp', 4),
    'ulysses 64' -> ('ulysses', 64), 'ring' -> ('ring', 1)."""
    name, _, rest = label.partition(" ")
    return name, get_strategy(name).degree_in(rest)


def get_strategy(name: str) -> Strategy:
    """The registered strategy called `name`; ValueError naming the choices otherwise."""
    if isinstance(name, Strategy):
        return name
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention strategy {name!r}: choose one of "
                         f"{', '.join(STRATEGIES)}") from None


def options(num_shards: int, q_heads: int) -> list[tuple[str, int]]:
    """(strategy, Ulysses degree) pairs that run on this mesh and head count, from each
    registered strategy's own `degrees`, by degree (registry order within one).

    Example: options(4, 4) -> [('ring', 1), ('allgather', 1), ('usp', 2), ('ulysses', 4)]."""
    found = [(name, u) for name, strategy in STRATEGIES.items()
             for u in strategy.degrees(num_shards, q_heads)]
    return sorted(found, key=lambda option: option[1])


def estimate(x: LayerShape, net: Network, strategy: str, degree: int = 1,
             documents=None, step_counts=None) -> dict:
    """Seconds (forward, backward), bytes sent and buffer bytes of `strategy` for one layer
    (its own cost, parallel/strategy_cost.py's terms); documents: segment ids [R, S] of sample
    rows (None: one causal document per row); step_counts: cost.step_tile_counts of these,
    when the caller has them already."""
    row = get_strategy(strategy).cost(x, net, degree, documents, step_counts)
    return {"strategy": strategy, "degree": degree, **row}


def configured(strategy, num_shards: int, q_heads: int, **options) -> Strategy:
    """The strategy (a name or a Strategy) on `num_shards` 'seq' devices with `q_heads` query
    heads and its options (None: not given): ValueError, one line, for an option it does not
    take, naming the strategies that take it, or one its own check refuses."""
    strategy = get_strategy(strategy)
    # what its own `configured` checks: ulysses takes a degree equal to the 'seq' axis
    checked = inspect.signature(strategy.configured).parameters
    for key, value in options.items():
        if key not in strategy.options and key not in checked and value not in (None, 1):
            takers = [s.name for s in STRATEGIES.values() if key in s.options]
            raise ValueError(f"{key}={value} applies to strategy "
                             f"{' or '.join(repr(t) for t in takers)} only: drop it, or use "
                             f"strategy={takers[0]!r}" if takers else
                             f"strategy {strategy.name!r} takes no option {key}")
    return strategy.configured(num_shards, q_heads, **options)
