"""The analytic plan of a run: parameters, memory term by term and its verdict, time per step for
every layout and every strategy, and the recommendation. scripts/plan.py prints it
(planner/reports/text.py), with training/analysis/aot.py's compiled figures beside it."""

from __future__ import annotations

import ast
import dataclasses

import parallel
from planner import memory, recommend, step_time
from planner.calibration import step_times
from planner.devices import DEVICES, Device, on_host
from planner.documents import describe_documents, sample_documents
from planner.flops import flops_per_token, peak_flops
from planner.resolve import resolve_run
from planner.run import Run, make_run, process_count
from planner.reports.sizes import size_rows


def plan_device(device_name: str, devices: int) -> Device:
    """The device table's entry; for fake CPU devices, the host's memory shared among them."""
    return on_host(DEVICES[device_name], devices)


def layout_tiles(config, choice, layout: str, block: int, platform: str):
    """The tiles `layout` would run with: the config's; for 'auto', the run's own where this
    layout's chunks take them (the layouts compared on the same tiles); else that layout's
    defaults."""
    if layout == choice.layout:
        return choice.tiles
    given = config.parallel.tiles
    if given is None:
        chunk = parallel.get_layout(layout).contiguous_run(block)
        if chunk % choice.tile_q == 0 and chunk % choice.tile_k == 0:
            return choice.tiles
    kernel = parallel.resolve_kernel(choice.kernel, platform)
    tile_q, tile_k = given or (0, 0)
    return parallel.choice.resolve_tiles(layout, kernel, block, parallel.choice.op_tile(tile_q),
                                         parallel.choice.op_tile(tile_k))


def analytic_plan(config, device: Device, run: Run, resolved, efficiency: float = 1.0,
                  documents=None) -> dict:
    """Every analytic figure: parameters, memory terms, fit, FLOPs and time per layout and per
    strategy; documents: segment ids [R, seq_len] of sample rows (None: one document per row);
    resolved: the run's planner.ResolvedRun."""
    choice, m = resolved.attention, resolved.model
    state = memory.state_memory(m, run)
    acts = memory.activation_memory(m, run, choice.tiles, choice.mla_exchange)
    total = sum(state.values()) + sum(acts.values())
    model_flops = (flops_per_token(m, run.seq_len, segment_ids=documents)
                   * run.tokens_per_step)  # as the loop's MFU counts them
    masked = bool(config.data.mask_documents)
    times = {layout: step_time.step_time(m, run, layout_tiles(config, choice, layout, run.block,
                                                         device.platform),
                                    layout, device, efficiency, masked, model_flops, documents,
                                    **choice.exchanges())
             for layout in _layouts_for(run)}
    return {"params": memory.param_counts(m), "state_bytes": state, "activation_bytes": acts,
            "fit": memory.fit(total, device), "tiles": list(choice.tiles),
            "host_offload_bytes": memory.host_offload_bytes(m, run),
            "model_flops_per_step": model_flops, "peak_flops": peak_flops(device.flops_key),
            "efficiency": efficiency, "time": times,
            "strategies": recommend.strategy_table(config, run, choice, device, efficiency,
                                                   documents, resolved.switches),
            "attention": choice.record(), "calibration": dataclasses.asdict(device.calibration),
            "resolved": resolved_record(resolved)}


def resolved_record(resolved) -> dict:
    """plan.py --json's "resolved": what the run would use, and the memory and attention
    candidates the planner weighed, best first."""
    return {**resolved.attention.record(), "switches": resolved.switches.record(),
            "auto_switches": list(resolved.auto_switches), "predicted_step_s": resolved.step_s,
            "predicted_bytes": resolved.bytes_per_device, "device_bytes": resolved.device_bytes,
            "candidates": [{"switches": r["switches"].record(), "step_s": r["step_s"],
                            "total_bytes": r["total_bytes"], "fits": r["fits"]}
                           for r in resolved.candidates],
            "attention_candidates": [
                {**r["choice"].record(), "step_s": r["step_s"],
                 "fits": None if r["memory"] is None else r["memory"]["verdict"] != "does not fit"}
                for r in resolved.attention_candidates]}


def make_plan(config, device_name: str, devices: int, efficiency: float = 1.0,
              documents: str | None = None, document_rows: int = 4,
              workdir: str = "runs/plan") -> tuple[dict, Device, Run, object]:
    """(plan, device, run, resolved) for `devices` devices of `device_name`; the config must
    have passed training.validate_config. resolved (a planner.ResolvedRun) is the run's, every
    'auto' resolved as the run would."""
    device, run = plan_device(device_name, devices), make_run(config, devices)
    segment_ids = sample_documents(config, documents, document_rows, workdir)
    resolved = resolve_run(config, (run.data, run.seq), device.platform, "", device=device,
                           documents=segment_ids)
    choice = resolved.attention
    run = dataclasses.replace(run, layout=choice.layout)  # 'auto' as resolved
    plan = analytic_plan(config, device, run, resolved, efficiency, segment_ids)
    plan.update(device=device_name, device_spec=dataclasses.asdict(device),
                processes=process_count(device, devices), run=dataclasses.asdict(run),
                documents=describe_documents(documents, segment_ids), why=choice.why)
    plan["sizes"] = ([] if device_name == "cpu" else  # the model-size table: accelerators only
                     size_rows(config, device, run, resolved))
    return plan, device, run, resolved


def measured_times(filename: str, layout: str, seq_len: int) -> dict | None:
    """The published step times of config file `filename`'s setting at this layout and length
    (planner/calibration/step_times/), else None."""
    table = step_times.for_config(filename)
    return table.measured.get(layout, {}).get(seq_len) if table else None


def module_constant(filename: str, name: str):
    """A config file's module-level `name = <literal>` (read, not executed), else None."""
    with open(filename) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == name for t in node.targets)):
            return ast.literal_eval(node.value)
    return None


def _layouts_for(run: Run) -> list[str]:
    """Layouts this sequence length allows (zigzag needs seq_len % 2N == 0)."""
    def allowed(layout):
        try:
            parallel.check_divisible(layout, run.seq_len, run.seq)
            return True
        except ValueError:
            return False
    return [layout for layout in parallel.LAYOUTS if allowed(layout)]


def today_scenarios(plan: dict, config, resolved, device: Device, as_built: dict) -> dict:
    """Totals for the program as it is: the optimizer state as built (training/analysis/aot.py measures
    it from its shardings), then also every layer's gathered weights and full gradient alive
    at once."""
    m = resolved.model
    design = plan["fit"]["total_bytes"]
    opt_added = as_built["optimizer_state"] - plan["state_bytes"]["optimizer_state"]
    gather_added = memory.gather_all_bytes(m) - plan["state_bytes"]["fsdp_gather"]
    first = dict(memory.fit(design + opt_added, device), added_bytes=opt_added)
    second = dict(memory.fit(design + opt_added + gather_added, device), added_bytes=gather_added)
    return {"optimizer_as_built": first, "gather_all": second}
