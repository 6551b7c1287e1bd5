"""parallel.strategy_cost (the planner's strategy table and 'auto') against hand-derived figures,
and parallel.strategy='auto' / parallel.ulysses_degree in a run config."""

import numpy as np
import pytest

from configs import default
from parallel import strategies, strategy_cost as sc
import parallel
from planner import resolve_run
from planner.recommend import recommend
from training.validate import ConfigError, validate_config

# One unit of everything: a tile costs 1 s of forward compute when F = 4 b tq tk d H = rate.
SHAPE = sc.LayerShape(rows=1, seq_len=64, num_shards=4, q_heads=4, kv_heads=2, head_dim=2,
                      itemsize=2, layout="striped", tiles=(4, 4))
TILE_FLOPS = 4 * 1 * 4 * 4 * 2 * 4


def network(link=1e30, collective=1e30, latency=0.0):
    return sc.Network(flops_per_s=TILE_FLOPS, link_bytes_per_s=link,
                      collective_bytes_per_s=collective, latency_s=latency)


def test_options_follow_the_mesh_and_heads():
    assert strategies.options(4, 4) == [("ring", 1), ("allgather", 1), ("usp", 2), ("ulysses", 4)]
    assert strategies.options(8, 4) == [("ring", 1), ("allgather", 1), ("usp", 2), ("usp", 4)]
    assert strategies.options(1, 4) == [("ring", 1), ("allgather", 1)]


def test_free_network_leaves_the_tile_counts():
    """With free links: striped's ring runs T(T+1)/2 tiles on each of N steps (T = 4 per block);
    allgather the same work without waiting (the busiest device: 40 tiles); ulysses the whole
    sequence's triangle (T = 16, 136 tiles), each tile over H / 4 heads: a quarter of a
    full-head tile's FLOPs."""
    ring = strategies.estimate(SHAPE, network(), "ring")
    assert ring["forward_s"] == 4 * 10 and ring["backward_s"] == 2 * 4 * 10
    gather = strategies.estimate(SHAPE, network(), "allgather")
    assert gather["forward_s"] == 40 and gather["backward_s"] == 80
    ulysses = strategies.estimate(SHAPE, network(), "ulysses", 4)
    assert ulysses["forward_s"] == 136 / 4 and ulysses["backward_s"] == 2 * 136 / 4


def test_transfers_and_latency_are_charged_where_they_cannot_overlap():
    """Link-bound ring: each forward hop costs KV / link + latency instead of its 10 s step;
    ulysses pays four all-to-alls of (u - 1) / u of its q, k, v, out on top of its compute."""
    b, n, h, d, p = 1, 16, 2, 2, 2
    kv = 2 * b * n * h * d * p  # 256 bytes
    slow = strategies.estimate(SHAPE, network(link=kv / 100.0, latency=1.0), "ring")
    assert slow["forward_s"] == pytest.approx(3 * 101 + 10)
    q = b * n * 4 * d * p
    ulysses = strategies.estimate(SHAPE, network(collective=1.0), "ulysses", 4)
    kv4 = 2 * b * n * 4 * d * p  # KV heads repeated from 2 to lcm(2, 4) = 4
    assert ulysses["forward_s"] == pytest.approx(136 / 4 + 0.75 * (q + kv4) + 0.75 * q)


def test_allgather_buffers_grow_with_the_sequence_the_rings_do_not():
    """At a fixed block per device, doubling N doubles allgather's buffers (O(S)); the ring's
    and usp's stay put (O(S / N))."""
    def buffers(strategy, shards, degree=1):
        shape = sc.LayerShape(rows=1, seq_len=16 * shards, num_shards=shards, q_heads=8,
                              kv_heads=8, head_dim=2, itemsize=2, layout="ring", tiles=(4, 4))
        return strategies.estimate(shape, network(), strategy, degree)["buffer_bytes"]
    assert buffers("allgather", 8) == 2 * buffers("allgather", 4)
    assert buffers("ring", 8) == buffers("ring", 4)
    assert buffers("usp", 8, 2) == buffers("usp", 4, 2)


def row(strategy, step_s, buffers, verdict="fits"):
    return {"strategy": strategy, "degree": 1, "step_s": step_s, "tiles": [4, 4],
            "attention_layer": {"buffer_bytes": buffers},
            "memory": None if verdict is None else {"verdict": verdict}}


