"""The attention a run should use where its config leaves it 'auto': every (strategy, degree)
the registered strategies offer on this mesh and head count, times every tile the kernel may
run (parallel.choice.tile_options), each priced as a whole step (planner/step_time.py: the critical
path in tiles, each tile's fixed cost and FLOPs, the hops) with its memory (the plan's total
with the ring's K/V buffers swapped for the strategy's), and the fastest whose total fits.
Small tiles balance the devices' work; each tile costs a fixed t0 besides its FLOPs, so large
ones run fewer: the time model weighs the two. `recommend` ranks the strategy table of
scripts/plan.py the same way.

    resolve_on_device(config, (data, seq), platform, device, switches)
        -> (AttentionChoice, candidates): the configured choice, or, for a strategy or tile
        left 'auto', the fastest, with a line saying why (choice.why), and what it weighed
"""

from __future__ import annotations

import dataclasses

import model
import parallel
from parallel import strategies
from planner import memory, step_time
from parallel.choice import AUTO, tile_options
from parallel.layouts import fitting_layouts
from parallel.strategies import BASELINE
from planner.attention import choice_from_config
from planner.devices import Device
from planner.flops import flops_per_token
from planner.run import Run, make_run


def strategy_rows(m, run: Run, choice, device: Device, efficiency: float, mask_documents: bool,
                  model_flops: float, documents, memory_total: float, ring_buffers: float):
    """step_time for every (strategy, degree) of parallel.strategies.options on the run's
    layout and the choice's tiles and exchanges, each with its memory verdict (None where the
    device's memory is unknown)."""
    rows = []
    for strategy, degree in strategies.options(run.seq, m.num_heads):
        t = step_time.step_time(m, run, choice.tiles, run.layout, device, efficiency,
                                mask_documents, model_flops, documents, strategy, degree,
                                **choice.exchanges())
        total = memory_total - ring_buffers + t["attention_layer"]["buffer_bytes"]
        rows.append(dict(t, memory=memory.fit(total, device) if device.memory_bytes else None))
    return rows


def rank(row: dict) -> tuple:
    """The order candidates are chosen in: those that fit first (if none fits, the fastest of
    all), then the fastest; ties: the smaller buffers, then the larger tile."""
    unfit = row["memory"] is not None and row["memory"]["verdict"] == "does not fit"
    return unfit, row["step_s"], row["attention_layer"]["buffer_bytes"], -row["tiles"][0]


def recommend(rows: list[dict]) -> dict:
    """The first row by `rank`: its strategy and degree."""
    best = min(rows, key=rank)
    return {"strategy": best["strategy"], "degree": best["degree"]}


def run_model(config, switches=None):
    """The ModelConfig the planner prices: the config's model with the resolved memory
    switches (model.MemorySwitches; needed where the config leaves them 'auto'); what the
    devices pass is the AttentionChoice's, priced beside it."""
    return model.ModelConfig.from_config(config.model, switches)


def strategy_table(config, run: Run, choice: parallel.AttentionChoice, device: Device,
                   efficiency: float = 1.0, documents=None, switches=None) -> dict:
    """{'rows', 'choice'}: every strategy priced for this run on the choice's layout and
    tiles, and the recommendation."""
    run = dataclasses.replace(run, layout=choice.layout)
    m = run_model(config, switches)
    acts = memory.activation_memory(m, run, choice.tiles, choice.mla_exchange)
    total = sum(memory.state_memory(m, run).values()) + sum(acts.values())
    model_flops = (flops_per_token(m, run.seq_len, segment_ids=documents)
                   * run.tokens_per_step)
    rows = strategy_rows(m, run, choice, device, efficiency,
                         bool(config.data.mask_documents), model_flops, documents, total,
                         acts["kv_ring_buffers"])
    return {"rows": rows, "choice": recommend(rows)}


def resolve_on_device(config, mesh_shape, platform: str, device: Device, switches=None,
                      documents=None) -> tuple[parallel.AttentionChoice, list[dict]]:
    """(the run's attention on a (data, seq) mesh of `device`s (a planner device), the
    candidates weighed for it, best first: none where the config sets the layout, the
    strategy and the tile), with the run's memory switches (planner/switches.py) where the
    config leaves them 'auto'; documents: segment ids [R, seq_len] of sample rows, natural
    order (None: one document a row)."""
    if not left_open(config):
        return choice_from_config(config, mesh_shape[1], platform), []
    return auto_choice(config, mesh_shape, platform, device, switches, documents)


def left_open(config) -> tuple[str, ...]:
    """What of the attention the config leaves to the planner: 'layout', 'strategy', 'tile'."""
    p = config.parallel
    return tuple(what for what, auto in (("layout", p.layout == AUTO),
                                         ("strategy", p.strategy == AUTO),
                                         ("tile", config.parallel.tiles is None)) if auto)


def attention_rows(config, run: Run, platform: str, device: Device, switches=None,
                   documents=None) -> list[dict]:
    """Every (layout, strategy with its degree, tile) the config leaves open, priced as a step
    (each fixed where the config gives it), each row with its "choice"."""
    p, seq = config.parallel, run.seq
    fixed = None if p.strategy == AUTO else choice_from_config(config, seq, platform,
                                                                tiles=(0, 0))
    given = config.parallel.tiles
    layouts = (fitting_layouts(run.seq_len, seq) if p.layout == AUTO else [p.layout])
    rows = []
    for layout in layouts:
        base = choice_from_config(config, seq, platform, BASELINE, None,
                                  tiles=given or (0, 0), layout=layout)
        tiles = [base.tiles] if given else tile_options(
            layout, parallel.resolve_kernel(base.kernel, platform), run.block, platform)
        for tile in tiles:
            choice = dataclasses.replace(base, tile_q=tile[0], tile_k=tile[1])
            table = strategy_table(config, run, choice, device, documents=documents,
                                   switches=switches)
            for row in table["rows"]:
                if fixed is None or (row["strategy"], row["degree"]) == (
                        fixed.strategy, fixed.ulysses_degree):
                    rows.append(dict(row, choice=dataclasses.replace(
                        choice, strategy=row["strategy"], ulysses_degree=row["degree"])))
    return rows


def auto_choice(config, mesh_shape, platform: str, device: Device, switches=None,
                documents=None) -> tuple[parallel.AttentionChoice, list[dict]]:
    """What the config leaves 'auto' (parallel.layout, parallel.strategy with its degree,
    parallel.tile) resolved on a (data, seq) mesh of `device`s: the fastest predicted step
    that fits, on the rows of `documents` (None: one document a row); ties go to the smaller
    buffers, then the larger tile. Returns it with every candidate, ranked so (the best
    first)."""
    run = make_run(config, mesh_shape[0] * mesh_shape[1], tuple(mesh_shape))
    rows = attention_rows(config, run, platform, device, switches, documents)
    ranked = sorted(rows, key=rank)
    best, slowest = ranked[0], max(rows, key=lambda r: r["step_s"])
    choice = best["choice"]
    why = (f"auto {' and '.join(left_open(config))} -> {choice.label()}: "
           f"predicted {best['step_s'] * 1e3:.3f} ms per step, fastest of {len(rows)} "
           f"(slowest {slowest['step_s'] * 1e3:.3f} ms) on {device.title}"
           f"{'' if device.calibration.source else ' (uncalibrated)'}")
    return dataclasses.replace(choice, why=why), ranked
