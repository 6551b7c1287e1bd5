"""What dominates a plan's memory, and the planner's model-size table: which of the 1B, 3B and 7B
shapes fit this run, with its memory options (model.loss_chunk, model.mlp_chunk, remat) and
without the chunked ones."""

from __future__ import annotations

import dataclasses

import model
from model import presets
from planner.devices import Device
from planner.memory import activation_memory, fit, param_counts, state_memory
from planner.run import Run


def dominant_terms(terms: dict, top: int = 3) -> list[tuple[str, float]]:
    """The `top` largest (name, share of the sum) of a dict of byte counts."""
    total = sum(terms.values()) or 1.0
    ranked = sorted(terms.items(), key=lambda kv: -kv[1])[:top]
    return [(name, bytes_ / total) for name, bytes_ in ranked]


def dominant_lines(plan: dict, m, run: Run) -> list[str]:
    """Which terms dominate the total, and the config switch that shrinks each one."""
    terms = {**plan["state_bytes"], **plan["activation_bytes"]}
    top = dominant_terms(terms)
    lines = ["  largest: " + ", ".join(f"{name.replace('_', ' ')} {share:.0%}"
                                       for name, share in top)]
    block = run.block
    advice = {"logits": (not m.loss_chunk and block > 1,
                         f"--config.model.loss_chunk={min(4096, max(block // 4, 1))}"),
              "swiglu": (not m.mlp_chunk, f"--config.model.mlp_chunk={min(8192, block)}"),
              "norms": (not m.remat, "--config.model.remat=True"),
              "attention_residuals": (not m.remat, "--config.model.remat=True")}
    flags_ = [advice[name][1] for name, _ in top if name in advice and advice[name][0]]
    if flags_:
        lines.append("  to shrink them: " + " ".join(dict.fromkeys(flags_)))
    return lines


SIZES = tuple(presets.SIZES)  # llama_1b, llama_3b, llama_7b (configs/gpu/<name>.py trains each)


def _shapes(name: str, config, resolved):
    """A ModelConfig with the shapes of preset `name` on accelerator precision and this run's
    memory options (tiles, chunks, remat policy, scan)."""
    section = {f.name: getattr(config.model, f.name) for f in dataclasses.fields(config.model)}
    section.update(presets.SIZES[name], **presets.ACCELERATOR_PRECISION)
    if len(section["layer_types"]) != section["num_layers"]:  # the run's per-layer kinds differ
        section["layer_types"] = ()  # Llama's: every layer full attention
    section["partial_rotary_factor"] = 1.0  # Llama's RoPE (a share may not fit its head_dim)
    return model.ModelConfig.from_config(section, resolved.switches)


def size_rows(config, device: Device, run: Run, resolved) -> list[dict]:
    """Per size: parameters, total bytes and verdict as configured (the run's resolved memory
    switches), and without chunks."""
    rows, tiles = [], resolved.attention.tiles
    for name in SIZES:
        m = _shapes(name, config, resolved)
        plain = dataclasses.replace(m, loss_chunk=0, mlp_chunk=0)
        totals = {}
        for label, shape in (("configured", m), ("unchunked", plain)):
            terms = {**state_memory(shape, run), **activation_memory(
                shape, run, tiles, resolved.attention.mla_exchange)}
            totals[label] = (fit(sum(terms.values()), device), dominant_terms(terms, 1)[0])
        rows.append({"name": name, "params": param_counts(m)["total"],
                     "configured": totals["configured"], "unchunked": totals["unchunked"]})
    return rows


def format_sizes(rows: list[dict], m, run: Run, unit) -> list[str]:
    """The table; m: the run's ModelConfig (its memory options head the table)."""
    if not rows:
        return []
    name, size = unit
    chunks = (f"loss_chunk {m.loss_chunk or 'off'}, mlp_chunk {m.mlp_chunk or 'off'}, "
              f"remat {'on' if m.remat else 'off'}")
    lines = [f"Model sizes at {run.block:,} tokens per device (analytic, {name} per device; "
             f"as configured: {chunks}; bf16 compute, fp32 params as configs/gpu/llama_*.py)",
             f"  {'shapes':<10}{'params':>8}  {'as configured':<22}{'largest term':<26}"
             "without loss/mlp chunks"]
    for r in rows:
        (f, (top, share)), (g, _) = r["configured"], r["unchunked"]
        lines.append(f"  {r['name']:<10}{r['params'] / 1e9:>7.2f}B  "
                     f"{f['total_bytes'] / size:>6.1f} {f['verdict'].upper():<15}"
                     f"{top.replace('_', ' ') + f' {share:.0%}':<26}"
                     f"{g['total_bytes'] / size:>6.1f} {g['verdict'].upper()}")
    return lines + [""]
