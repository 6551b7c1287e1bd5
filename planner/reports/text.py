"""The planner's plan as text: memory, compiled memory, time per layout, strategies and notes
(what scripts/plan.py prints)."""

from __future__ import annotations

from parallel.strategies import get_strategy
from parallel.recurrent import RECURRENT_STRATEGIES
from planner.memory import GB
from planner.switches import AUTO_SHARE
from planner.reports.time_text import format_strategies, format_time
from planner.run import Run, process_block
from planner.reports.sizes import dominant_lines, format_sizes


def _unit(largest: float) -> tuple[str, float]:
    """The unit a memory table is printed in: GB, MB or KB (decimal), by its largest figure."""
    for name, size in (("GB", GB), ("MB", 1e6)):
        if largest >= size:
            return name, size
    return "KB", 1e3


def _count(x: float) -> str:
    """1.10B, 3.4M, 139,584."""
    return f"{x / 1e9:.2f}B" if x >= 1e9 else f"{x / 1e6:.1f}M" if x >= 1e7 else f"{x:,.0f}"


def format_memory(plan: dict, m, run: Run, unit) -> list[str]:
    name, size = unit
    b, n = run.rows, run.block
    every = "one layer" if m.remat else f"{m.num_layers} layers"
    act_labels = {
        "block_inputs": (f"block inputs (remat): {m.num_layers} x [{b}, {n:,}, {m.d_model}] "
                         f"{m.dtype}" if m.remat_policy != "offload" else
                         f"block inputs (offloaded to host): 2 x [{b}, {n:,}, {m.d_model}] in "
                         f"HBM"),
        "norms": f"RMSNorm input, output, fp32 1/rms ({every})",
        "swiglu": (f"SwiGLU gate, up, silu, product ({every})" if not m.mlp_chunk else
                   f"SwiGLU: one chunk of {m.mlp_chunk:,} tokens recomputed"),
        "experts": f"expert layers: each token's top-k copies, hidden values, outputs ({every})",
        "expert_exchange": "expert exchange: one layer's pair slots sent, received, returned",
        "attention_residuals": f"attention residuals q, k, v, out, lse, RoPE ({every})",
        "attention_outputs": (f"attention out, fp32 lse kept by remat_policy 'attention' "
                              f"({m.num_layers} layers)"),
        "dot_outputs": f"matmul outputs kept by remat_policy 'dots' ({m.num_layers} layers)",
        "kv_ring_buffers": "KV ring buffers: K, V, fp32 dK, dV, x2 in flight",
        "kernel_accumulators": "kernel accumulators: fp32 dQ, D",
        "recurrent_layers": f"recurrent layers: inputs, q/k/v, chunk residuals ({every})",
        "tile_scratch": f"tile scratch: 3 fp32 [{b}, {m.num_heads}, {plan['tiles'][0]}, "
                        f"{plan['tiles'][1]}]",
        "final_norm": "final RMSNorm saved values",
        "embedding_ids": "embedding lookup: every device's token ids (int32)",
        "logits": (f"loss in chunks of {m.loss_chunk:,}: dx, fp32 dW, one chunk's logits"
                   if m.loss_chunk else
                   f"loss: dx, fp32 dW, logits [{b}, {n:,}, {m.vocab_size}] fp32 while it runs"),
    }
    s, f = plan["state_bytes"], plan["fit"]

    def row(label, x, indent=2):
        return f"{' ' * indent}{label:<{60 - indent}}{x / size:9.2f}"

    lines = [f"Memory per device (analytic, {name}; FSDP over {run.devices} devices)",
             row(f"parameters ({m.param_dtype})", s["parameters"]),
             row("optimizer state (AdamW mu, nu)", s["optimizer_state"]),
             row("gradients" + (" + accumulator" if run.accum > 1 else ""), s["gradients"]),
             row("FSDP: one gathered layer + its gradient", s["fsdp_gather"]),
             "  activations:"]
    lines += [row(act_labels[k], v, 4) for k, v in plan["activation_bytes"].items() if v]
    lines.append(row("total (design: FSDP, one layer gathered at a time)", f["total_bytes"])
                 + f"  of {f['device_bytes'] / size:,.0f} {name}: {f['verdict'].upper()} "
                 f"({f['share']:.0%} of it; headroom {f['headroom_bytes'] / size:,.1f} {name})")
    if plan["host_offload_bytes"]:
        lines.append(f"  host memory (remat_policy 'offload': {m.num_layers} block inputs)"
                     f"{plan['host_offload_bytes'] / size:>14.2f}  per device")
    return lines + dominant_lines(plan, m, run)


