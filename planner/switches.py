"""The memory switches a run leaves 'auto' (model.remat, remat_policy, scan_layers, loss_chunk,
mlp_chunk, linear_chunk; run_config.schema.RUN_MODEL), resolved once before anything is built: every
combination of the values they may take, each priced by the planner (time:
planner/step_time.py; memory: the analytic total of planner/memory.py), and the fastest whose
memory fits. A value the config gives is never searched.

    resolve_switches(config, run, choice, device) -> (MemorySwitches, ranked candidates)

What 'fits' means here is stricter than the plan's verdict (90% of the device): the analytic
total at most AUTO_SHARE of the device's memory, since the compiled program holds more than the
formulas count where XLA keeps extra copies. Measured on 8 fake CPU devices at 1,048,576 tokens
(scripts/bench/memory.py; BENCHMARKS.md): the two candidates just above the budget compile to
1.13x and 1.24x their analytic totals (remat + scan + loss chunks: 2.96 GB against 2.63; scan +
both chunks, no remat: 3.40 against 2.75).

Rules the search follows:
  - Ties in predicted time go to fewer switches on, then less memory: a chunked loss and
    scanned layers cost nothing in the time model, so they are taken only when needed.
  - On XLA:CPU, remat without scan_layers saves almost nothing (its scheduler is not
    memory-aware and keeps every block's values: 10.22 -> 9.42 GB in BENCHMARKS.md), so where
    scan_layers is 'auto' remat comes with it there.
  - remat_policy 'attention' (each layer's attention output and lse kept: the backward does not
    run the attention forward again) costs b n H (d c + 4) bytes a layer and saves a forward's
    tiles and transfers, so where remat is needed and that fits it is usually the fastest.
  - remat_policy 'offload' (block inputs in host memory; TPU and GPU only) is ranked after every
    other candidate that fits: its host transfers are not in the time model.
  - When nothing fits, the candidate with the least memory, and the run line says so.
"""

from __future__ import annotations

import dataclasses
import itertools

from model.config import AUTO, MemorySwitches, ModelConfig
from model.mixers import recurrent_layers
from parallel.layouts.base import largest_divisor
from planner import memory, step_time
from planner.devices import Device
from planner.flops import flops_per_token
from planner.run import Run

AUTO_SHARE = 0.75  # of the device's memory, for the analytic total of an 'auto' candidate
# the largest chunk of each tried (a divisor of the block)
CHUNKS = {"loss_chunk": 4096, "mlp_chunk": 8192, "linear_chunk": 8192}


def given(model_cfg) -> dict:
    """The switches the config's model section (a ModelConfig, switches maybe 'auto') sets."""
    return {k: getattr(model_cfg, k) for k in MemorySwitches.fields()
            if getattr(model_cfg, k) != AUTO}


def all_given(model_cfg) -> MemorySwitches | None:
    """The switches when the config gives all five (nothing to search), else None."""
    values = given(model_cfg)
    return MemorySwitches(**values) if len(values) == len(MemorySwitches.fields()) else None


def candidates(model_cfg, block: int, platform: str) -> list[MemorySwitches]:
    """Every combination of the values the 'auto' switches may take (the given ones fixed)."""
    fixed = given(model_cfg)
    # sparse and dense blocks interleaved, or Gated DeltaNet and softmax layers: no stack
    mixed = model_cfg.moe.dense_prefix(model_cfg.num_layers) is None
    options = {
        "remat": [False, True],
        "remat_policy": ["nothing", "attention", "dots"] + ([] if platform == "cpu"
                                                             else ["offload"]),
        # a dense first few run before one stack
        "scan_layers": [False] if mixed else [False, True],
        **{name: [0] + [c for c in [largest_divisor(block, most)] if 0 < c < block]
           for name, most in CHUNKS.items()},
    }
    if not recurrent_layers(model_cfg):  # no Gated DeltaNet or Mamba2 layer to cut in pieces
        options["linear_chunk"] = [0]
    names = MemorySwitches.fields()
    found = []
    for values in itertools.product(*[[fixed[n]] if n in fixed else options[n] for n in names]):
        s = MemorySwitches(**dict(zip(names, values)))
        if not s.remat and "remat_policy" not in fixed and s.remat_policy != "nothing":
            continue  # the policy means nothing without remat: one candidate, not three
        if (platform == "cpu" and s.remat and not s.scan_layers
                and "scan_layers" not in fixed):
            continue  # XLA:CPU: remat saves memory only with the blocks scanned
        if s not in found:
            found.append(s)
    return found


def price(config, run: Run, choice, device: Device, switches: MemorySwitches,
          model_flops: float, documents=None) -> dict:
    """One candidate: predicted step seconds and analytic bytes per device."""
    m = ModelConfig.from_config(config.model, switches)
    total = (sum(memory.state_memory(m, run).values())
             + sum(memory.activation_memory(m, run, choice.tiles, choice.mla_exchange).values()))
    step = step_time.step_time(m, run, choice.tiles, choice.layout, device, 1.0,
                          bool(config.data.mask_documents), model_flops, documents,
                          choice.strategy, choice.ulysses_degree,
                          **choice.exchanges())["step_s"]
    budget = AUTO_SHARE * device.memory_bytes
    return {"switches": switches, "step_s": step, "total_bytes": total,
            "fits": not device.memory_bytes or total <= budget}


def resolve_switches(config, run: Run, choice, device: Device, documents=None):
    """(MemorySwitches, ranked): the fastest candidate that fits (module docstring), and every
    candidate priced, best first (what plan.py --explain prints)."""
    switches = candidates(config.model, run.block, device.platform)
    plain = ModelConfig.from_config(config.model, switches[0])
    model_flops = flops_per_token(plain, run.seq_len, segment_ids=documents) * run.tokens_per_step
    rows = [price(config, run, choice, device, s, model_flops, documents) for s in switches]
    on = lambda s: sum(bool(v) for k, v in dataclasses.asdict(s).items() if k != "remat_policy")
    rows.sort(key=lambda r: (not r["fits"], r["switches"].remat_policy == "offload",
                             r["step_s"] if r["fits"] else r["total_bytes"],
                             on(r["switches"]), r["total_bytes"]))
    return rows[0]["switches"], rows
