"""A new strategy is one file and one registry line: a toy one, defined here as its own file would
define it and registered with one line, runs exactly, passes the config checks, and the planner
prices it (and `strategy='auto'` picks it when its price is best) with no other edit."""

import numpy as np
import pytest

import parallel
import run_config
from configs import default
from parallel import strategies
from parallel.strategies import STRATEGIES, ring
from planner import resolve_run
from planner.recommend import strategy_table
from planner.run import make_run
from planner.devices import DEVICES
from training.validate import validate_config
from tests.support.attention_cases import (assert_matches_reference, make_inputs, mesh_for,
                                           run_kernel)


class HalfPriceRing(ring.Ring):
    """The ring's exchange, priced at half the ring's time: a stand-in for a faster schedule."""

    name = "half_price_ring"

    def cost(self, shape, net, degree, documents=None, step_counts=None):
        row = super().cost(shape, net, degree, documents, step_counts)
        return dict(row, forward_s=row["forward_s"] / 2, backward_s=row["backward_s"] / 2)


@pytest.fixture
def registered(monkeypatch):
    # The one registry line (parallel/strategies/__init__.py would list the module instead).
    monkeypatch.setitem(STRATEGIES, HalfPriceRing.name, HalfPriceRing())
    return HalfPriceRing.name


def test_it_runs_exactly(registered):
    mesh = mesh_for(4, data=1)
    q, k, v, dout, seg = make_inputs(0, 2, 4, 2, segments="packed")
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout="striped", causal=True,
                            tile_q=4, tile_k=4, strategy=registered)
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)


def test_the_planner_prices_it_and_auto_picks_it(registered):
    assert (registered, 1) in strategies.options(4, 4)
    config = default.get_config()
    config.parallel.strategy = registered
    validate_config(config, 4, 1)
    config = run_config.build(config)
    run = make_run(config, 4)
    resolved = resolve_run(config, (1, 4), "cpu", "cpu")
    choice = resolved.attention
    assert choice.strategy == registered
    rows = {r["strategy"]: r for r in strategy_table(config, run, choice, DEVICES["cpu"],
                                                     switches=resolved.switches)["rows"]}
    ring_layer, toy_layer = (rows[s]["attention_layer"] for s in ("ring", registered))
    assert toy_layer["seconds"] == pytest.approx(ring_layer["seconds"] / 2)
    config = run_config.replace(config, {"parallel.strategy": "auto"})
    assert resolve_run(config, (1, 4), "cpu", "cpu").attention.strategy == registered


def test_without_the_line_it_is_unknown():
    assert HalfPriceRing.name not in STRATEGIES
    with pytest.raises(ValueError, match="unknown attention strategy 'half_price_ring'"):
        parallel.get_strategy(HalfPriceRing.name)
    assert all(name != HalfPriceRing.name for name, _ in strategies.options(4, 4))
    np.testing.assert_equal(len(STRATEGIES), 4)