def format_as_built(plan: dict, unit) -> list[str]:
    """The design's total with the optimizer state as create_train_state really shards it."""
    name, size = unit
    design, opt = plan["state_bytes"]["optimizer_state"], plan["as_built"]["optimizer_state"]
    f = plan["today"]["optimizer_as_built"]
    if abs(opt - design) <= 0.01 * max(design, 1.0):
        return [f"  optimizer state as create_train_state builds it: {opt / size:.2f} {name}, "
                "sharded as planned"]
    return [f"  {'as the code runs today: AdamW state not sharded (note 1)':<58}"
            f"{f['total_bytes'] / size:9.2f}  ({f['added_bytes'] / size:+,.2f}): "
            f"{f['verdict'].upper()} ({f['share']:.0%})"]


def format_notes(plan: dict, unit, scan_layers: bool = False) -> list[str]:
    name, size = unit
    notes = []  # each note its lines, numbered below in the order they stand
    if plan["as_built"]["optimizer_state"] > 1.01 * plan["state_bytes"]["optimizer_state"]:
        notes.append(["the optimizer state that training.loop.create_train_state builds is not "
                      "sharded like the parameters",
                      "(AdamW's mu and nu replicated on every device): check that it still uses "
                      "training.optim.optimizer_shardings."])
    g = plan["today"]["gather_all"]
    if scan_layers:
        notes.append(["model.scan_layers: the blocks run in one lax.scan, so even XLA:CPU's "
                      "schedule (not memory-aware) holds one",
                      "layer's gathered weights and activations at a time "
                      "(scripts/bench/memory.py)."])
    else:
        notes.append(["XLA:CPU's compile of this step (--compile yes) is not memory-aware: its "
                      "temporaries come out (nearly)",
                      "the same with remat on and off, and grow by 2 x one layer's float32 "
                      "weights per layer (every layer's",
                      "gathered weights and full gradient alive). If XLA:GPU/TPU did that too, "
                      f"on top of today's total: {g['added_bytes'] / size:+,.2f} {name}",
                      f"-> {g['total_bytes'] / size:,.2f} {name}, {g['verdict'].upper()}. Check "
                      "on the accelerator: jitted.lower(...).compile().memory_analysis()."])
    lines = ["Notes:"]
    for number, note in enumerate(notes, 1):
        lines += [f"  {number}. {note[0]}"] + [f"     {line}" for line in note[1:]]
    return lines


def format_compiled(plan: dict, run: Run, unit, scan_layers: bool = False) -> list[str]:
    name, size = unit
    c = plan["compiled"]
    if c.get("topology"):
        return _format_tpu_compiled(plan, unit)
    if c.get("pending"):  # scripts/plan.py prints these tables first, then compiles
        return [f"TPU compiler (XLA:TPU + Mosaic) for {c['pending']}: compiles after these "
                f"tables; its figures follow them"]
    head = f"Compiled train step (XLA:CPU, {run.devices} fake devices, per device): "
    if "total" not in c:
        return [head + c["status"]]
    ratio = plan["fit"]["total_bytes"] / c["total"]
    return [head + f"compiled in {c['compile_s']:.0f} s",
            f"  arguments {c['argument'] / size:.2f} {name}, outputs {c['output'] / size:.2f} "
            f"(aliased with the donated state {c['alias'] / size:.2f}), temporaries "
            f"{c['temp'] / size:.2f}: total {c['total'] / size:.2f} {name}",
            f"  analytic (design) / compiled = {ratio:.2f}; XLA:CPU's schedule "
            + ("holds one layer at a time only under scan_layers" if scan_layers else
               "ignores remat") + " (note 2): a cross-check, not the accelerator's figure"]


def format_tpu_compiled(plan: dict) -> str:
    """The TPU compiler's figures alone (printed once it has compiled, after format_plan)."""
    return "\n".join(_format_tpu_compiled(plan, _unit(plan["fit"]["total_bytes"])))


