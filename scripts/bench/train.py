"""End-to-end training throughput of the layouts: train.py itself, one pinned process per device.

Usage:
  python scripts/bench/train.py                 # S = 16,384: ring, striped, zigzag, auto, masked
  python scripts/bench/train.py --json runs/bench_train.json        # (make bench-train)
  python scripts/bench/train.py --seq-lens 4096 8192 16384 --rounds 1 --masked-layouts
  python scripts/bench/train.py --strategies ring allgather --masked-layouts
  python scripts/bench/train.py -- --config.model.num_layers=8      # more train.py overrides
  python scripts/bench/train.py --layouts --masked-layouts ring striped zigzag balanced auto \
      --tiles 128 256 512                     # every layout x tile beside what 'auto' picks
  python scripts/bench/train.py --config configs/moe_tiny.py --processes 4 --experts 1 2 4 \
      --layouts zigzag --masked-layouts --seq-lens 8192   # experts over 1, 2, 4 devices
  python scripts/bench/train.py --config configs/mla_tiny.py --processes 4 --layouts zigzag \
      --masked-layouts --mla-exchanges latent full --seq-lens 2048   # what the ring passes
  python scripts/bench/train.py --config configs/hybrid_tiny.py --processes 2 --layouts ring \
      zigzag --masked-layouts --linear-strategies state heads --seq-lens 8192  # Gated DeltaNet
  python scripts/bench/train.py --layouts ring --masked-layouts --remat-policies nothing \
      attention -- --config.model.remat=True --config.model.scan_layers=True  # what remat keeps

Every kind (layout x tile x strategy x documents masked or not) is a real `train.py` run of the
config (configs/default.py unless --config) on a data 1 x seq P mesh: P processes joined by
jax.distributed on 127.0.0.1, each with one fake CPU device and pinned to its own core, as the
devices of a pod each have their own chip. (Fake devices inside one process share XLA's thread
pool: the core of a device that the causal mask left idle helps the busy one, and the layouts'
imbalance vanishes from the clock.) Each run logs every step; its first step compiles and is
left out, so the windows are steady-state steps. Kinds are interleaved: round r runs every kind
once, in an order rotated by r, and a kind's figure is the median tokens/s over all its windows.

"x ring" is how much faster this kind runs the same steps than the ring layout (same length,
strategy and documents): the median over rounds and steps of this kind's tokens/s over ring's on
the same step of the same round. Every kind trains on the same rows (a batch is a function of
the step), so a pair is the same work laid out two ways. Unmasked, every token sees every
earlier one (the layouts' balance on one long document): all steps cost the same. Masked
(data.mask_documents, the config's default), attention stays inside packed documents, so a
step's cost follows its row's documents; this unbalances striped and zigzag and is what the
balanced layout is for.

The runs' workdirs stay under --workdir (metrics.jsonl; checkpoints removed); --json keeps every
window and every run's losses (scripts/plot_figures.py draws tokens/s vs length and the losses).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys

from launch.local import launch
from storage.run_dir import RunDir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/default.py", help="train.py's config file")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[16384], help="tokens per row")
    p.add_argument("--batch", type=int, default=1, help="rows per step (global_batch_size)")
    p.add_argument("--tiles", nargs="+", default=["512"],
                   help="parallel.tile values, each a kind of its own ('auto': the planner's)")
    p.add_argument("--processes", type=int, default=2, help="devices = processes = ring size")
    p.add_argument("--layouts", nargs="*", default=["ring", "striped", "zigzag", "auto"],
                   help="layouts with documents unmasked (one long document per row; 'auto': "
                        "the config's defaults, the planner's layout, strategy and tile)")
    p.add_argument("--masked-layouts", nargs="*",
                   default=["ring", "striped", "zigzag", "balanced", "auto"],
                   help="layouts with packed documents masked (none: skip)")
    p.add_argument("--strategies", nargs="+", default=["ring"], help="parallel.strategy values")
    p.add_argument("--experts", type=int, nargs="+", default=[1],
                   help="mesh.expert values, each a kind of its own (a config with model.moe: "
                        "the experts over 1, 2, .. of the processes)")
    p.add_argument("--remat-policies", nargs="+", default=["auto"],
                   help="model.remat_policy values, each a kind of its own ('auto': the "
                        "config's; give model.remat=True after --)")
    p.add_argument("--mla-exchanges", nargs="+", default=["auto"],
                   help="parallel.mla_exchange values, each a kind of its own (a config with "
                        "model.mla: 'latent' or 'full'; 'auto': the config's)")
    p.add_argument("--linear-strategies", nargs="+", default=["auto"],
                   help="parallel.linear_strategy values, each a kind of its own (a config with "
                        "recurrent layers: 'state' or 'heads'; 'auto': the config's); 'x ring' "
                        "compares with the ring layout run by the first of them")
    p.add_argument("--steps", type=int, default=4, help="timed steps per run (after the first)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every kind, interleaved")
    p.add_argument("--workdir", default="runs/bench_train", help="runs and the data cache")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run before it fails")
    p.add_argument("--json", help="write every window and loss to this JSON file")
    p.add_argument("overrides", nargs="*", help="after --: more train.py flags, e.g. "
                   "--config.model.num_layers=8")
    return p.parse_args(argv)


def kinds_of(args) -> list[dict]:
    """Every (documents, strategy, layout, tile); the layout 'auto' runs once per documents
    setting, with the strategy and the tile 'auto' too (the config's defaults: the planner
    picks all three)."""
    kinds = []
    for masked, layouts in ((False, args.layouts), (True, args.masked_layouts)):
        kinds += [dict(layout=layout, strategy=strategy, masked=masked, tile=tile,
                       experts=experts, remat_policy=policy, mla_exchange=exchange,
                       linear_strategy=linear)
                  for strategy in args.strategies for layout in layouts if layout != "auto"
                  for tile in args.tiles for experts in args.experts
                  for policy in args.remat_policies for exchange in args.mla_exchanges
                  for linear in args.linear_strategies]
        if "auto" in layouts:
            kinds += [dict(layout="auto", strategy="auto", masked=masked, tile="auto",
                           experts=experts, remat_policy=policy, mla_exchange=exchange,
                           linear_strategy=linear)
                      for experts in args.experts for policy in args.remat_policies
                      for exchange in args.mla_exchanges for linear in args.linear_strategies]
    return kinds


def kind_name(kind: dict, seq_len: int) -> str:
    docs = "masked" if kind["masked"] else "unmasked"
    experts = f"-e{kind['experts']}" if kind.get("experts", 1) != 1 else ""
    remat = f"-remat_{kind['remat_policy']}" if kind.get("remat_policy", "auto") != "auto" else ""
    mla = f"-mla_{kind['mla_exchange']}" if kind.get("mla_exchange", "auto") != "auto" else ""
    linear = (f"-linear_{kind['linear_strategy']}"
              if kind.get("linear_strategy", "auto") != "auto" else "")
    return (f"S{seq_len}-{kind['layout']}-{kind['strategy']}-t{kind['tile']}-{docs}{experts}"
            f"{remat}{mla}{linear}")


def train_flags(args, kind: dict, seq_len: int, workdir: str) -> list[str]:
    """train.py's arguments for one run: log every step, no evaluation or checkpoint until the
    end (both come after the last window)."""
    steps = args.steps + 1
    sets = dict(cpu_devices=1, seq_len=seq_len, global_batch_size=args.batch,
                num_train_steps=steps, log_every_steps=1, eval_every_steps=steps,
                eval_batches=1, checkpoint_every_steps=steps, tracker="jsonl")
    sets.update({"mesh.data": 1, "mesh.seq": args.processes,
                 "parallel.layout": kind["layout"], "parallel.strategy": kind["strategy"],
                 "data.mask_documents": kind["masked"], "mesh.expert": kind["experts"],
                 "data.cache_dir": RunDir(args.workdir).cache,
                 "parallel.tile": kind["tile"]})
    if kind["remat_policy"] != "auto":
        sets["model.remat_policy"] = kind["remat_policy"]
    if kind.get("mla_exchange", "auto") != "auto":
        sets["parallel.mla_exchange"] = kind["mla_exchange"]
    if kind.get("linear_strategy", "auto") != "auto":
        sets["parallel.linear_strategy"] = kind["linear_strategy"]
    return ["train.py", "--config", args.config, "--workdir", workdir,
            *(f"--config.{k}={v}" for k, v in sets.items()), *args.overrides]


def ran_label(row: dict, shards: int) -> str:
    """What a run resolved its attention to, from its first metrics row: 'zigzag ring
    256x256', 'balanced usp 2x2 64x64' (layout, the strategy's label on `shards` seq devices,
    query x key tile)."""
    import parallel
    a = {k.split("/")[1]: v for k, v in row.items() if k.startswith("attention/")}
    label = parallel.get_strategy(a["strategy"]).label(a["ulysses_degree"], shards)
    latent = " latent" if a.get("mla_exchange") == "latent" else ""
    linear = " linear by heads" if a.get("linear_strategy") == "heads" else ""
    return f"{a['layout']} {label} {a['tile_q']}x{a['tile_k']}{latent}{linear}"


def read_run(workdir: str, shards: int) -> dict:
    """The run's steady-state windows (tokens/s of each step after the first) and its loss per
    step, from metrics.jsonl."""
    windows, steps, losses, ran = [], [], {}, None
    with open(RunDir(workdir).metrics) as f:
        for line in f:
            row = json.loads(line)
            if ran is None and "attention/layout" in row:  # what the run resolved to
                ran = ran_label(row, shards)
            if "train/loss" in row:
                losses[int(row["step"])] = row["train/loss"]
            if "throughput/tokens_per_sec" in row:
                windows.append(row["throughput/tokens_per_sec"])
                steps.append(int(row["step"]))
    return dict(windows=windows, steps=steps, losses=losses, ran=ran)


def run_kind(args, kind: dict, seq_len: int, round_index: int) -> dict:
    workdir = os.path.join(args.workdir, f"{kind_name(kind, seq_len)}-r{round_index}")
    shutil.rmtree(workdir, ignore_errors=True)
    # One core per process: XLA:CPU's own worker threads would otherwise share it. Any XLA
    # flags of the caller's pass through (launch_local drops a fake-device count).
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen=false".strip()
    output = io.StringIO()
    code = launch(train_flags(args, kind, seq_len, workdir), args.processes, args.timeout,
                  env=env, pin=True, sink=output)
    if code:
        tail = "\n".join(output.getvalue().splitlines()[-15:])
        sys.exit(f"{tail}\nbench_train: {kind_name(kind, seq_len)} failed (exit {code}); "
                 f"its output ends above")
    shutil.rmtree(RunDir(workdir).checkpoints, ignore_errors=True)
    return read_run(workdir, args.processes)


def measure(args) -> list[dict]:
    """Every kind at every length, `rounds` times, interleaved; one result per kind."""
    kinds = kinds_of(args)
    results = []
    for seq_len in args.seq_lens:
        found = {kind_name(k, seq_len): dict(k, seq_len=seq_len, windows=[], steps=[],
                                             losses=None, ran=None) for k in kinds}
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                name = kind_name(kind, seq_len)
                run = run_kind(args, kind, seq_len, r)
                print(f"  {name} round {r + 1}: tokens/s "
                      + ", ".join(f"{w:,.0f}" for w in run["windows"]), flush=True)
                found[name]["windows"] += run["windows"]
                found[name]["steps"] += [(r, step) for step in run["steps"]]
                found[name]["losses"] = found[name]["losses"] or run["losses"]
                found[name]["ran"] = found[name]["ran"] or run["ran"]
        results += found.values()
    return summarize(results)


# What two kinds must share for their tokens/s to be a ratio: the same steps of the same model
SAME_WORK = ("seq_len", "masked", "experts", "remat_policy")


def summarize(results: list[dict]) -> list[dict]:
    """Adds each kind's median tokens/s and "x ring": the median over (round, step) of its
    tokens/s over the ring layout's on the same step, the ring with the same tile (the layout
    'auto': the fastest ring measured; None without a ring twin)."""
    for r in results:
        r["median_tokens_per_sec"] = statistics.median(r["windows"])
    first_linear = results[0].get("linear_strategy") if results else None
    for r in results:
        ring = sorted((x for x in results if x["layout"] == "ring" and all(
            x[k] == r[k] for k in SAME_WORK) and x.get("mla_exchange") == r.get(
                "mla_exchange") and x.get("linear_strategy") == first_linear and (
                r["layout"] == "auto" or (
                x["tile"] == r["tile"] and x["strategy"] == r["strategy"]))),
            key=lambda x: -x["median_tokens_per_sec"])
        if not ring:
            r["x_ring"] = None
            continue
        r["x_ring"] = step_ratio(r, ring[0])
    return results


def step_ratio(kind: dict, base: dict) -> float:
    """The median over (round, step) of kind's tokens/s over base's on the same step."""
    on_step = dict(zip(map(tuple, base["steps"]), base["windows"]))
    return statistics.median(w / on_step[tuple(key)] for key, w
                             in zip(kind["steps"], kind["windows"]))


def against_first(results: list[dict], key: str, values: list[str]) -> list[str]:
    """One line per kind run with a later value of `key` (--remat-policies, --mla-exchanges,
    --linear-strategies):
    its step-by-step ratio to the same kind with the first value."""
    lines = []
    for r in results:
        if r.get(key) == values[0]:
            continue
        base = next(x for x in results if x.get(key) == values[0] and all(
            x.get(k) == r.get(k) for k in ("layout", "strategy", "tile", "remat_policy",
                                           "mla_exchange", "linear_strategy", *SAME_WORK)
            if k != key))
        lines.append(f"{key} {r[key]} against {values[0]} ({r['layout']} {r['strategy']} tile "
                     f"{r['tile']}, {r['seq_len']:,}): {step_ratio(r, base):.2f}x the tokens/s "
                     f"on the same steps")
    return lines


def print_table(results, args):
    config = os.path.relpath(args.config, ROOT) if os.path.isabs(args.config) else args.config
    print(f"\ntrain.py end to end, {config}, batch {args.batch}, "
          f"{args.processes} processes pinned to one core each; medians of {args.rounds} x "
          f"{args.steps} steady-state steps; x ring: median of step-by-step ratios to ring")
    experts = args.experts != [1]  # a column only where expert degrees are compared
    remat = args.remat_policies != ["auto"]  # likewise remat policies
    mla = args.mla_exchanges != ["auto"]  # and latent attention's exchanges
    linear = args.linear_strategies != ["auto"]  # and the recurrent layers' strategies
    print(f"{'seq':>7} {'documents':<9} {'layout':<9} {'strategy':<10} {'tile':>5} "
          + (f"{'experts':>7} " if experts else "") + (f"{'remat':>9} " if remat else "")
          + (f"{'exchange':>8} " if mla else "") + (f"{'linear':>6} " if linear else "")
          + f"{'tokens/s':>9} {'min':>7} {'max':>7} {'x ring':>7}  ran")
    for r in results:
        ratio = "-" if r["x_ring"] is None else f"{r['x_ring']:.2f}"
        print(f"{r['seq_len']:>7,} {'masked' if r['masked'] else 'unmasked':<9} "
              f"{r['layout']:<9} {r['strategy']:<10} {r['tile']:>5} "
              + (f"{r['experts']:>7} " if experts else "")
              + (f"{r['remat_policy']:>9} " if remat else "")
              + (f"{r['mla_exchange']:>8} " if mla else "")
              + (f"{r['linear_strategy']:>6} " if linear else "") +
              f"{r['median_tokens_per_sec']:>9,.0f} {min(r['windows']):>7,.0f} "
              f"{max(r['windows']):>7,.0f} {ratio:>7}  {r['ran'] or ''}")
    for r in results:
        if r["layout"] == "auto":
            print(auto_against_fastest(r, results))
    if remat:
        print("\n".join(against_first(results, "remat_policy", args.remat_policies)))
    if mla:
        print("\n".join(against_first(results, "mla_exchange", args.mla_exchanges)))
    if linear:
        print("\n".join(against_first(results, "linear_strategy", args.linear_strategies)))


def auto_against_fastest(auto: dict, results: list[dict]) -> str:
    """One line: what 'auto' ran and its tokens/s against the fastest kind measured beside it
    (same length and documents), both medians of the same interleaved rounds."""
    rivals = [x for x in results if x["layout"] != "auto" and all(
        x[k] == auto[k] for k in SAME_WORK)]
    docs = "masked" if auto["masked"] else "unmasked"
    if not rivals:
        return f"auto ({auto['seq_len']:,} {docs}) ran {auto['ran']}: nothing measured beside it"
    best = max(rivals, key=lambda x: x["median_tokens_per_sec"])
    share = auto["median_tokens_per_sec"] / best["median_tokens_per_sec"]
    return (f"auto ({auto['seq_len']:,} {docs}) ran {auto['ran']}: "
            f"{auto['median_tokens_per_sec']:,.0f} tokens/s, {share:.3f} of the fastest measured "
            f"({best['layout']} {best['strategy']} tile {best['tile']}, "
            f"{best['median_tokens_per_sec']:,.0f})")


def main(argv=None):
    args = parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)
    args.json = args.json and os.path.abspath(args.json)
    args.config = os.path.abspath(args.config) if os.path.exists(args.config) else args.config
    os.chdir(ROOT)  # train.py and the configs by their repository paths
    if args.steps < 1 or args.rounds < 1:
        print("bench_train: --steps and --rounds must be at least 1", file=sys.stderr)
        sys.exit(2)
    from training.cli import config_file
    config_file(args.config)  # a missing or broken file: one line, before any run starts
    if len(os.sched_getaffinity(0)) < args.processes:
        print(f"bench_train: note: {args.processes} processes on "
              f"{len(os.sched_getaffinity(0))} core(s): pinned processes will share cores")
    print(f"{len(kinds_of(args)) * len(args.seq_lens) * args.rounds} train.py runs of "
          f"{args.steps + 1} steps each", flush=True)
    results = measure(args)
    print_table(results, args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
