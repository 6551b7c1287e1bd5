"""Memory and throughput planner: will a run fit on its accelerators, how fast could it go, and
which strategy should it use?

    python scripts/plan.py --config configs/gpu/paper_a100_256k.py
    python scripts/plan.py --config configs/tpu/paper_tpuv4_786k.py --device tpu-v4
    python scripts/plan.py --config configs/gpu/llama_7b.py --config.seq_len=65536 --device h100-80gb
    python scripts/plan.py --config configs/tiny.py --device cpu --compile yes --json /tmp/plan.json
    python scripts/plan.py --config configs/default.py --compile yes --config.parallel.strategy=auto
    python scripts/plan.py --config configs/default.py --documents data      # its own documents
    python scripts/plan.py --config configs/tpu/paper_tpuv4_786k.py --compile tpu  # XLA:TPU's bytes
    python scripts/plan.py --config configs/tiny.py --compile tpu --topology v4-8 \
        --config.mesh.data=1 --config.mesh.seq=4 --config.parallel.tile=128 ...
    python scripts/plan.py --config configs/gpu/llama_1b.py --documents lognormal:7.5:1.5
    python scripts/plan.py --config configs/default.py --config.seq_len=1048576 \
        --config.global_batch_size=1 --config.mesh.seq=8 --config.cpu_devices=8 --explain

Needs no accelerator. Config overrides (--config.FIELD=VALUE) work as in train.py. --device
defaults to the config file's module-level DEVICE (e.g. "a100-80gb"), else "cpu". The device
count is the mesh's (mesh.data x mesh.seq); where the mesh has a -1, --devices (default: 8 on an
accelerator, config.cpu_devices on cpu); where it has none, a --devices other than the mesh's is
refused (exit 2: the launchers pass their job's devices). Every figure is per device unless it says otherwise.

--compile tpu compiles the whole train step with the TPU compiler (XLA:TPU and Mosaic, from the
libtpu package; no TPU needed) for a TPU slice: --topology (e.g. v4-32; default: the slice of
the config's DEVICE with the mesh's chips) and --num_slices; it prints the analytic tables
first, a progress line while the compiler works (45-150 s for a pod config), then the
compiler's per-chip bytes against the chip's HBM, FITS or DOES NOT FIT (exit 1), or, where the
compiler refuses the program, one line naming the piece (exit 1). scripts/tpu_pod.py runs it
before it pays for a slice.

This file reads the flags and prints. The model is the package planner/ (its README derives
every formula); the plan of a run, and the check the launchers call in their own process, is
training/analysis/run_plan.py, the compile training/analysis/aot.py; every 'auto' (the
strategy, the memory switches) is resolved as a run resolves it (planner.resolve_run), and the
plan says what it resolved to (--explain: the memory candidates it weighed).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                 lock_config=True)
flags.DEFINE_string("device", None, "Accelerator to plan for: a key of planner.DEVICES (default: "
                    "the config file's DEVICE, else cpu).")
flags.DEFINE_enum("compile", "auto", ["auto", "yes", "no", "tpu"], "Ahead-of-time compile the "
                  "train step for XLA's memory figures: on fake CPU devices (auto: only small "
                  "problems; yes; no), or by the TPU compiler for a TPU slice (tpu).")
flags.DEFINE_string("topology", None, "With --compile tpu: the TPU slice, as Cloud TPU names it "
                    "(v4-32, v5p-64, v5litepod-16, v6e-16; default: the config's DEVICE with "
                    "the mesh's chip count).")
flags.DEFINE_integer("num_slices", 1, "With --compile tpu: slices joined over the data-centre "
                     "network (multi-slice); the mesh spans all their chips.")
flags.DEFINE_bool("check", False, "The launcher's check (scripts/launch.py): one line "
                  "\"check: ...\" with the verdict, and exit 1 where the train step does not "
                  "fit the device (the TPU compiler's bytes with --compile tpu, else the "
                  "planner's).")
flags.DEFINE_string("json", None, "Write every figure to this JSON file (its \"resolved\": "
                    "what the run would use, every 'auto' filled).")
flags.DEFINE_bool("explain", False, "Also rank every memory-switch candidate the planner "
                  "weighed for the switches the config leaves 'auto'.")
flags.DEFINE_integer("devices", 0, "Device count where the mesh has a -1 (0: 8 on accelerators, "
                     "config.cpu_devices on cpu).")
flags.DEFINE_float("efficiency", 1.0, "Share of the calibrated rates assumed reached (1.0 = as "
                   "calibrated; uncalibrated devices: at peak).")
flags.DEFINE_string("documents", None, "Document lengths to plan with (packed rows, "
                    "data.mask_documents): 'data' samples the run's own first rows (its tokenizer "
                    "and corpus, found or built in --workdir), or a length spec: exp:MEAN, "
                    "lognormal:MU:SIGMA, pareto:ALPHA:MIN, one. Unset: one document per row.")
flags.DEFINE_integer("document_rows", 4, "Rows of documents --documents samples.")
flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "plan"), "Where --documents=data "
                    "finds or builds the tokenizer and token cache (a run's workdir reuses its).")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import run_config
    from data import DataError
    from planner.documents import PlanError
    from planner.reports import text as report
    from planner.reports.plan import measured_times
    from planner.topology import TopologyError
    from training.analysis import run_plan
    from training.cli import fail
    from training.validate import ConfigError
    try:
        config = run_config.build(FLAGS.config)
    except run_config.ConfigError as e:
        fail(str(e))
    filename = config_flags.get_config_filename(FLAGS["config"])
    try:
        target = run_plan.plan_target(config, filename, FLAGS.device, FLAGS.devices,
                                      FLAGS.compile, FLAGS.topology, FLAGS.num_slices)
        planned = run_plan.plan_run(config, target, FLAGS.compile, FLAGS.efficiency,
                                    FLAGS.documents, FLAGS.document_rows, FLAGS.workdir)
    except (run_plan.PlanInputError, ConfigError, DataError, PlanError, TopologyError) as e:
        fail(str(e))
    except run_plan.CompileRefused as e:
        _stop(e)
    plan, device, run, resolved = planned.plan, planned.device, planned.run, planned.resolved
    plan["config_file"] = os.path.relpath(filename, ROOT) if filename.startswith(ROOT) else filename
    plan["measured"] = measured_times(filename, run.layout, run.seq_len)
    print(report.format_plan(plan, config, resolved, device, run), flush=True)
    if FLAGS.explain:
        print("\n" + report.format_candidates(resolved), flush=True)
    if planned.tpu_slice is not None:  # the analytic tables above, while the TPU compiler works
        try:
            run_plan.compile_for_tpu(planned, config)
        except run_plan.CompileRefused as e:
            _stop(e)
        print("\n" + report.format_tpu_compiled(plan))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(dict(plan, config=run_config.to_dict(config)), f, indent=1,
                      default=float)
    if FLAGS.check or planned.tpu_slice is not None:  # the launcher's compile check stops here
        try:
            verdict = run_plan.fit_verdict(planned)
        except run_plan.DoesNotFit as e:
            _stop(e)
        if verdict and FLAGS.check:
            print(verdict)


def _stop(error) -> None:
    """A step that does not compile or fit: one line, exit 1."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    from training.cli import parse_flags
    app.run(main, flags_parser=parse_flags)
