"""The planner against published step times: every measured point predicted, and the device
calibration fitted to the points its table marks for the fit.

    python scripts/calibrate.py                          # configs/tpu/llama3_8b_v5p.py, as calibrated
    python scripts/calibrate.py --fit                    # fit again; print the constants to copy
    python scripts/calibrate.py --config llama3_8b_v5p --json runs/calibration.json
    python scripts/calibrate.py --measure                # this machine: the file the planner reads
    python scripts/calibrate.py --train runs/bench_train.json [--fit [--write]]
                                          # train.py's steps measured here against the planner

The measurements, their source and which points are fitted are data, one table a measured
setting (planner/calibration/step_times/NAME.toml, --config NAME); the fit and the predictions
in planner/calibration/fit.py; the constants in planner/devices.py. This file reads the flags and prints.

--measure times the attention kernel's tiles and the dense matmuls of configs/default.py's
model on this machine, in this process with one device pinned to one core (as each device of
scripts/launch_local.py --pin), and writes the calibration to planner/calibration/tables/<device>.json
(or --out), which the planner reads: what parallel.tile='auto' weighs (planner/calibration/measure.py).
--train predicts the steps scripts/bench/train.py measured here (its --json; documents
unmasked) with that calibration; with --fit, fits the shares of peak and the ring step's costs
to every other kind, holding out the rest, and with --write, puts them in the same file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="llama3_8b_v5p",
                   help="a table of planner/calibration/step_times/ (its name)")
    p.add_argument("--fit", action="store_true", help="fit the calibration again (minutes)")
    p.add_argument("--json", help="write every point and the calibration to this file")
    p.add_argument("--measure", action="store_true",
                   help="measure this machine's device instead (about a minute)")
    p.add_argument("--out", help="--measure: the file to write (default: the planner's)")
    p.add_argument("--core", type=int, default=0, help="--measure: the core to pin to")
    p.add_argument("--train", help="scripts/bench/train.py's --json: its steps as the points")
    p.add_argument("--write", action="store_true",
                   help="--train --fit: write the fit to the planner's calibration file")
    return p.parse_args(argv)


def measure(args) -> None:
    """Times the kernel's tiles and the matmuls here, fits, prints and writes the calibration."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    # One device on one core, its matmuls on that core's thread alone (before jax starts).
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false").strip()
    import jax
    import parallel
    import run_config
    from configs import default
    from planner.calibration import measure as measured
    from planner.devices import DEVICES, calibration_file, device_for_kind
    from planner.flops import peak_flops
    jax.config.update("jax_num_cpu_devices", 1)
    device = device_for_kind(jax.devices()[0].device_kind)
    key = next(k for k, d in DEVICES.items() if d.title == device.title)
    m = run_config.build(default.get_config()).model
    shape = measured.Shape(m.num_heads, m.num_kv_heads, m.head_dim)
    result = measured.measure_calibration(shape, m.d_model, m.mlp_dim,
                                          peak_flops(device.flops_key))
    kernel = parallel.resolve_kernel("auto", jax.default_backend()).name
    t0 = result["calibration"]["tile_overhead_s"]
    rate = result["calibration"]["attention_efficiency"] * peak_flops(device.flops_key)
    print(f"{device.title}: the {kernel} kernel's causal block, forward + backward, "
          f"{m.num_heads} query and {m.num_kv_heads} KV heads of {m.head_dim}")
    print(f"  {'block':>6} {'tile':>5} {'tiles':>7} {'seconds':>9} {'us/tile':>9} "
          f"{'model us':>9} {'model/meas':>10}")
    for r in result["tiles"]:
        model = t0 + r["tile_flops"] / rate
        print(f"  {r['block']:>6} {r['tile']:>5} {r['tiles']:>7,} {r['seconds']:>9.4f} "
              f"{r['seconds_per_tile'] * 1e6:>9.2f} {model * 1e6:>9.2f} "
              f"{model / r['seconds_per_tile']:>10.2f}")
    dense = result["matmul"]
    print(f"  matmuls: {dense['flops_per_s'] / 1e9:.1f} GFLOP/s ({dense['tokens']:,} tokens, "
          f"d_model {m.d_model}, mlp_dim {m.mlp_dim})")
    command = "python scripts/calibrate.py --measure" + (f" --core {args.core}" if args.core
                                                         else "")
    calibration = dict(result["calibration"],
                       source=f"measured here: {command} (one device on one core)")
    print(f"calibration: t0 {t0 * 1e6:.2f} us a tile, attention {rate / 1e9:.1f} GFLOP/s "
          f"({calibration['attention_efficiency']:.3f} of peak), matmuls "
          f"{calibration['matmul_efficiency']:.3f} of peak")
    out = args.out or calibration_file(key)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"device": key, "calibration": calibration, "tiles": result["tiles"],
                   "matmul": dense}, f, indent=1)
    print(f"wrote {os.path.relpath(out)}")


