"""How a recurrent layer's rule (Gated DeltaNet's, Mamba2's) crosses the 'seq' devices
(parallel.linear_strategy): one of parallel.recurrent's RECURRENT_STRATEGIES. Each strategy
prices one layer of each kind on one device, forward and backward (its `cost`: FLOPs, bytes,
collectives; parallel/recurrent/state.py and heads.py say what they count); here those become
seconds on the device, summed over the model's recurrent layers, and 'auto' takes the cheapest
that can run.

'state' moves a constant number of bytes whatever the length; 'heads' computes less (no
widening) and moves bytes that grow with it, so short rows and few devices favour 'heads',
long rows 'state'.

    price(cfg, layout, seq_len, num_shards, device) -> {'state': s, 'heads': s | None, ...}
                                                        (all the model's recurrent layers)
    resolve(config, cfg, layout, num_shards, device) -> 'state' | 'heads'
"""

from __future__ import annotations

from parallel.recurrent import BASELINE, RECURRENT_STRATEGIES, get_recurrent_strategy
from planner.flops import peak_flops, recurrent_kinds


def price(cfg, layout: str, seq_len: int, num_shards: int, device, rows: int = 1) -> dict:
    """Seconds of the model's recurrent layers' rules and exchanges on one device, forward and
    backward, for each strategy (None where some kind cannot run it: 'heads' where its groups
    do not split over the devices), and each one's '<name>_bytes' and '<name>_flops'."""
    flops = peak_flops(device.flops_key) * device.calibration.matmul_efficiency
    rate, latency = device.collective_rate, device.latency_s
    out = {}
    for name in RECURRENT_STRATEGIES:
        out.update({name: 0.0, f"{name}_bytes": 0.0, f"{name}_flops": 0.0})
    for layers, x in recurrent_kinds(cfg):
        for name, strategy in RECURRENT_STRATEGIES.items():
            one = strategy.cost(x, layout, seq_len, num_shards, rows)
            out[f"{name}_bytes"] += layers * one["bytes"]
            out[f"{name}_flops"] += layers * one["flops"]
            if out[name] is not None and strategy.runs(x, num_shards):
                out[name] += layers * (one["flops"] / flops + one["bytes"] / rate
                                       + one["collectives"] * latency)
            else:
                out[name] = None
    return out


def resolve(config, cfg, layout: str, num_shards: int, device, rows: int = 1) -> str:
    """parallel.linear_strategy for the run: the config's, or for 'auto' the cheapest by
    `price` that can run; the baseline ('state') for a model without recurrent layers or on
    one 'seq' device. ValueError, one line, for an unknown value or a strategy that cannot run
    the model's layers."""
    wanted = config.parallel.linear_strategy
    if wanted != "auto":
        get_recurrent_strategy(wanted)
    kinds = recurrent_kinds(cfg)
    if not kinds or num_shards == 1:
        return BASELINE
    if wanted != "auto":
        for _, x in kinds:
            get_recurrent_strategy(wanted).check(x.groups, num_shards, x.unit)
        return wanted
    p = price(cfg, layout, config.seq_len, num_shards, device, rows)
    runnable = {name: s for name, s in p.items() if name in RECURRENT_STRATEGIES and s is not None}
    return min(runnable, key=runnable.get)
