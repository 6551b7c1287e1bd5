"""The strategy a run should use: every option the registered strategies offer on this mesh and
head count, priced as a whole step (planner/time.py) with its memory (the plan's total with the
ring's K/V buffers swapped for the strategy's), and the fastest whose total fits. One function,
`recommend`, serves both `parallel.strategy='auto'` (`resolve_on_device`, `auto_choice`, which
planner.resolve_run calls once for a run) and scripts/plan.py.

    resolve_on_device(config, (data, seq), platform, device, switches) -> AttentionChoice
        the configured choice, or for strategy='auto' the recommendation, with a line saying
        why (choice.why)
"""

from __future__ import annotations

import model
import parallel
from parallel import strategy_cost
from planner import memory, time
from planner.attention import choice_from_config
from planner.devices import Device
from planner.flops import flops_per_token
from planner.run import Run, make_run


def strategy_rows(m, run: Run, tiles, device: Device, efficiency: float, mask_documents: bool,
                  model_flops: float, documents, memory_total: float, ring_buffers: float):
    """step_time for every (strategy, degree) of parallel.strategy_cost.options on the run's
    layout, each with its memory verdict (None where the device's memory is unknown)."""
    rows = []
    for strategy, degree in strategy_cost.options(run.seq, m.num_heads):
        t = time.step_time(m, run, tiles, run.layout, device, efficiency, mask_documents,
                           model_flops, documents, strategy, degree)
        total = memory_total - ring_buffers + t["attention_layer"]["buffer_bytes"]
        rows.append(dict(t, memory=memory.fit(total, device) if device.memory_bytes else None))
    return rows


def recommend(rows: list[dict]) -> dict:
    """The fastest row whose memory fits (if none fits, the fastest of all); ties: the smaller
    buffers."""
    fitting = [r for r in rows if r["memory"] is None or r["memory"]["verdict"] != "does not fit"]
    best = min(fitting or rows, key=lambda r: (r["step_s"],
                                                r["attention_layer"]["buffer_bytes"]))
    return {"strategy": best["strategy"], "degree": best["degree"]}


def run_model(config, choice: parallel.AttentionChoice, switches=None):
    """The ModelConfig the planner prices: the config's model with the resolved attention and
    memory switches (model.MemorySwitches; needed where the config leaves them 'auto')."""
    return model.ModelConfig.from_config(config.model, choice, switches)


def strategy_table(config, run: Run, choice: parallel.AttentionChoice, device: Device,
                   efficiency: float = 1.0, documents=None, switches=None) -> dict:
    """{'rows', 'choice'}: every strategy priced for this run, and the recommendation."""
    m = run_model(config, choice, switches)
    acts = memory.activation_memory(m, run, choice.tiles)
    total = sum(memory.state_memory(m, run).values()) + sum(acts.values())
    model_flops = (flops_per_token(m, run.seq_len, segment_ids=documents)
                   * run.tokens_per_step)
    rows = strategy_rows(m, run, choice.tiles, device, efficiency,
                         bool(config.data.mask_documents), model_flops, documents, total,
                         acts["kv_ring_buffers"])
    return {"rows": rows, "choice": recommend(rows)}


def resolve_on_device(config, mesh_shape, platform: str, device: Device,
                      switches=None) -> parallel.AttentionChoice:
    """The run's attention on a (data, seq) mesh of `device`s (a planner device), with
    the run's memory switches (planner/switches.py) where the config leaves them 'auto'."""
    if config.parallel.strategy != "auto":
        return choice_from_config(config, mesh_shape[1], platform)
    return auto_choice(config, mesh_shape, platform, device, switches)


def auto_choice(config, mesh_shape, platform: str, device: Device,
                switches=None) -> parallel.AttentionChoice:
    """strategy='auto' resolved on a (data, seq) mesh of `device`s: the recommendation of
    `strategy_table`, one document per row (plan.py --documents refines it)."""
    run = make_run(config, mesh_shape[0] * mesh_shape[1], tuple(mesh_shape))
    ring = choice_from_config(config, mesh_shape[1], platform, "ring", None)
    table = strategy_table(config, run, ring, device, switches=switches)
    best, first = table["choice"], table["rows"][0]
    row = next(r for r in table["rows"] if (r["strategy"], r["degree"]) ==
               (best["strategy"], best["degree"]))
    name = parallel.get_strategy(best["strategy"]).label(best["degree"], mesh_shape[1])
    why = (f"auto -> {name}: predicted {row['step_s'] * 1e3:.3f} ms per step against the "
           f"ring's {first['step_s'] * 1e3:.3f} ms on {device.title}"
           f"{'' if device.calibration.source else ' (uncalibrated)'}")
    return choice_from_config(config, mesh_shape[1], platform, best["strategy"],
                              best["degree"], why=why)
