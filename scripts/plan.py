"""Memory and throughput planner: will a run fit on its accelerators, and how fast could it go?

    python scripts/plan.py --config configs/paper_a100_256k.py
    python scripts/plan.py --config configs/paper_tpuv4_786k.py --device tpu-v4
    python scripts/plan.py --config configs/llama_7b.py --config.seq_len=65536 --device h100-80gb
    python scripts/plan.py --config configs/tiny.py --device cpu --compile yes --json /tmp/plan.json
    python scripts/plan.py --config configs/default.py --documents data      # its own documents
    python scripts/plan.py --config configs/llama_1b.py --documents lognormal:7.5:1.5

Needs no accelerator. Config overrides (--config.FIELD=VALUE) work as in train.py. --device
defaults to the config file's module-level DEVICE (e.g. "a100-80gb"), else "cpu". The device
count is the mesh's (mesh.data x mesh.seq); where the mesh has a -1, --devices (default: 8 on an
accelerator, config.cpu_devices on cpu). Every figure is per device unless it says otherwise.
The formulas below live in plan_model.py, the compile check in plan_compile.py, the time tables
in plan_time.py, the model-size table in plan_sizes.py, --documents in plan_documents.py; this
file reads the flags and prints. Tiles default as the run's kernel on that device would choose
them (`Kernel.max_tiles`: 512 for xla and pallas_tpu, 128 x 64 for pallas_gpu on a GPU).

Notation: P parameters (P_mm of them in matmuls, training/flops.py), D devices, N = mesh.seq (the
ring), n = seq_len / N (the block), b = global_batch_size / mesh.data / grad_accum_steps (rows per
device in one micro-step), L layers, d d_model, H query heads, K KV heads, Dh head_dim, F mlp_dim,
V vocab, c compute-dtype bytes, p param-dtype bytes, tq x tk the attention tile, T = n / tq.

1. Memory per device (analytic; bytes):

| term | formula | what |
|---|---|---|
| parameters | (P_matrices / D + P_vectors) p | FSDP: every matrix sharded on its first axis over all D devices; RMSNorm scales replicated |
| optimizer state | 2 x parameters | AdamW mu and nu in the parameter dtype (clip has no state) |
| gradients | parameters (x2 with grad_accum_steps > 1) | one gradient per parameter; accumulation adds the running sum |
| FSDP gather | 2 max(P_layer, V d) p | one gathered layer's weights and its full gradient before the reduce-scatter |
| block inputs | L b n d c (remat only) | what remat keeps of each block for the backward: its input |
| norms | 2 b n (2 c d + 4), x L without remat | each RMSNorm's custom VJP keeps its input and output and a float32 1/rms per token |
| SwiGLU | 6 c b n F, x L without remat; mlp_chunk k: 6 c b k F | gate and up outputs, silu's three residuals, gate * up; chunked: nothing saved, one chunk recomputed at a time |
| attention residuals | b n (c Dh (2H + 2K) + 4H + 8 Dh), x L without remat | the custom VJP's q, out (H heads), k, v (K heads), float32 lse; RoPE's float32 sin, cos for q and k |
| matmul outputs | L b n c (Dh (H + 2K) + d + 2F) (remat_policy 'dots' only) | q, k, v, o, gate and up outputs each layer keeps instead of recomputing |
| KV ring buffers | 4 c b n K Dh + 16 b n K Dh + 8 b n | backward ring: K, V and float32 dK, dV, each held and arriving (double-buffered), + segment ids |
| kernel accumulators | 4 b n H Dh + 4 b H n | float32 dQ and D = rowsum(dO * O) of the backward ring pass |
| tile scratch | 3 x 4 b H tq tk | float32 scores/probabilities, dP and dS of one tile |
| final norm | b n (2 c d + 4); loss_chunk: b n (c d + 4) | the last RMSNorm's input, output (not kept by the chunked loss) and 1/rms |
| logits | 2 x 4 b n V; loss_chunk k: b n d c + 4 d V + (16 + c) b k V | float32 [b, n, V]: exp(logits - max) saved by the loss's logsumexp, then its gradient. Chunked (model/loss.py): dx kept, a float32 dW, one chunk's logits, softmax, one-hot, dlogits |

With remat, one layer's norms, SwiGLU and attention residuals are alive at a time (the layer being
recomputed in the backward); without it, every layer's. The saved terms (block inputs, norms,
SwiGLU, attention residuals, matmul outputs, final norm, half the logits or the chunked loss's
dx: plan_model.saved_activation_bytes) are what jax.ad_checkpoint's
saved_residuals lists for this model (tests/test_plan.py checks it), less a reshape of the
attention output that shares its buffer; the kernel's buffers are those of
parallel/strategies/ring.py (tile scratch: an upper bound, a fused kernel keeps it on chip).

"Fits" means the total is at most 90% of the device's nominal memory (decimal GB, from the
device table), leaving room for the runtime, fragmentation and what the model leaves out
(elementwise temporaries XLA does not fuse, RoPE tables, collectives' buffers).

2. Compiled memory: the real train step (training/step.py, jitted as training/loop.py does, state
built as create_train_state builds it) lowered for D fake CPU devices from abstract inputs and
compiled ahead of time; XLA's per-device memory_analysis(): arguments + outputs - aliased
(donated state) + temporaries. XLA:CPU lays out buffers differently from XLA:GPU/TPU (other
fusions, no latency-hiding scheduler), so this is a cross-check of the analytic model, not the
accelerator's exact figure. "--compile auto" compiles only small problems (COMPILE_AUTO_LIMIT).

3. Time per step at the device's peak, times an efficiency factor (--efficiency, default 1.0:
"at peak", every FLOP at the table's bf16 rate, which no real run reaches):

    attention, per layer:  the ring's critical path. On ring step s the slowest device computes
                           t_s tiles (parallel.cost, the kernels' own rule), each 4 b tq tk Dh H FLOPs
                           forward; the backward is 2x the forward (fwd + bwd = 3x fwd).
                           ring:    t = [T(T+1)/2, T^2 x (N-1)]      total T(T+1)/2 + (N-1)T^2
                           striped: t = [T(T+1)/2 x N]               total N T(T+1)/2
                           zigzag:  t = [T(T+1)/2, T^2/2 x (N-1)]    total T(T+1)/2 + (N-1)T^2/2
                           A step's transfer overlaps its compute (the kernel issues the hop
                           first): step time = max(compute, latency + bytes / link bandwidth).
                           forward  = sum_{s<N-1} max(C_s, kv) + C_{N-1}
                           backward = sum_{s<N-1} max(2 C_s, kv + dkv) + 2 C_{N-1} + dkv
                           with kv = 2 b n K Dh c (+ 4 b n segment ids) / link bandwidth,
                           dkv = 8 b n K Dh / link bandwidth, C_s = t_s 4 b tq tk Dh H / peak
                           remat runs the forward twice (the block is recomputed in the backward).
                           --documents (packed rows, data.mask_documents): t_s is the mean over
                           sample rows of step s's busiest device in each row's placement
                           (parallel.cost.layout_tile_counts; balanced places every row), and
                           doc eff = tiles one device runs on the whole row / N / critical path;
                           model FLOPs then count each document's causal triangle.
    dense:                 6 P_mm b n FLOPs per micro-step (8 P_mm b n with remat: one more
                           forward; remat_policy 'dots' keeps the matmuls: 6; mlp_chunk adds
                           6 d F L b n: each chunk recomputed), overlapped with the FSDP traffic: 2 all-gathers of the
                           weights and 1 reduce-scatter of the gradients, each (D-1)/D P p bytes
                           over one link: time = max(compute, traffic / link bandwidth).
    optimizer:             memory-bound: about 8 P p / D bytes of HBM traffic (clip reads the
                           gradients; AdamW reads parameters, gradients, mu, nu, writes three).
    step = grad_accum_steps x (L x attention + dense) + optimizer
    tokens/s = global_batch_size x seq_len / step.
    Strategies: the table after the layouts prices ring, allgather, ulysses and usp for the run's
    layout with parallel/strategy_cost.py (formulas in its docstring: collectives at the device's
    collective bandwidth, a latency per hop or collective, no overlap of all-to-alls), each with
    its memory total (the ring's K/V buffers swapped for the strategy's), and recommends the
    fastest that fits: what --config.parallel.strategy=auto runs. Where the config file carries
    MEASURED step times (configs/llama3_8b_v5p.py: MaxText's), they are printed beside.
    Not modelled: elementwise work (norms, RoPE, softmax of the loss), loop overheads beyond the
    latency term, imperfect overlap. Model FLOPs per step (what MFU counts) come from
    training/flops.py and exclude the remat recompute, so even at peak MFU is below 100% with remat.

4. Devices (peak bf16 FLOP/s from training/flops.py; the rest nominal, "assumed" where the vendor
   gives no per-link figure; memory in decimal GB, which understates the GiB parts a little):

| --device | peak | HBM | HBM bandwidth | ring link, per direction | collectives | latency | chips per host |
|---|---|---|---|---|---|---|---|
| a100-80gb | 312e12 | 80 GB | 2.0 TB/s | NVLink 3: 300 GB/s | 300 GB/s | 10 us | 8 |
| h100-80gb | 989e12 | 80 GB | 3.35 TB/s | NVLink 4: 450 GB/s | 450 GB/s | 10 us | 8 |
| h200 | 989e12 | 141 GB | 4.8 TB/s | NVLink 4: 450 GB/s | 450 GB/s | 10 us | 8 |
| tpu-v4 | 275e12 | 32 GB | 1.2 TB/s | ICI ~50 GB/s, one link per hop (assumed) | 150 GB/s (assumed) | 5 us | 4 |
| tpu-v5e | 197e12 | 16 GB | 0.82 TB/s | ICI ~50 GB/s (assumed) | 100 GB/s (assumed) | 5 us | 4 |
| tpu-v5p | 459e12 | 95 GB | 2.76 TB/s | ICI ~100 GB/s (assumed) | 300 GB/s (assumed) | 5 us | 4 |
| cpu | 0.1e12 (nominal) | host memory / devices | nominal | nominal 10 GB/s | 10 GB/s | 50 us | all |

   The table lives in training/devices.py (the planner and parallel.strategy=auto share it).

   The process count (devices / chips per host) is what training/validate.py checks the batch
   against.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

# The model and the compile check live beside this file; the tests reach them through here.
from plan_model import (DEVICES, Device, GB, ROOT, Run, activation_memory, analytic_plan,
                        attention_layer_seconds, device_count, fit, gather_all_bytes, make_run,
                        param_counts, process_block, process_count, ring_step_tiles,
                        saved_activation_bytes, state_memory)  # noqa: F401
from plan_documents import describe_documents, sample_documents
from plan_compile import (abstract_batch, abstract_train_state, bytes_per_device,
                          compile_decision, compiled_memory, run_mesh, state_as_built)  # noqa: F401
from plan_sizes import dominant_lines, format_sizes, size_rows
from plan_time import format_strategies, format_time, measured_times

config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                 lock_config=True)
flags.DEFINE_enum("device", None, list(DEVICES), "Accelerator to plan for (default: the config "
                  "file's DEVICE, else cpu).")
flags.DEFINE_enum("compile", "auto", ["auto", "yes", "no"], "Ahead-of-time compile the train step "
                  "on fake CPU devices for XLA's memory figures (auto: only small problems).")
flags.DEFINE_string("json", None, "Write every figure to this JSON file.")
flags.DEFINE_integer("devices", 0, "Device count where the mesh has a -1 (0: 8 on accelerators, "
                     "config.cpu_devices on cpu).")
flags.DEFINE_float("efficiency", 1.0, "Share of peak FLOP/s and bandwidth assumed reached "
                   "(1.0 = at peak).")
flags.DEFINE_string("documents", None, "Document lengths to plan with (packed rows, "
                    "data.mask_documents): 'data' samples the run's own first rows (its tokenizer "
                    "and corpus, found or built in --workdir), or a length spec: exp:MEAN, "
                    "lognormal:MU:SIGMA, pareto:ALPHA:MIN, one. Unset: one document per row.")
flags.DEFINE_integer("document_rows", 4, "Rows of documents --documents samples.")
flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "plan"), "Where --documents=data "
                    "finds or builds the tokenizer and token cache (a run's workdir reuses its).")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS



# ------------------------------------------------------------------------------ printing

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
        "block_inputs": f"block inputs (remat): {m.num_layers} x [{b}, {n:,}, {m.d_model}] "
                        f"{m.dtype}",
        "norms": f"RMSNorm input, output, fp32 1/rms ({every})",
        "swiglu": (f"SwiGLU gate, up, silu, product ({every})" if not m.mlp_chunk else
                   f"SwiGLU: one chunk of {m.mlp_chunk:,} tokens recomputed"),
        "attention_residuals": f"attention residuals q, k, v, out, lse, RoPE ({every})",
        "dot_outputs": f"matmul outputs kept by remat_policy 'dots' ({m.num_layers} layers)",
        "kv_ring_buffers": "KV ring buffers: K, V, fp32 dK, dV, x2 in flight",
        "kernel_accumulators": "kernel accumulators: fp32 dQ, D",
        "tile_scratch": f"tile scratch: 3 fp32 [{b}, {m.num_heads}, {plan['tiles'][0]}, "
                        f"{plan['tiles'][1]}]",
        "final_norm": "final RMSNorm saved values",
        "logits": (f"logits [{b}, {n:,}, {m.vocab_size}] fp32: saved exp + gradient"
                   if not m.loss_chunk else
                   f"loss in chunks of {m.loss_chunk:,}: dx, fp32 dW, one chunk's logits"),
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
    notes = []
    if plan["as_built"]["optimizer_state"] > 1.01 * plan["state_bytes"]["optimizer_state"]:
        notes += ["  1. the optimizer state that training.loop.create_train_state builds is not sharded "
                  "like the parameters",
                  "     (AdamW's mu and nu replicated on every device): check that it still uses "
                  "training.optim.optimizer_shardings."]
    g = plan["today"]["gather_all"]
    if scan_layers:
        return ["Notes:"] + notes + [
            "  2. model.scan_layers: the blocks run in one lax.scan, so even XLA:CPU's schedule "
            "(not memory-aware) holds one",
            "     layer's gathered weights and activations at a time (scripts/bench_memory.py)."]
    notes += ["  2. XLA:CPU's compile of this step (--compile yes) is not memory-aware: its "
              "temporaries come out (nearly)",
              "     the same with remat on and off, and grow by 2 x one layer's float32 weights "
              "per layer (every layer's",
              "     gathered weights and full gradient alive). If XLA:GPU/TPU did that too, on "
              f"top of today's total: {g['added_bytes'] / size:+,.2f} {name}",
              f"     -> {g['total_bytes'] / size:,.2f} {name}, {g['verdict'].upper()}. Check on "
              "the accelerator: jitted.lower(...).compile().memory_analysis()."]
    return ["Notes:"] + notes


def format_compiled(plan: dict, run: Run, unit, scan_layers: bool = False) -> list[str]:
    name, size = unit
    c = plan["compiled"]
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


def format_plan(plan: dict, config, device: Device, run: Run) -> str:
    import model
    m = model.ModelConfig.from_config(config.model, config.parallel)
    pc = plan["params"]
    rows, columns = process_block(run, plan["processes"])
    head = [f"ringstripe plan: {plan['config_file']} on {run.devices} x {device.title} "
            f"({plan['device']}, {plan['processes']} process(es))",
            f"  model  {_count(pc['total'])} parameters: d_model {m.d_model}, {m.num_layers} "
            f"layers, {m.num_heads} heads ({m.num_kv_heads} KV) x {m.head_dim}, mlp {m.mlp_dim}, "
            f"vocab {m.vocab_size}; {m.dtype} compute, {m.param_dtype} params, remat "
            f"{'on (keeps ' + m.remat_policy + ')' if m.remat else 'off'}"
            f"{', scan_layers' if m.scan_layers else ''}; loss_chunk {m.loss_chunk or 'off'}, "
            f"mlp_chunk {m.mlp_chunk or 'off'}",
            f"  run    {run.global_batch} x {run.seq_len:,} = {run.tokens_per_step:,} tokens per "
            f"step; mesh data {run.data} x seq {run.seq}; {run.block:,} tokens per device per "
            f"sequence; {run.rows} row(s) per device per micro-step (grad_accum_steps "
            f"{run.accum}); {run.layout} attention",
            f"  hosts  each of {plan['processes']} process(es) builds {rows} row(s) x "
            f"{columns:,} laid-out columns of every batch (a row may span hosts)", ""]
    unit = _unit(plan["fit"]["total_bytes"])
    body = (format_memory(plan, m, run, unit) + format_as_built(plan, unit) + [""]
            + format_sizes(plan["sizes"], m, run, unit)
            + format_compiled(plan, run, unit, m.scan_layers) + [""]
            + format_time(plan, m, run, device) + [""]
            + format_strategies(plan, run, plan.get("measured")) + [""]
            + format_notes(plan, unit, m.scan_layers))
    return "\n".join(head + body)


# ------------------------------------------------------------------------------ main

def config_device(filename: str) -> str:
    """The config file's module-level DEVICE = '...' (read, not executed), else 'cpu'."""
    with open(filename) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEVICE"
                                                 for t in node.targets)):
            return ast.literal_eval(node.value)
    return "cpu"


