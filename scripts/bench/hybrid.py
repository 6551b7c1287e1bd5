"""The recurrent layers of a hybrid model (configs/hybrid_tiny.py: Gated DeltaNet, Qwen3-Next's
3 : 1) from XLA's own compiled train step, on fake CPU devices in one process (nothing is run):

    python scripts/bench/hybrid.py exchange [--seq-lens 2048 8192 32768] [--layout zigzag]
    python scripts/bench/hybrid.py memory [--seq-len 1048576]

exchange  every collective's bytes of the train step with 3 Gated DeltaNet layers beyond one
          with 1, on a ring of 4, per parallel.linear_strategy ('state': passed states; 'heads':
          all-to-alls to whole rows of a quarter of the heads), against the length: what the
          recurrent layers themselves move (the weights' gathers are the same in both programs);
          --layout other than 'ring': with the moves to contiguous blocks and back.
memory    per-device bytes (XLA's memory_analysis: temporaries, and with arguments and outputs)
          of the hybrid (4 key heads, 8 value heads) at --seq-len tokens over 4 devices, its
          Gated DeltaNet layers split by each strategy, against the same model with softmax
          attention in every layer, every memory switch resolved by the planner for each (the
          first row keeps the recurrent layers whole: model.linear_chunk 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = 4
SMALL = {"global_batch_size": 1, "parallel.layout": "ring", "parallel.strategy": "ring",
         "parallel.kernel": "xla", "model.moe.num_experts": 0,
         "model.linear_attention.num_key_heads": 4, "model.linear_attention.num_value_heads": 8}


def compiled(overrides: dict) -> dict:
    """One compile in a fresh process (its devices, its memory): the figures of `one`."""
    args = [sys.executable, __file__, "one", "--overrides", json.dumps(overrides)]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_hybrid: the compile of {overrides} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(overrides: dict) -> None:
    """Child process: the train step of configs/hybrid_tiny.py with the overrides, compiled
    ahead of time on 4 fake devices (1 x 4)."""
    from training.cli import use_fake_devices
    use_fake_devices(DEVICES)
    import jax

    import planner
    import run_config
    from configs import hybrid_tiny
    from planner.run import make_run
    from training.analysis.aot import compile_train_step
    config = run_config.replace(run_config.build(hybrid_tiny.get_config()), overrides)
    resolved = planner.resolve_run(config, (1, DEVICES), "cpu", jax.devices()[0].device_kind)
    figures, _ = compile_train_step(config, make_run(config, DEVICES, (1, DEVICES)), resolved)
    print(json.dumps({"collective_bytes": figures["collective_bytes"], "temp": figures["temp"],
                      "total": figures["total"], "linear_strategy":
                      resolved.attention.linear_strategy, "switches": resolved.switches.label(),
                      "attention": resolved.attention.label()}))


def exchange(args) -> list[dict]:
    print(f"collective bytes of the compiled train step, 3 Gated DeltaNet layers beyond 1 "
          f"(4 key heads, 8 value heads of 32 x 32), one row, {DEVICES} fake CPU devices, "
          f"{args.layout} layout:")
    print(f"  {'tokens':>8}  {'state MB':>10}{'vs first':>10}  {'heads MB':>10}{'vs first':>10}"
          f"{'heads all-to-all MB':>21}")
    rows = []
    for seq_len in args.seq_lens:
        row = {"seq_len": seq_len}
        for strategy in ("state", "heads"):
            moved = []
            for layers in (1, 3):
                figures = compiled({**SMALL, "seq_len": seq_len, "model.num_layers": layers,
                                    "parallel.layout": args.layout,
                                    "model.layer_types": ["linear_attention"] * layers,
                                    "parallel.linear_strategy": strategy, "model.remat": False,
                                    "model.loss_chunk": 0, "model.mlp_chunk": 0})
                moved.append(figures["collective_bytes"])
            row[strategy] = sum(moved[1].values()) - sum(moved[0].values())
            row[f"{strategy}_all_to_all"] = (moved[1].get("all-to-all", 0)
                                             - moved[0].get("all-to-all", 0))
        rows.append(row)
        first = rows[0]
        print(f"  {seq_len:>8,}  {row['state'] / 1e6:>10.3f}{row['state'] / first['state']:>9.2f}x"
              f"  {row['heads'] / 1e6:>10.3f}{row['heads'] / first['heads']:>9.2f}x"
              f"{row['heads_all_to_all'] / 1e6:>21.3f}", flush=True)
    return rows


def memory(args) -> list[dict]:
    layers = 4
    hybrid = ["linear_attention"] * 3 + ["full_attention"]
    kinds = {"hybrid 3:1, by state, whole": (hybrid, "state", 0),
             "hybrid 3:1, linear by state": (hybrid, "state", "auto"),
             "hybrid 3:1, linear by heads": (hybrid, "heads", "auto"),
             "softmax everywhere": (["full_attention"] * layers, "auto", "auto")}
    print(f"train step of configs/hybrid_tiny.py at {args.seq_len:,} tokens on {DEVICES} fake CPU "
          f"devices ({args.seq_len // DEVICES:,} per device), per device, memory switches "
          f"resolved by the planner:")
    print(f"  {'model':<30}{'temporaries GB':>16}{'total GB':>10}  switches; attention")
    rows = []
    for name, (types, strategy, pieces) in kinds.items():
        figures = compiled({"seq_len": args.seq_len, "global_batch_size": 1,
                            "model.layer_types": types, "parallel.linear_strategy": strategy,
                            "model.scan_layers": "auto", "model.linear_chunk": pieces,
                            "model.linear_attention.num_key_heads": 4,  # 'heads' splits them
                            "model.linear_attention.num_value_heads": 8})
        rows.append(dict(figures, model=name))
        print(f"  {name:<30}{figures['temp'] / 1e9:>16.2f}{figures['total'] / 1e9:>10.2f}  "
              f"{figures['switches']}; {figures['attention']}", flush=True)
    for row in rows[:-1]:
        print(f"  {row['model']} / softmax everywhere: {row['temp'] / rows[-1]['temp']:.2f}x the "
              f"temporaries")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["exchange", "memory", "one"])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--seq-len", type=int, default=1 << 20)
    parser.add_argument("--layout", default="ring", help="exchange: the tokens' layout")
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.what == "one":
        return one(json.loads(args.overrides))
    rows = exchange(args) if args.what == "exchange" else memory(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
