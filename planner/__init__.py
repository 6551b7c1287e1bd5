"""The planner: will a run fit on its accelerators, how fast could it go, and which strategy
should it use. Below training/ in the import order (it reads parallel/, model/, data/ and
configs/; training/ reads it); scripts/plan.py prints what it computes.

    devices.py    the accelerators: nominal figures and their calibration
    flops.py      model FLOPs per token, peak FLOP/s (MFU's numerator and denominator)
    run.py        the shape of a planned run (mesh, rows per device, processes)
    memory.py     bytes per device, term by term; fits or not
    time.py       time per step: attention (each strategy's own cost), dense, optimizer
    recommend.py  every layout x tile x strategy priced; what 'auto' of each runs
    switches.py   the memory switches a config leaves 'auto': the fastest that fits
    resolve.py    `resolve_run`: the run resolved once (attention, switches, model config)
    attention.py  the configured AttentionChoice of a config (`choice_from_config`)
    documents.py  packed documents to plan with (--documents)
    sizes.py      what dominates memory; the 1B/3B/7B model-size table
    plan.py       the whole analytic plan; report.py prints it
    calibration.py  published (and here measured) step times beside the predictions
    measure.py    the kernel's tile cost and the matmuls' rate measured on this machine
"""

from planner.attention import choice_from_config
from planner.devices import DEVICES, Device, device_for_kind
from planner.resolve import ResolvedRun, resolve_run

__all__ = ["DEVICES", "Device", "ResolvedRun", "choice_from_config", "device_for_kind",
           "resolve_run"]
