"""The planner's time tables as text (scripts/plan.py prints them).

- Layouts: time per step for each layout with the ring strategy, and the choice of layout.
- Strategies: every context-parallel strategy for the run's layout, its predicted time per
  micro-step, traffic and memory, the recommendation (what `parallel.strategy='auto'` takes),
  and, where the config's setting has published step times (planner/calibration/step_times/:
  MaxText's for configs/tpu/llama3_8b_v5p.py), those beside the predictions with where they
  disagree.

Formulas: each strategy's cost (parallel/strategies/) plus planner/step_time.py's dense and
optimizer terms.
"""

from __future__ import annotations

from parallel import get_strategy
from planner.run import Run

AGREES = (0.8, 1.25)  # predicted / measured step time counted as agreeing


def format_time(plan: dict, m, run: Run, device) -> list[str]:
    eff, cal = plan["efficiency"], device.calibration
    scaled = "" if eff == 1 else f", x {eff:.2f} (--efficiency)"
    if cal.source:
        how = (f"calibrated to {cal.source}: matmuls at {cal.matmul_efficiency:.0%} and "
               f"attention at {cal.attention_efficiency:.0%} of peak, {cal.hop_exposed:.0%} of "
               f"each ring hop's transfer exposed, {cal.ring_step_s * 1e6:g} us a step{scaled}")
    else:
        how = f"uncalibrated: at the nominal rates, transfers hidden behind compute{scaled}"
    lines = [f"Time per step ({how})",
             f"  compute {plan['peak_flops'] / 1e12:g} TFLOP/s bf16 per device at peak; HBM "
             f"{device.hbm_bytes_per_s / 1e12:.2f} TB/s",
             f"  {device.link_note}",
             f"  model FLOPs per step {plan['model_flops_per_step']:.3e} (planner/flops.py"
             f"{'; the remat recompute adds one forward, not counted' if m.remat else ''}"
             f"{'; attention counts each document' if plan['documents'] else ''})",
             *format_documents(plan["documents"]),
             f"  {'layout':<9}{'tile':>11}{'T':>6}{'path tiles':>12}{'doc eff':>8}"
             f"{'attention s':>13}{'dense s':>10}{'optim s':>9}{'step s':>9}{'tokens/s':>11}"
             f"{'MFU':>6}{'vs ring':>9}"]
    ring = plan["time"].get("ring", {}).get("step_s")
    for layout, t in plan["time"].items():
        a = t["attention_layer"]
        speed = f"{ring / t['step_s']:.2f}x" if ring else "-"
        eff = a["document_efficiency"]
        lines.append(f"  {layout:<9}{t['tiles'][0]:>5}x{t['tiles'][1]:<5}"
                     f"{a['tiles_per_side']:>6.0f}{a['critical_path_tiles']:>12,.0f}"
                     f"{'-' if eff is None else f'{eff:.2f}':>8}{t['attention_s']:>13.3f}"
                     f"{t['dense_s']:>10.3f}{t['optimizer_s']:>9.3f}{t['step_s']:>9.3f}"
                     f"{t['tokens_per_s']:>11,.0f}{t['mfu']:>6.0%}{speed:>9}")
    best = min(plan["time"], key=lambda layout: plan["time"][layout]["step_s"])
    others = [t["step_s"] for layout, t in plan["time"].items() if layout != best]
    margin = f", {min(others) / plan['time'][best]['step_s']:.2f}x the next" if others else ""
    lines.append(f"  choose {best} (fastest predicted{margin}): "
                 f"--config.parallel.layout={best}")
    hop = plan["time"][run.layout]["attention_layer"]
    lines += [f"  {run.layout}: a hop's K/V take {hop['hop_transfer_s'] * 1e3:.2f} ms on the link, "
              f"a "
              f"ring step >= {hop['hop_compute_s_min'] * 1e3:.2f} ms of compute; "
              f"{hop['comm_bound_forward_steps']} of {run.seq - 1} forward hops per layer are "
              "link-bound.",
              "  Not modelled: elementwise work (norms, RoPE, the loss's softmax) beyond what a "
              "calibration absorbs."]
    dense = plan["time"][run.layout]["dense"]
    if dense.get("expert_exchange_bytes"):
        how = "ragged" if m.moe.ragged_exchange else "padded slots"
        lines.append(f"  experts over {m.moe.expert_devices} devices: the all-to-alls ({how}) send "
                     f"{dense['expert_exchange_bytes'] / 1e6:,.1f} MB a device per micro-step "
                     f"({dense['expert_exchange_s']:.3f} s, in dense s; planner/step_time.py "
                     "expert_exchange_bytes)")
    return lines


