"""A sliding window's work and traffic: tiles outside the window are skipped, and with the ring
strategy the contiguous layouts receive a halo of about W keys per device instead of the ring's
N - 1 blocks (parallel/strategies/halo.py). Exactness of windows, sinks and soft caps in every
layout, strategy and kernel is in test_attention, test_strategies and test_attention_pallas."""

import dataclasses
import re

import numpy as np
import pytest

import parallel
import run_config
from parallel import cost
from parallel.mask import Mask
from parallel.strategies import halo
from tests.support.attention_cases import (assert_matches_reference, make_inputs, mesh_for,
                                           run_kernel)

N, BLOCK, TILE = 8, 64, 8
WINDOW = BLOCK // 4  # a quarter of a device's block


@pytest.mark.parametrize("layout,causal", [("ring", True), ("zigzag", True), ("ring", False),
                                           ("striped", True)])
def test_a_window_receives_its_halo_and_skips_the_tiles_outside(layout, causal):
    q, k, v, dout, seg = make_inputs(3, 1, 4, 2, seq_len=N * BLOCK)
    mesh = mesh_for(N, data=1)
    options = dict(mesh=mesh, layout=layout, causal=causal, window=WINDOW, tile_q=TILE,
                   tile_k=TILE)
    order = parallel.permutation(layout, N * BLOCK, N)
    _, tiles, received = parallel.attention_with_stats(q[:, order], k[:, order], v[:, order],
                                                       **options)
    # The kernels' counters are the cost model's count under the same mask ...
    mask = Mask(causal=causal, window=WINDOW)
    want = cost.placement_tile_counts(order, None, N, TILE, TILE, mask)
    np.testing.assert_array_equal(np.asarray(tiles), want)
    # ... which skips every tile the window leaves out: in contiguous runs, about W / TILE + 1
    # key tiles per query tile (each side), against the whole causal prefix without it; a
    # striped tile spans N times its length, so more of its tiles meet a window.
    full = cost.placement_tile_counts(order, None, N, TILE, TILE, causal)
    if layout == "striped":
        assert want.sum() < full.sum() / 2
    else:
        sides = 1 if causal else 2
        assert want.sum() <= (N * BLOCK // TILE) * sides * (WINDOW // TILE + 1)
        assert want.sum() < full.sum() / 4
    # Keys and values received per device: the halo the window reaches (a tile over W - 1 at
    # most, per chunk edge), or the whole ring for striped, whose windows span every device.
    edges = {"ring": 1, "zigzag": 2, "striped": None}[layout] if causal else 2
    if edges is None:
        np.testing.assert_array_equal(received, (N - 1) * BLOCK)
    else:
        assert received.max() <= edges * (WINDOW + TILE) and received.max() >= WINDOW - 1
        assert received.max() < (N - 1) * BLOCK / 10
    out, grads = run_kernel(q, k, v, dout, None, **options)
    assert_matches_reference(out, grads, q, k, v, None, causal, dout, window=WINDOW)


def test_the_ring_layout_receives_w_plus_one_tile_at_most():
    """The issue's figure: W a quarter of a device's block on 8 devices, the ring layout."""
    shifts = halo.plan(parallel.get_layout("ring"), N, BLOCK, Mask(True, WINDOW), TILE)
    assert [s.distance for s in shifts] == [1]  # only the previous device's edge
    got = halo.received_tokens(shifts, N, BLOCK)
    assert got[0] == 0 and (got[1:] <= WINDOW + TILE).all()


def test_no_halo_where_the_window_reaches_every_block():
    lay = parallel.get_layout
    assert halo.plan(lay("striped"), N, BLOCK, Mask(True, WINDOW), TILE) is None
    assert halo.plan(lay("ring"), N, BLOCK, Mask(True, None), TILE) is None
    assert halo.plan(lay("ring"), N, BLOCK, Mask(True, N * BLOCK), TILE) is None
    # A window over several blocks: the blocks it reaches, and only those.
    shifts = halo.plan(lay("ring"), N, BLOCK, Mask(True, 2 * BLOCK + 1), TILE)
    assert [s.distance for s in shifts] == [1, 2]


@pytest.mark.parametrize("window,causal,pairs", [(2, True, 1 + 2 + 2 + 2),
                                                 (2, False, 2 + 3 + 3 + 2),
                                                 (None, True, 10), (None, False, 16)])
def test_visible_pairs_of_a_window(window, causal, pairs):
    assert cost.visible_pair_count(4, Mask(causal, window)) == pairs


def test_a_bad_window_cap_or_sinks_is_one_line():
    q = np.zeros((1, 16, 2, 8), np.float32)
    mesh = mesh_for(2, data=1)
    for kwargs, words in ((dict(window=0), "window=0 must be a positive int"),
                          (dict(window=2.5), "window=2.5"),
                          (dict(logit_soft_cap=-1.0),
                           "logit_soft_cap=-1.0 must be a positive number"),
                          (dict(sinks=np.zeros(3, np.float32)), "sinks must be [q_heads] = (2,)"),
                          (dict(sinks=np.zeros(2, np.int32)), "sinks must be floats")):
        with pytest.raises(ValueError, match=re.escape(words)):
            parallel.attention(q, q, q, mesh=mesh, layout="ring", **kwargs)


def test_the_planner_prices_local_and_global_layers(tmp_path):
    """configs/gemma3_cpu.py (5 local : 1 global, window 128, blocks of 256 on 4 devices):
    local layers cost a fraction of a global one's tiles; with the ring strategy the ring and
    zigzag layouts receive their halos, not the other blocks; the model's FLOPs count the
    window; scripts/bench/window.py prints the table and the planner's choice."""
    import subprocess
    import sys

    from configs import gemma3_cpu
    from planner import flops
    from planner.reports import windows
    from planner.devices import DEVICES
    from tests.support.train_runs import ROOT, clean_env

    config = run_config.build(gemma3_cpu.get_config())
    rows = windows.kind_table(config, DEVICES["cpu"], 4)
    ring = {r["layout"]: r for r in rows if r["strategy"] == "ring"}
    for layout, halo_keys in (("ring", 128), ("zigzag", 2 * 128)):
        local = ring[layout]["kinds"]["local (window 128)"]
        glob = ring[layout]["kinds"]["global"]
        assert local["critical_path_tiles"] < glob["critical_path_tiles"] / 2
        assert local["kv_tokens"] <= halo_keys + 32 and glob["kv_tokens"] == 3 * 256
    assert ring["striped"]["kinds"]["local (window 128)"]["kv_tokens"] == 3 * 256
    assert windows.recommended(rows) in rows
    m = config.model
    full = dataclasses.replace(m, layer_types=())
    assert flops.flops_per_token(m, 1024) < flops.flops_per_token(full, 1024)
    out = subprocess.run([sys.executable, "scripts/bench/window.py",
                          "--config=configs/gemma3_cpu.py", f"--json={tmp_path / 'w.json'}"],
                         cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "planner's choice: layout" in out.stdout and (tmp_path / "w.json").exists()