def _format_tpu_compiled(plan: dict, unit) -> list[str]:
    name, size = unit
    c, hbm = plan["compiled"], plan["fit"]["device_bytes"]
    host = (f"; host memory {c['host_total'] / size:.2f} {name} (temporaries "
            f"{c['host_temp'] / size:.2f})" if c["host_total"] else "; no host memory")
    verdict = "FITS" if c["fits"] else "DOES NOT FIT"
    return [f"TPU compiler (XLA:TPU + Mosaic) for {c['topology']}, per chip: compiled in "
            f"{c['step_compile_s']:.0f} s ({c['compile_s']:.0f} s with the state)",
            f"  arguments {c['argument'] / size:.2f} {name}, outputs {c['output'] / size:.2f} "
            f"(aliased with the donated state {c['alias'] / size:.2f}), temporaries "
            f"{c['temp'] / size:.2f}{host}",
            f"  total {c['total'] / size:.2f} of {hbm / size:.2f} {name} HBM "
            f"({c['total'] / hbm:.0%}): {verdict}; the planner's analytic figure "
            f"{plan['fit']['total_bytes'] / size:.2f} {name} "
            f"(analytic / compiled = {plan['fit']['total_bytes'] / c['total']:.2f})"] + [
        f"  ring loop transfers, {pass_}: {text} (behind the step's kernel call or not, in "
        f"the compiler's schedule)" for pass_, text in c.get("transfers", {}).items()]


def format_plan(plan: dict, config, resolved, device, run: Run) -> str:
    """resolved: the run's planner.ResolvedRun."""
    choice, m = resolved.attention, resolved.model
    pc = plan["params"]
    rows, columns = process_block(run, plan["processes"])
    head = [f"ringstripe plan: {plan['config_file']} on {run.devices} x {device.title} "
            f"({plan['device']}, {plan['processes']} process(es))",
            f"  model  {_count(pc['total'])} parameters: d_model {m.d_model}, {m.num_layers} "
            f"layers, {_heads(m, choice.mla_exchange)}, mlp {m.mlp_dim}, "
            + (f"{len(m.sparse_layers)} expert layers of {m.moe.num_experts} x "
               f"{m.expert_mlp_dim}, {m.moe.top_k} a token ({_count(pc['active'])} active), "
               f"over {m.moe.expert_devices} device(s), " if m.sparse_layers else "")
            + f"vocab {m.vocab_size}; {m.dtype} compute, {m.param_dtype} params, remat "
            f"{'on (keeps ' + m.remat_policy + ')' if m.remat else 'off'}"
            f"{', scan_layers' if m.scan_layers else ''}; loss_chunk {m.loss_chunk or 'off'}, "
            f"mlp_chunk {m.mlp_chunk or 'off'}",
            f"  run    {run.global_batch} x {run.seq_len:,} = {run.tokens_per_step:,} tokens per "
            f"step; mesh data {run.data} x seq {run.seq}; {run.block:,} tokens per device per "
            f"sequence; {run.rows} row(s) per device per micro-step (grad_accum_steps "
            f"{run.accum}); {run.layout} attention",
            f"  hosts  each of {plan['processes']} process(es) builds {rows} row(s) x "
            f"{columns:,} laid-out columns of every batch (a row may span hosts)",
            f"  attention  {choice.label()}: {plan['why']}"]
    if resolved.line():
        head.append(f"  auto   {resolved.line()}")
    head.append("")
    unit = _unit(plan["fit"]["total_bytes"])
    body = (format_memory(plan, m, run, unit) + format_as_built(plan, unit) + [""]
            + format_sizes(plan["sizes"], m, run, unit)
            + format_compiled(plan, run, unit, m.scan_layers) + [""]
            + format_time(plan, m, run, device) + [""]
            + format_strategies(plan, run, plan.get("measured")) + [""]
            + format_notes(plan, unit, m.scan_layers))
    return "\n".join(head + body)


def _heads(m, mla_exchange: str) -> str:
    """'32 heads (4 KV) x 128', or latent attention's '16 heads of latent attention (latent 512
    + RoPE key 64; qk 128 + 64, v 128; the ring passes latents)'."""
    mla = m.mla
    if not mla.enabled:
        return f"{m.num_heads} heads ({m.num_kv_heads} KV) x {m.head_dim}"
    query = f"query latent {mla.q_lora_rank}, " if mla.q_lora_rank else ""
    passes = "latents" if mla_exchange == "latent" else "keys"
    return (f"{m.num_heads} heads of latent attention ({query}latent {mla.kv_lora_rank} + RoPE "
            f"key {mla.qk_rope_head_dim}; qk {mla.qk_nope_head_dim} + {mla.qk_rope_head_dim}, "
            f"v {mla.v_head_dim}; the devices pass {passes})")


