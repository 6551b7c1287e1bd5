"""The planner: will a run fit on its accelerators, how fast could it go, and which strategy
should it use. Below training/ in the import order (it reads parallel/, model/, data/ and
configs/; training/ reads it); scripts/plan.py prints what it computes.

What every run resolves (here):
    devices.py    the accelerators: nominal figures and their calibration
    flops.py      model FLOPs per token, peak FLOP/s (MFU's numerator and denominator)
    run.py        the shape of a planned run (mesh, rows per device, processes)
    memory.py     bytes per device, term by term; fits or not
    step_time.py  time per step: attention (each strategy's own cost), dense, optimizer
    recommend.py  every layout x tile x strategy priced; what 'auto' of each runs
    switches.py   the memory switches a config leaves 'auto': the fastest that fits
    linear_strategy.py, mla_exchange.py   the recurrent layers' strategy, MLA's exchange
    resolve.py    `resolve_run`: the run resolved once (attention, switches, model config)
    attention.py  the configured AttentionChoice of a config (`choice_from_config`)
    documents.py  packed documents to plan with (--documents)
    topology.py   TPU slices as the TPU compiler's topologies
Offline:
    reports/      the whole analytic plan and its text (scripts/plan.py), the model-size table,
                  windowed attention per layout
    calibration/  published and measured step times beside the predictions, the fit, the
                  measurements on this machine, the tables devices.py reads
"""

import importlib

# Each name from its module on first use (PEP 562), so that planner.topology and
# planner.devices, which need only the standard library, import without JAX: the launchers
# check a slice's name in a fraction of a second on a machine that has only gcloud.
_HOMES = {"choice_from_config": "planner.attention", "DEVICES": "planner.devices",
          "Device": "planner.devices", "device_for_kind": "planner.devices",
          "ResolvedRun": "planner.resolve", "resolve_run": "planner.resolve"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
