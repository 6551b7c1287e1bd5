"""The planner against published step times: every measured point predicted, and the device
calibration fitted to the points the config file marks for the fit.

    python scripts/calibrate.py                          # configs/llama3_8b_v5p.py, as calibrated
    python scripts/calibrate.py --fit                    # fit again; print the constants to copy
    python scripts/calibrate.py --config llama3_8b_v5p --json runs/calibration.json

The measurements, their source and which points are fitted live in the config file (MEASURED,
MEASURED_SOURCE, MEASURED_FIT); the fit and the predictions in planner/calibration.py; the
constants in planner/devices.py. This file reads the flags and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="llama3_8b_v5p", help="configs.<module> with MEASURED")
    p.add_argument("--fit", action="store_true", help="fit the calibration again (minutes)")
    p.add_argument("--json", help="write every point and the calibration to this file")
    return p.parse_args(argv)


def table(rows, title: str) -> list[str]:
    lines = [title, f"  {'layout':<8}{'seq_len':>8}  {'strategy':<10}{'measured s':>11}"
             f"{'predicted s':>12}{'pred/meas':>10}  set"]
    for r in rows:
        lines.append(f"  {r['layout']:<8}{r['seq_len']:>8}  {r['label']:<10}{r['seconds']:>11.2f}"
                     f"{r['predicted']:>12.2f}{r['ratio']:>10.2f}  "
                     f"{'fit' if r['fitted'] else 'held out'}")
    return lines


def summary(rows) -> list[str]:
    from planner.calibration import fastest
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
    from planner import calibration
    from planner.devices import DEVICES
    try:
        points = calibration.measurements(args.config)
    except ValueError as e:  # bad input: one line, exit 2, as every script here
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    device = DEVICES[points[0].device]
    print(f"{args.config}: {len(points)} published points on {device.title}; source: "
          f"{points[0].source}")
    if args.fit:
        fitted = calibration.fit(points, device)
        device = dataclasses.replace(device, calibration=fitted)
        print(f"fitted to the {sum(p.fitted for p in points)} 'fit' points: "
              f"{dataclasses.asdict(fitted)}")
    else:
        print(f"as calibrated (planner/devices.py): {dataclasses.asdict(device.calibration)}")
    rows = calibration.compare(points, device)
    print("\n".join(table(rows, "Each point: the planner's step time against the measured one")))
    print("\n".join(summary(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calibration": dataclasses.asdict(device.calibration), "points": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