def table(rows, title: str) -> list[str]:
    lines = [title, f"  {'layout':<8}{'seq_len':>8}  {'strategy':<10}{'tile':>9}"
             f"{'measured s':>11}{'predicted s':>12}{'pred/meas':>10}  set"]
    for r in rows:
        tile = "-" if r.get("tile") is None else str(r["tile"])
        lines.append(f"  {r['layout']:<8}{r['seq_len']:>8}  {r['label']:<10}{tile:>9}"
                     f"{r['seconds']:>11.2f}"
                     f"{r['predicted']:>12.2f}{r['ratio']:>10.2f}  "
                     f"{'fit' if r['fitted'] else 'held out'}")
    return lines


def summary(rows) -> list[str]:
    from planner.calibration.fit import fastest
    ratios = [r["ratio"] for r in rows]
    held = [r["ratio"] for r in rows if not r["fitted"]]
    lines = [f"  pred/meas over all {len(rows)} points: {min(ratios):.2f} to {max(ratios):.2f}; "
             f"the {len(held)} held out: {min(held, default=1):.2f} to {max(held, default=1):.2f}"]
    for by_strategy, what in ((True, "strategy"), (False, "option")):
        want, got = fastest(rows, "seconds", by_strategy), fastest(rows, "predicted", by_strategy)
        for where in want:
            agree = got[where] & want[where]
            lines.append(f"  fastest {what:<8} at {where[0]:<6} {where[1]:>6}: measured "
                         f"{' = '.join(sorted(want[where]))}, predicted "
                         f"{' = '.join(sorted(got[where]))}{'' if agree else '  (differs)'}")
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.measure:
        return measure(args)
    from planner.calibration import fit as calibration
    from planner.devices import DEVICES
    try:
        points = (calibration.bench_measurements(args.train) if args.train
                  else calibration.measurements(args.config))
    except ValueError as e:  # bad input: one line, exit 2, as every script here
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if not points:
        print(f"error: {args.train} holds no kind with documents unmasked: run "
              f"scripts/bench/train.py with --layouts", file=sys.stderr)
        sys.exit(2)
    device = DEVICES[points[0].device]
    what = args.train or args.config
    print(f"{what}: {len(points)} {'measured' if args.train else 'published'} points on "
          f"{device.title}; source: {points[0].source}")
    if args.fit:
        # On this machine t0 was timed by --measure: the train fit keeps it.
        names = [n for n in calibration.BOUNDS if not (args.train and n == "tile_overhead_s")]
        fitted = calibration.fit(points, device, tuple(names))
        device = dataclasses.replace(device, calibration=fitted)
        print(f"fitted to the {sum(p.fitted for p in points)} 'fit' points: "
              f"{dataclasses.asdict(fitted)}")
    else:
        print(f"as calibrated (planner/devices.py, planner/calibration/tables/): "
              f"{dataclasses.asdict(device.calibration)}")
    rows = calibration.compare(points, device)
    print("\n".join(table(rows, "Each point: the planner's step time against the measured one")))
    print("\n".join(summary(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calibration": dataclasses.asdict(device.calibration), "points": rows}, f,
                      indent=1)
    if args.write and args.fit and args.train:
        from planner.devices import calibration_file
        out = calibration_file(points[0].device)
        with open(out) as f:
            saved = json.load(f)
        saved["calibration"] = dict(dataclasses.asdict(device.calibration), source=(
            f"{saved['calibration'].get('source', '')}; fitted to train.py's steps: "
            f"python scripts/calibrate.py --train {args.train} --fit --write"))
        saved["train_points"] = rows
        with open(out, "w") as f:
            json.dump(saved, f, indent=1)
        print(f"wrote {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
