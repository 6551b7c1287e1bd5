"""Memory and compile time of the real train step, by model option, from XLA's own figures.

    python scripts/bench/memory.py memory            # 1M tokens on 8 fake devices, per option
    python scripts/bench/memory.py compile --reps 3  # compile seconds, 4 vs 32 layers, scan off/on
    python scripts/bench/memory.py memory --seq-len 131072 --devices 2 --json runs/mem.json

Each figure comes from a fresh process that builds the train step exactly as train.py does
(training/step.py on the state training/loop.py builds, via training/analysis/aot.py), compiles it
ahead of time for fake CPU devices and reads memory_analysis(): temporaries per device, and
seconds to lower + compile the step, and the program's size (lines of its optimised HLO; XLA:CPU
reports no generated-code size). Nothing is run, so a million-token step costs seconds.
`compile` interleaves its variants rep by rep and prints medians; its ratio column is each
variant's median over the 4-layer one with the same scan setting.

The variants stack: `remat` is the baseline (every block recomputed in the backward), then the
chunked loss (model.loss_chunk), the tiled MLP (model.mlp_chunk), blocks under one lax.scan
(model.scan_layers). XLA:CPU's scheduler is not memory-aware (scripts/plan.py, note 2): only a
loop bounds what it keeps alive, which is why scan matters here more than remat does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MEMORY_VARIANTS = {
    "plain": {"model.remat": False},
    "remat": {"model.remat": True},
    "+ loss_chunk": {"model.remat": True, "model.loss_chunk": 4096},
    "+ mlp_chunk": {"model.remat": True, "model.loss_chunk": 4096, "model.mlp_chunk": 8192},
    "+ scan_layers": {"model.remat": True, "model.loss_chunk": 4096, "model.mlp_chunk": 8192,
                      "model.scan_layers": True},
    "auto": {},  # every switch left to the planner (planner/switches.py)
}
# A switch a variant does not name is off, except in the 'auto' row, where the planner
# resolves every one (the configs' default).
OFF = {"model.remat": False, "model.remat_policy": "nothing", "model.scan_layers": False,
       "model.loss_chunk": 0, "model.mlp_chunk": 0}


def measure(overrides: dict, devices: int) -> dict:
    """One compile in a fresh process: {'temp_gb', 'total_gb', 'compile_s'}."""
    args = [sys.executable, __file__, "one", "--devices", str(devices),
            "--overrides", json.dumps(overrides)]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_memory: the compile of {overrides} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(overrides: dict, devices: int) -> None:
    """Child process: compile the train step of configs/default.py with the overrides."""
    from training.cli import use_fake_devices
    use_fake_devices(devices)
    import run_config
    from configs import default
    from planner import resolve_run
    from planner.run import make_run
    from training.analysis.aot import compiled_memory
    config = run_config.replace(run_config.build(default.get_config()),
                                {"cpu_devices": devices, **overrides})
    run = make_run(config, devices)
    resolved = resolve_run(config, (run.data, run.seq), "cpu", "cpu")
    figures = compiled_memory(config, run, resolved)
    print(json.dumps({"temp_gb": figures["temp"] / 1e9, "total_gb": figures["total"] / 1e9,
                      "compile_s": figures["step_compile_s"], "hlo_lines": figures["hlo_lines"],
                      "switches": resolved.switches.label()}))


def memory_table(args) -> list[dict]:
    base = {"seq_len": args.seq_len, "global_batch_size": 1, "mesh.data": 1,
            "mesh.seq": args.devices}
    print(f"train step of configs/default.py, {args.seq_len:,} tokens on {args.devices} fake CPU "
          f"devices ({args.seq_len // args.devices:,} per device), per device:")
    print(f"  {'variant':<16}{'temporaries GB':>16}{'total GB':>10}{'compile s':>11}")
    rows = []
    for name, overrides in MEMORY_VARIANTS.items():
        fixed = {} if name == "auto" else OFF
        r = dict(measure({**base, **fixed, **overrides}, args.devices), variant=name)
        rows.append(r)
        print(f"  {name:<16}{r['temp_gb']:>16.2f}{r['total_gb']:>10.2f}{r['compile_s']:>11.1f}"
              + (f"  (auto: {r['switches']})" if name == "auto" else ""), flush=True)
    return rows


def compile_table(args) -> list[dict]:
    base = {"seq_len": args.seq_len, "global_batch_size": 1, "mesh.data": 1,
            "mesh.seq": args.devices, **OFF, "model.remat": True}
    kinds = [(layers, scan) for scan in (False, True) for layers in args.layers]
    times, sizes = {k: [] for k in kinds}, {}
    for _ in range(args.reps):  # interleaved: drift on this machine hits every kind alike
        for layers, scan in kinds:
            over = {**base, "model.num_layers": layers, "model.scan_layers": scan}
            figures = measure(over, args.devices)
            times[(layers, scan)].append(figures["compile_s"])
            sizes[(layers, scan)] = figures
    print(f"lower + compile of the train step, configs/default.py at {args.seq_len:,} tokens on "
          f"{args.devices} fake CPU devices, remat on; medians of {args.reps}, interleaved:")
    print(f"  {'layers':>6}  {'scan_layers':<12}{'compile s':>10}{'min':>8}{'max':>8}"
          f"{'vs ' + str(args.layers[0]) + ' layers':>16}{'temporaries GB':>16}"
          f"{'HLO lines':>11}")
    rows = []
    for layers, scan in kinds:
        t = times[(layers, scan)]
        ratio = statistics.median(t) / statistics.median(times[(args.layers[0], scan)])
        size = sizes[(layers, scan)]
        rows.append({"layers": layers, "scan_layers": scan, "median_s": statistics.median(t),
                     "seconds": t, "ratio": ratio, **size})
        print(f"  {layers:>6}  {str(scan):<12}{statistics.median(t):>10.1f}{min(t):>8.1f}"
              f"{max(t):>8.1f}{ratio:>15.2f}x{size['temp_gb']:>16.3f}{size['hlo_lines']:>11,}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["memory", "compile", "one"])
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (memory: 1,048,576; compile: 8,192)")
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices, all on 'seq'")
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.what == "one":
        return one(json.loads(args.overrides), args.devices)
    if args.seq_len is None:
        args.seq_len = 1 << 20 if args.what == "memory" else 8192
    rows = memory_table(args) if args.what == "memory" else compile_table(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
