"""The planner's strategy table: every context-parallel strategy for the run's layout, its
predicted time per micro-step, traffic and memory, the recommendation (what
`parallel.strategy='auto'` takes), and, where the config file carries MEASURED step times
(configs/llama3_8b_v5p.py: MaxText's), those beside the predictions with where they disagree.

Formulas: parallel/strategy_cost.py (attention) plus plan_model.py's dense and optimizer terms.
"""

from __future__ import annotations

import ast

MEASURED_MATCH = 0.10  # a predicted ratio within 10% of the measured one "agrees"


def measured_times(filename: str, seq_len: int) -> dict | None:
    """The config file's module-level MEASURED[seq_len] (read, not executed), else None."""
    with open(filename) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "MEASURED" for t in node.targets)):
            return ast.literal_eval(node.value).get(seq_len)
    return None


def label(row: dict) -> str:
    """'ring', 'allgather', 'ulysses 64', 'usp 4x16' (u Ulysses x N/u ring)."""
    if row["strategy"] == "usp":
        return f"usp {row['degree']}x{row['run_seq'] // row['degree']}"
    if row["strategy"] == "ulysses":
        return f"ulysses {row['degree']}"
    return row["strategy"]


def format_strategies(plan: dict, run, measured: dict | None) -> list[str]:
    strategies = plan["strategies"]
    rows = [dict(r, run_seq=run.seq) for r in strategies["rows"]]
    per_micro = lambda r: (r["step_s"] - r["optimizer_s"]) / run.accum
    ring = per_micro(rows[0])
    lines = [f"Strategies ({run.layout} layout; time per micro-step of {run.rows} row(s), "
             "from parallel/strategy_cost.py + the dense terms above)",
             f"  {'strategy':<14}{'attention s':>12}{'micro-step s':>13}{'vs ring':>9}"
             f"{'sent/layer':>12}{'buffers':>10}{'memory':>15}"]
    for r in rows:
        a, mem = r["attention_layer"], r["memory"]
        memory = "-" if mem is None else f"{mem['share']:.0%} {mem['verdict']}"
        lines.append(f"  {label(r):<14}{r['attention_s'] / run.accum:>12.3f}"
                     f"{per_micro(r):>13.3f}{ring / per_micro(r):>8.2f}x"
                     f"{a['bytes_sent'] / 1e6:>10.1f}MB{a['buffer_bytes'] / 1e6:>8.1f}MB"
                     f"{memory:>15}")
    choice = strategies["choice"]
    best = next(r for r in rows if (r["strategy"], r["degree"]) == (choice["strategy"],
                                                                     choice["degree"]))
    flag = f"--config.parallel.strategy={choice['strategy']}"
    if choice["strategy"] == "usp":
        flag += f" --config.parallel.ulysses_degree={choice['degree']}"
    lines.append(f"  choose {label(best)} (fastest predicted that fits; what "
                 f"parallel.strategy='auto' takes): {flag}")
    if measured:
        lines += format_measured(rows, measured, per_micro)
    return lines


def format_measured(rows: list[dict], measured: dict, per_micro) -> list[str]:
    """Measured step times beside the predictions, as ratios to the ring (the batch behind the
    measurements is not known), and the verdict for each."""
    by_label = {label(r): per_micro(r) for r in rows}
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