def use_fake_devices(count: int) -> None:
    """count fake CPU devices for the compile; must run before JAX starts (it reads XLA_FLAGS)."""
    flags_now = [f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
    flags_now.append(f"--xla_force_host_platform_device_count={count}")
    os.environ["XLA_FLAGS"] = " ".join(flags_now)
    os.environ["JAX_PLATFORMS"] = "cpu"  # the planner compiles on the host, whatever is attached


def make_plan(config, device_name: str, devices: int, compile_mode: str, efficiency: float,
              documents: str | None = None, document_rows: int = 4,
              workdir: str | None = None) -> tuple[dict, Device, Run]:
    from training.validate import validate_config
    device, run = DEVICES[device_name], make_run(config, devices)
    if device_name == "cpu":  # fake devices share the host's memory
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        device = dataclasses.replace(device, memory_bytes=host / devices)
    validate_config(config, devices, process_count(device, devices), platform=device.platform)
    segment_ids = sample_documents(config, documents, document_rows, workdir)
    plan = analytic_plan(config, device, run, efficiency, segment_ids)
    plan.update(device=device_name, device_spec=dataclasses.asdict(device),
                processes=process_count(device, devices), run=dataclasses.asdict(run),
                documents=describe_documents(documents, segment_ids))
    plan["as_built"] = state_as_built(config, run)
    plan["today"] = today_scenarios(plan, config, run, device)
    plan["sizes"] = ([] if device_name == "cpu" else  # the model-size table: accelerators only
                     size_rows(config, device, run, tuple(plan["tiles"])))
    go, why = compile_decision(compile_mode, plan["params"]["total"], run)
    plan["compiled"] = compiled_memory(config, run) if go else {"status": why}
    return plan, device, run


def today_scenarios(plan: dict, config, run: Run, device: Device) -> dict:
    """Totals for the program as it is: the optimizer state as built (measured from its
    shardings), then also every layer's gathered weights and full gradient alive at once."""
    import model
    m = model.ModelConfig.from_config(config.model, config.parallel)
    design = plan["fit"]["total_bytes"]
    opt_added = plan["as_built"]["optimizer_state"] - plan["state_bytes"]["optimizer_state"]
    gather_added = gather_all_bytes(m) - plan["state_bytes"]["fsdp_gather"]
    first = dict(fit(design + opt_added, device), added_bytes=opt_added)
    second = dict(fit(design + opt_added + gather_added, device), added_bytes=gather_added)
    return {"optimizer_as_built": first, "gather_all": second}


def parse_flags(argv):
    """absl's parser; a config mistake is one line on stderr and exit 2 (as in train.py)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:  # e.g. a value of the wrong type, an unknown --device
        print(f"error: {e}", file=sys.stderr)
    except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
        name = str(e).strip("\"'")
        print(f"error: unknown config field '{name}': every --config.FIELD must exist in the "
              "config file", file=sys.stderr)
    sys.exit(2)


def main(argv):
    del argv
    config = FLAGS.config
    filename = config_flags.get_config_filename(FLAGS["config"])
    device_name = FLAGS.device or config_device(filename)
    devices = device_count(config, device_name, FLAGS.devices)
    use_fake_devices(devices)
    from data import DataError
    from training.validate import ConfigError
    try:
        plan, device, run = make_plan(config, device_name, devices, FLAGS.compile,
                                      FLAGS.efficiency, FLAGS.documents, FLAGS.document_rows,
                                      FLAGS.workdir)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    plan["config_file"] = os.path.relpath(filename, ROOT) if filename.startswith(ROOT) else filename
    plan["measured"] = measured_times(filename, run.seq_len)
    print(format_plan(plan, config, device, run))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(dict(plan, config=config.to_dict()), f, indent=1, default=float)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
