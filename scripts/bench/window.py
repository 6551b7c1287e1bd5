"""Local and global layers, per layout and strategy: tiles on the critical path and key/value
tokens received per device per layer, beside full causal attention, and the planner's choice.

    python scripts/bench/window.py --config configs/tpu/gemma3_4b_v5p.py    # 32k tokens, 8 chips
    python scripts/bench/window.py --config configs/gemma3_cpu.py --device cpu --json out.json

Counts, not timings: the tiles come from the rule the kernels run, the tokens from each
strategy's own count, the step times from the planner (planner/reports/windows.py). Needs no
accelerator.
"""

import json
import sys

from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "A run config file.", lock_config=True)
flags.DEFINE_string("device", None, "Device kind (default: the config file's DEVICE).")
flags.DEFINE_string("json", None, "Also write the rows here.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from parallel import get_strategy
    from planner.reports import windows
    from planner.devices import DEVICES
    from planner.reports.plan import module_constant
    import run_config
    config = run_config.build(FLAGS.config)
    filename = config_flags.get_config_filename(FLAGS["config"])
    name = FLAGS.device or module_constant(filename, "DEVICE") or "cpu"
    if name not in DEVICES:
        print(f"error: --device={name!r}: choose one of {', '.join(DEVICES)}", file=sys.stderr)
        sys.exit(2)
    device = DEVICES[name]
    from planner.run import device_count
    devices = device_count(config, name, 0)
    rows = windows.kind_table(config, device, devices)
    kinds = list(rows[0]["kinds"])
    print(f"{config.seq_len:,} tokens over {rows[0]['seq']} devices, {config.model.num_layers} "
          f"layers ({', '.join(kinds)}), tiles {rows[0]['tiles'][0]} x {rows[0]['tiles'][1]}, "
          f"{name}; per device per layer")
    head = " | ".join(f"{k}: tiles | {k}: K/V tokens" for k in kinds)
    print(f"| layout | strategy | {head} | model mean: tiles | model mean: K/V tokens | "
          f"full causal: tiles | full causal: K/V tokens | predicted step (s) |")
    print("|" + "---|" * (2 + 2 * len(kinds) + 5))
    for r in rows:
        name = get_strategy(r["strategy"]).label(r["degree"], r["seq"])
        cells = " | ".join(f"{r['kinds'][k]['critical_path_tiles']:,.0f} | "
                           f"{r['kinds'][k]['kv_tokens']:,.0f}" for k in kinds)
        print(f"| {r['layout']} | {name} | {cells} | {r['model']['critical_path_tiles']:,.0f} | "
              f"{r['model']['kv_tokens']:,.0f} | {r['full_causal']['critical_path_tiles']:,.0f} "
              f"| {r['full_causal']['kv_tokens']:,.0f} | {r['step_s']:.3f} |")
    best = windows.recommended(rows)
    print(f"planner's choice: layout {best['layout']}, strategy "
          f"{get_strategy(best['strategy']).label(best['degree'], best['seq'])}"
          + f": {best['step_s']:.3f} s per step, {best['tokens_per_s']:,.0f} tokens/s")
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump({"rows": rows, "choice": {k: best[k] for k in ("layout", "strategy",
                                                                     "degree")}}, f, indent=1,
                      default=str)


if __name__ == "__main__":
    from training.cli import parse_flags
    flags.mark_flag_as_required("config")
    sys.exit(app.run(main, flags_parser=parse_flags))