def format_documents(docs: dict | None) -> list[str]:
    if docs is None:
        return ["  documents: one per row (--documents samples packed rows; doc eff needs it)"]
    return [f"  documents: {docs['spec']}, {docs['rows']} sample row(s), {docs['documents']:,} "
            f"documents, mean {docs['mean_tokens']:,.0f} / median {docs['median_tokens']:,.0f} / "
            f"max {docs['max_tokens']:,} tokens; path tiles are the mean row's",
            "  doc eff = tiles one device computes on the whole row / N / critical path (1.0: "
            "N devices share one device's work evenly)"]


def label(row: dict, num_shards: int) -> str:
    """'ring', 'allgather', 'ulysses 64', 'usp 4x16' (u Ulysses x N/u ring): each strategy's
    own label."""
    return get_strategy(row["strategy"]).label(row["degree"], num_shards)


def format_strategies(plan: dict, run, measured: dict | None) -> list[str]:
    strategies = plan["strategies"]
    rows = strategies["rows"]
    per_micro = lambda r: (r["step_s"] - r["optimizer_s"]) / run.accum
    ring = per_micro(rows[0])
    lines = [f"Strategies ({run.layout} layout; time per micro-step of {run.rows} row(s): each "
             "strategy's own cost (parallel/strategies/) + the dense terms above)",
             f"  {'strategy':<14}{'attention s':>12}{'micro-step s':>13}{'vs ring':>9}"
             f"{'sent/layer':>12}{'buffers':>10}{'memory':>15}"]
    for r in rows:
        a, mem = r["attention_layer"], r["memory"]
        memory = "-" if mem is None else f"{mem['share']:.0%} {mem['verdict']}"
        lines.append(f"  {label(r, run.seq):<14}{r['attention_s'] / run.accum:>12.3f}"
                     f"{per_micro(r):>13.3f}{ring / per_micro(r):>8.2f}x"
                     f"{a['bytes_sent'] / 1e6:>10.1f}MB{a['buffer_bytes'] / 1e6:>8.1f}MB"
                     f"{memory:>15}")
    choice = strategies["choice"]
    best = next(r for r in rows if (r["strategy"], r["degree"]) == (choice["strategy"],
                                                                     choice["degree"]))
    options = get_strategy(choice["strategy"]).option_values(choice["degree"])
    flag = " ".join([f"--config.parallel.strategy={choice['strategy']}"]
                    + [f"--config.parallel.{k}={v}" for k, v in options.items()])
    lines.append(f"  choose {label(best, run.seq)} (fastest predicted that fits; what "
                 f"parallel.strategy='auto' takes): {flag}")
    if measured:
        lines += format_measured(rows, run.seq, measured)
    return lines


def format_measured(rows: list[dict], num_shards: int, measured: dict) -> list[str]:
    """Measured step times beside the predictions (the same batch: the config carries the
    measured setup), predicted / measured for each, and the fastest of each."""
    by_label = {label(r, num_shards): r["step_s"] for r in rows}
    lines = [f"  measured (planner/calibration/step_times/) beside predicted (agrees: "
             f"predicted / measured in {AGREES[0]}-{AGREES[1]}):"]
    for name, seconds in measured.items():
        if name not in by_label:
            lines.append(f"    {name:<14} measured {seconds:>7.2f} s   not an option of this mesh")
            continue
        ratio = by_label[name] / seconds
        verdict = "agrees" if AGREES[0] <= ratio <= AGREES[1] else "DISAGREES"
        lines.append(f"    {name:<14} measured {seconds:>7.2f} s   predicted "
                     f"{by_label[name]:>7.3f} s"
                     f"   predicted / measured {ratio:.2f}   {verdict}")
    shared = [n for n in measured if n in by_label]
    if shared:
        want = min(shared, key=measured.get)
        got = min(shared, key=by_label.get)
        kind = lambda name: name.split()[0]  # 'usp' of 'usp 4x16'
        lines.append(f"    fastest of these: measured {want}, predicted {got}: the same "
                     f"{'option' if want == got else 'strategy' if kind(want) == kind(got) else ''}"
                     f"{'' if kind(want) == kind(got) else 'DISAGREES'}")
    return lines