def test_recommend_takes_the_fastest_that_fits():
    assert recommend([row("ring", 3, 10), row("allgather", 2, 100)])["strategy"] == "allgather"
    assert recommend([row("ring", 3, 10), row("allgather", 2, 100, "does not fit")]
                     )["strategy"] == "ring"
    assert recommend([row("ring", 3, 10, "does not fit"), row("allgather", 2, 100, "does not fit")]
                     )["strategy"] == "allgather"  # nothing fits: the fastest
    assert recommend([row("ring", 2, 10, None), row("allgather", 2, 100, None)]
                     )["strategy"] == "ring"  # a tie: the smaller buffers


def test_auto_resolves_to_a_registered_strategy_with_a_reason():
    """'auto' is resolved before anything is built: the choice names a real strategy (its
    degree where it has one), says why, and is the planner's recommendation for this run."""
    config = default.get_config()
    config.parallel.layout, config.parallel.tile = "striped", 32  # the strategy left 'auto'
    choice = resolve_run(config, (1, 4), "cpu", "cpu").attention
    assert choice.strategy in parallel.STRATEGIES
    assert (choice.strategy, choice.ulysses_degree) in strategies.options(4, config.model.num_heads)
    assert choice.why.startswith(f"auto strategy -> striped attention ({choice.strategy}")
    assert choice.kernel == "xla" and choice.tiles == (32, 32)
    config.parallel.strategy, config.parallel.ulysses_degree = "usp", 2
    configured = resolve_run(config, (1, 4), "cpu", "cpu").attention
    assert (configured.strategy, configured.ulysses_degree, configured.why) == ("usp", 2,
                                                                              "configured")


@pytest.mark.parametrize("strategy,degree,match", [
    ("usp", 0, "strategy 'usp' needs ulysses_degree"),
    ("usp", 3, "ulysses_degree=3 does not divide the 4 'seq' shards"),
    ("ring", 2, "ulysses_degree=2 applies to strategy 'usp' only"),
    ("usp_ring", 0, "parallel.strategy='usp_ring' is not a known strategy"),
])
def test_config_errors(strategy, degree, match):
    config = default.get_config()
    config.parallel.strategy, config.parallel.ulysses_degree = strategy, degree
    with pytest.raises(ConfigError, match=match):
        validate_config(config, 4, 1)


def test_auto_and_a_good_degree_validate():
    config = default.get_config()
    for strategy, degree in (("auto", 0), ("usp", 2), ("ulysses", 0), ("allgather", 0)):
        config.parallel.strategy, config.parallel.ulysses_degree = strategy, degree
        validate_config(config, 4, 1)


def test_a_tile_s_fixed_cost_is_paid_once_per_tile_and_never_divided_by_ulysses():
    """t = t0 + F / rate: the hand count of a free network's forward with t0 = 0.5 s a tile."""
    slow = sc.Network(flops_per_s=TILE_FLOPS, link_bytes_per_s=1e30,
                      collective_bytes_per_s=1e30, latency_s=0.0, tile_overhead_s=0.5)
    assert sc.tile_seconds(SHAPE, slow) == 1.5
    assert sc.tile_seconds(SHAPE, slow, head_share=1 / 4) == 0.75


def test_the_pallas_tpu_grid_pays_t0_per_row_and_head_on_every_tile_of_a_visited_pair():
    """The ring layout on 2 devices, T = 4 tiles a side, rows 1 x heads 4, t0 = 0.5 s: step 0,
    both diagonals (10 live tiles) walk all 16 tiles of their pair, 4 x 16 x 0.5 + 10 = 42 s;
    step 1, device 1's full pair, 4 x 16 x 0.5 + 16 = 48 s (device 0's pair is all masked:
    skipped whole). The xla kernel pays t0 once a live tile: 10 x 1.5 and 16 x 1.5."""
    import dataclasses
    shape = dataclasses.replace(SHAPE, seq_len=32, num_shards=2, layout="ring")
    tpu = parallel.KERNELS["pallas_tpu"].grid
    assert tpu == sc.TileGrid(per_head=True, every_tile=True)
    assert parallel.KERNELS["xla"].grid == sc.TileGrid()
    for grid, want in ((tpu, 42.0 + 48.0), (sc.TileGrid(), 1.5 * (10 + 16))):
        net = dataclasses.replace(network(), tile_overhead_s=0.5, grid=grid)
        assert strategies.estimate(shape, net, "ring")["forward_s"] == pytest.approx(want)


