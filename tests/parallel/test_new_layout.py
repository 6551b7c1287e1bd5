"""A new layout is one file and one registry line: a toy one, defined here as its own file would
define it (a file in parallel/layouts/) and registered with one line, lays rows out and back, runs
exactly against float64, passes the config checks, and the planner prices it and `layout='auto'`
weighs it, with no other edit."""

import numpy as np
import pytest

import parallel
import run_config
from configs import default
from parallel.layouts import LAYOUTS, fitting_layouts
from parallel.layouts.base import Layout
from planner import resolve_run
from planner.devices import DEVICES
from planner.recommend import attention_rows
from planner.run import make_run
from training.validate import validate_config
from tests.support.attention_cases import (assert_matches_reference, make_inputs, mesh_for,
                                           run_kernel)


class MirroredStriped(Layout):
    """Striped with the devices in the other order: shard d holds tokens N-1-d, 2N-1-d, ..."""

    name = "mirrored_striped"

    def positions(self, shard, block, num_shards, xp=np):
        return (xp.arange(block, dtype=np.int32) * num_shards + (num_shards - 1 - shard)
                ).astype(np.int32)


@pytest.fixture
def registered(monkeypatch):
    # The one registry line (parallel/layouts/__init__.py would list the module instead).
    monkeypatch.setitem(LAYOUTS, MirroredStriped.name, MirroredStriped())
    return MirroredStriped.name


def test_it_lays_rows_out_and_back(registered):
    perm = parallel.permutation(registered, 8, 2)
    np.testing.assert_array_equal(perm, [1, 3, 5, 7, 0, 2, 4, 6])
    inverse = parallel.inverse_permutation(registered, 8, 2)
    np.testing.assert_array_equal(perm[inverse], np.arange(8))


@pytest.mark.parametrize("segments", [None, "packed"])
def test_it_runs_exactly(registered, segments):
    mesh = mesh_for(4, data=1)
    q, k, v, dout, seg = make_inputs(0, 2, 4, 2, segments=segments)
    out, grads = run_kernel(q, k, v, dout, seg, mesh=mesh, layout=registered, causal=True,
                            tile_q=4, tile_k=4)
    assert_matches_reference(out, grads, q, k, v, seg, True, dout)


def test_the_config_checks_take_it_and_the_planner_weighs_it(registered):
    assert registered in fitting_layouts(1024, 4)
    config = default.get_config()
    config.parallel.layout = registered
    validate_config(config, 4, 1)
    resolved = resolve_run(run_config.build(config), (1, 4), "cpu", "cpu")
    assert resolved.attention.layout == registered
    config.parallel.layout = "auto"
    config = run_config.build(config)
    rows = attention_rows(config, make_run(config, 4), "cpu", DEVICES["cpu"],
                          switches=resolved.switches)
    priced = {row["choice"].layout for row in rows}
    assert registered in priced and priced >= {"ring", "striped", "zigzag"}


def test_without_the_line_it_is_unknown():
    assert MirroredStriped.name not in LAYOUTS
    with pytest.raises(ValueError, match="unknown attention layout 'mirrored_striped'"):
        parallel.permutation(MirroredStriped.name, 8, 2)