def format_candidates(resolved) -> str:
    """plan.py --explain: every candidate the planner weighed for what the config leaves
    'auto', best first: the strategy and tile (planner/recommend.py), then the memory switches
    (planner/switches.py); the fastest that fits wins each."""
    return "\n\n".join((_attention_candidates(resolved), *_mla_exchange(resolved),
                        *_linear_strategy(resolved), _switch_candidates(resolved)))


def _linear_strategy(resolved) -> list[str]:
    """Recurrent layers: every strategy as planner/linear_strategy.py prices it, all of them
    on one device, forward and backward."""
    p = resolved.linear_prices
    if not p:
        return []
    how = "'auto'" if p["configured"] == "auto" else f"set to {p['configured']!r}"
    lines = [f"Recurrent layers over the sequence devices ({how}: "
             f"{resolved.attention.linear_strategy}), all of them on one device, forward and "
             f"backward:"]
    for name in RECURRENT_STRATEGIES:
        seconds = (f"{p[name] * 1e3:10.3f} ms" if p[name] is not None else
                   "cannot run: the 'seq' devices do not divide the groups")
        lines.append(f"  {name:<5}  {seconds}  {p[f'{name}_bytes'] / GB:8.4f} GB moved, "
                     f"{p[f'{name}_flops'] / 1e12:.3f} TFLOP")
    return ["\n".join(lines)]


def _mla_exchange(resolved) -> list[str]:
    """Latent attention: both exchanges as planner/mla_exchange.py prices them, one layer on
    one device, forward and backward."""
    p = resolved.mla_prices
    if not p:
        return []
    how = "'auto'" if p["configured"] == "auto" else f"set to {p['configured']!r}"
    crossover = ("latent stays faster up to 16M tokens a device" if p["crossover"] is None else
                 f"full is faster past {p['crossover']:,} tokens a device")
    return [f"Latent attention exchange ({how}: {resolved.attention.mla_exchange}), one layer "
            f"on one device, forward and backward:\n"
            f"  latent  {p['latent'] * 1e3:10.3f} ms  {p['latent_bytes'] / GB:8.3f} GB received "
            f"+ {p['expand_flops'] / 1e12:.3f} TFLOP expanding the blocks\n"
            f"  full    {p['full'] * 1e3:10.3f} ms  {p['full_bytes'] / GB:8.3f} GB received "
            f"(the attention's own tiles: {p['tiles_s'] * 1e3:.3f} ms)\n"
            f"  {crossover}"]


def _attention_candidates(resolved) -> str:
    if not resolved.attention_candidates:
        return "Attention: strategy and tile set by the config; nothing for 'auto' to weigh"
    lines = [f"Attention weighed ('auto'; {resolved.attention.why.split(':')[0]}), best first:",
             f"  {'#':>3}  {'predicted step s':>16}  {'fits':<5} {'layout':<9} {'strategy':<12} "
             "tiles"]
    for i, r in enumerate(resolved.attention_candidates, 1):
        choice, memory = r["choice"], r["memory"]
        fits = "-" if memory is None else ("no" if memory["verdict"] == "does not fit"
                                           else "yes")
        strategy = get_strategy(choice.strategy).label(choice.ulysses_degree)
        lines.append(f"  {i:>3}  {r['step_s']:>16.4g}  {fits:<5} {choice.layout:<9} "
                     f"{strategy:<12} {choice.tile_q}x{choice.tile_k}")
    return "\n".join(lines)


def _switch_candidates(resolved) -> str:
    if not resolved.auto_switches:
        return "Memory switches: all set by the config; nothing for 'auto' to weigh"
    budget = f"{AUTO_SHARE:.0%} of {resolved.device_bytes / GB:.2f} GB"
    lines = [f"Memory switches weighed for {', '.join(resolved.auto_switches)} ('auto'; fits: "
             f"analytic total at most {budget}), best first:",
             f"  {'#':>3}  {'predicted step s':>16}  {'GB per device':>13}  {'fits':<5} switches"]
    for i, r in enumerate(resolved.candidates, 1):
        lines.append(f"  {i:>3}  {r['step_s']:>16.4g}  {r['total_bytes'] / GB:>13.2f}  "
                     f"{'yes' if r['fits'] else 'no':<5} {r['switches'].label()}")
    return "\n".join(lines)