def test_auto_tile_weighs_each_tile_s_fixed_cost_against_balance():
    """parallel.tile='auto' (the default): free tiles -> the smallest option (the most
    balanced), costly ones -> the largest (the fewest), and in between the option with the
    least predicted step, checked against planner.step_time for every option."""
    import dataclasses

    from parallel.choice import tile_options
    from planner import recommend, step_time as planner_time
    from planner.devices import DEVICES
    from planner.run import make_run
    config = default.get_config()
    config.seq_len, config.global_batch_size, config.mesh.seq = 16384, 1, 2
    config.parallel.layout, config.parallel.strategy = "striped", "ring"
    cpu = DEVICES["cpu"]

    def on(t0):
        return dataclasses.replace(cpu, memory_bytes=64e9, calibration=dataclasses.replace(
            cpu.calibration, tile_overhead_s=t0))

    def pick(t0):
        return resolve_run(config, (1, 2), "cpu", "cpu", device=on(t0)).attention

    options = tile_options("striped", parallel.resolve_kernel("xla", "cpu"), 8192, "cpu")
    assert options[0] == (64, 64) and options[-1] == (512, 512)  # at most 128 tiles a side
    assert pick(0.0).tiles == options[0] and pick(1.0).tiles == options[-1]
    chosen = pick(10e-6)
    assert chosen.why.startswith("auto tile -> striped attention (ring strategy, xla kernel, "
                                 f"tiles {chosen.tile_q}x{chosen.tile_k}): predicted")
    run, device = make_run(config, 2, (1, 2)), on(10e-6)
    resolved = resolve_run(config, (1, 2), "cpu", "cpu", device=device)

    def step(tiles):
        m = recommend.run_model(config, resolved.switches)
        return planner_time.step_time(m, run, tiles, "striped", device, 1.0, True, 1.0)["step_s"]

    times = {tiles: step(tiles) for tiles in options}
    assert chosen.tiles == min(times, key=times.get)
    assert options[0] != chosen.tiles != options[-1], times  # an interior optimum at 10 us


def test_auto_layout_is_the_fastest_layout_and_tile_that_splits_the_length():
    """parallel.layout='auto' with the tile 'auto': every layout that splits the length
    weighed with every tile, the chosen the least predicted step; at a length zigzag cannot
    split (2N equal chunks), it is not weighed."""
    config = default.get_config()
    config.seq_len, config.global_batch_size, config.mesh.seq = 16384, 1, 2
    config.parallel.layout, config.parallel.strategy = "auto", "ring"
    resolved = resolve_run(config, (1, 2), "cpu", "cpu")
    weighed = resolved.attention_candidates
    assert {r["choice"].layout for r in weighed} == set(parallel.LAYOUTS)
    assert resolved.attention == weighed[0]["choice"]
    assert weighed[0]["step_s"] == min(r["step_s"] for r in weighed)
    assert resolved.auto_attention == ("layout", "tile")
    assert resolved.line().startswith("auto (layout, tile, remat") and \
        f"{resolved.attention.layout} attention (ring strategy" in resolved.line()
    # On packed documents (the corpus's rows, as the train loop passes them) the same
    # candidates are priced on those rows: fewer tiles than one causal document a row.
    rows = np.repeat(np.arange(16), 1024)[None].astype(np.int32)
    packed = resolve_run(config, (1, 2), "cpu", "cpu", documents=rows)
    by_choice = {r["choice"]: r["step_s"] for r in weighed}
    assert all(r["step_s"] < by_choice[r["choice"]] for r in packed.attention_candidates)
    config.seq_len, config.mesh.seq = 9, 3  # 3 blocks of 3: no 6 equal chunks for zigzag
    odd = resolve_run(config, (1, 3), "cpu", "cpu")
    assert {r["choice"].layout for r in odd.attention_candidates} == {"ring", "striped",
                                                                       "balanced"}
