"""The planner's time tables as text (scripts/plan.py prints them).

- Layouts: time per step for each layout with the ring strategy, and the choice of layout.
- Strategies: every context-parallel strategy for the run's layout, its predicted time per
  micro-step, traffic and memory, the recommendation (what `parallel.strategy='auto'` takes),
  and, where the config file carries MEASURED step times (configs/llama3_8b_v5p.py: MaxText's),
  those beside the predictions with where they disagree.

Formulas: each strategy's cost (parallel/strategies/) plus planner/time.py's dense and optimizer
terms.
"""

from __future__ import annotations

from planner.run import Run

MEASURED_MATCH = 0.10  # a predicted ratio within 10% of the measured one "agrees"


def format_time(plan: dict, m, run: Run, device) -> list[str]:
    eff = plan["efficiency"]
    at = "peak" if eff == 1 else f"{eff:.0%} of peak"
    lines = [f"Time per step at {at} (efficiency {eff:.2f}"
             f"{' = at peak' if eff == 1 else ''}: FLOP/s, links and HBM at that share of "
             "their nominal rates)",
             f"  compute {plan['peak_flops'] / 1e12:g} TFLOP/s bf16 per device; HBM "
             f"{device.hbm_bytes_per_s / 1e12:.2f} TB/s; ring hops overlap their step's compute",
             f"  {device.link_note}",
             f"  model FLOPs per step {plan['model_flops_per_step']:.3e} (training/flops.py"
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
    lines += [f"  {run.layout}: a hop's K/V take {hop['hop_transfer_s'] * 1e3:.2f} ms on the link, a "
              f"ring step >= {hop['hop_compute_s_min'] * 1e3:.2f} ms of compute; "
              f"{hop['comm_bound_forward_steps']} of {run.seq - 1} forward hops per layer are "
              "link-bound.",
              "  Not modelled: elementwise work (norms, RoPE, the loss's softmax), loop overheads, "
              "imperfect overlap."]
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
    """'ring', 'allgather', 'ulysses 64', 'usp 4x16' (u Ulysses x N/u ring)."""
    if row["strategy"] == "usp":
        return f"usp {row['degree']}x{num_shards // row['degree']}"
    if row["strategy"] == "ulysses":
        return f"ulysses {row['degree']}"
    return row["strategy"]


def format_strategies(plan: dict, run, measured: dict | None) -> list[str]:
    strategies = plan["strategies"]
    rows = strategies["rows"]
    per_micro = lambda r: (r["step_s"] - r["optimizer_s"]) / run.accum
    ring = per_micro(rows[0])
    lines = [f"Strategies ({run.layout} layout; time per micro-step of {run.rows} row(s), "
             "from parallel/strategy_cost.py + the dense terms above)",
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
    flag = f"--config.parallel.strategy={choice['strategy']}"
    if choice["strategy"] == "usp":
        flag += f" --config.parallel.ulysses_degree={choice['degree']}"
    lines.append(f"  choose {label(best, run.seq)} (fastest predicted that fits; what "
                 f"parallel.strategy='auto' takes): {flag}")
    if measured:
        lines += format_measured(rows, run.seq, measured, per_micro)
    return lines


def format_measured(rows: list[dict], num_shards: int, measured: dict,
                    per_micro) -> list[str]:
    """Measured step times beside the predictions, as ratios to the ring (the batch behind the
    measurements is not known), and the verdict for each."""
    by_label = {label(r, num_shards): per_micro(r) for r in rows}
    ring_measured, ring_predicted = measured["ring"], by_label["ring"]
    lines = ["  measured (config MEASURED) beside predicted, each as time / ring's time "
             f"(agrees: within {MEASURED_MATCH:.0%}):",
             f"    ring           measured {ring_measured:>7.2f} s (1.00)   predicted "
             f"{ring_predicted:>7.3f} s (1.00)   the reference; measured / predicted = "
             f"{ring_measured / ring_predicted:.2f}"]
    for name, seconds in measured.items():
        if name == "ring":
            continue
        want = seconds / ring_measured
        candidates = _usp_candidates(name, by_label) if name.startswith("usp") else [name]
        for cand in candidates:
            got = by_label[cand] / ring_predicted
            verdict = ("agrees" if abs(got - want) <= MEASURED_MATCH * want else
                       f"DISAGREES: predicted {'slower' if got > want else 'faster'}")
            lines.append(f"    {cand:<14} measured {seconds:>7.2f} s ({want:.2f})   predicted "
                         f"{by_label[cand]:>7.3f} s ({got:.2f})   {verdict}")
    return lines


def _usp_candidates(name: str, by_label: dict) -> list[str]:
    """'usp 16x4' -> both usp 16x4 and usp 4x16, whichever this table has."""
    a, b = name.split()[1].split("x")
    return [c for c in (f"usp {a}x{b}", f"usp {b}x{a}") if c in by_label]
