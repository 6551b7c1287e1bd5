"""How a Gated DeltaNet layer's recurrence crosses the 'seq' devices (parallel.linear_strategy,
model/linear_parallel.py): 'state' or 'heads'. The planner prices both for one layer on one
device, forward and backward, and 'auto' takes the cheaper that can run:

    state   compute  the rule over the device's n = S / N tokens, every head, its values widened
                     by dk columns (gated_delta.block_summary carries d S / d S_in), and the fold
                     of the N blocks' summaries
            bytes    the all-gather of (T, R): (N - 1) H (dk^2 + dk dv) float32 a row, the
                     convolution's halo, and for a layout other than 'ring' the all-to-alls to
                     contiguous blocks and back (padded: N - 1 blocks of n tokens each way)
    heads   compute  the rule over all S tokens for H / N heads (no widening)
            bytes    an all-to-all of the inputs (q, k, v channels, g, beta) and one of the
                     outputs, (N - 1) / N of n tokens each; the segment ids' and order's
                     all-gathers. Only where N divides num_key_heads.

Backward moves what forward moves again (the transposed collectives) and computes twice the
forward's FLOPs. 'state' moves a constant number of bytes whatever the length; 'heads' computes
less (no widening) and moves bytes that grow with it, so short rows and few devices favour
'heads', long rows 'state'.

    price(cfg, layout, seq_len, num_shards, device) -> {'state': s, 'heads': s | None, ...}
    resolve(config, cfg, layout, num_shards, device) -> 'state' | 'heads'
"""

from __future__ import annotations

from model.linear_parallel import check_heads
from planner.flops import linear_layers, linear_of, peak_flops, rule_flops

BACKWARD = 2.0  # the backward's FLOPs against the forward's
F32 = 4


def price(cfg, layout: str, seq_len: int, num_shards: int, device, rows: int = 1) -> dict:
    """Seconds of one layer's rule and exchange on one device, forward and backward (module
    docstring): {'state', 'heads' (None where the heads do not split), 'state_bytes',
    'heads_bytes', 'state_flops', 'heads_flops'}. cfg: a ModelConfig with linear_attention."""
    la = linear_of(cfg)
    n, count = seq_len // num_shards, num_shards
    h, dk, dv, c = la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_channels
    fold = count * h * 2.0 * dk * dk * (dk + dv)
    state_flops = rows * (n * rule_flops(la, dv + dk) + fold) * (1 + BACKWARD)
    state_bytes = rows * F32 * ((count - 1) * h * (dk * dk + dk * dv)
                                + (la.conv_kernel - 1) * (c + 1))
    if layout != "ring":  # to contiguous blocks and back
        state_bytes += rows * F32 * (count - 1) * n * (c + 2 * h + 1 + h * dv)
    heads_flops = rows * seq_len * rule_flops(la) / count * (1 + BACKWARD)
    heads_bytes = rows * F32 * ((count - 1) / count * n * (c + 2 * h + h * dv)
                                + (count - 1) * n * 2)
    state_bytes, heads_bytes = 2 * state_bytes, 2 * heads_bytes  # backward moves it again
    flops = peak_flops(device.flops_key) * device.calibration.matmul_efficiency
    rate, latency = device.collective_rate, device.latency_s
    try:
        check_heads(la.num_key_heads, count)
        heads = heads_flops / flops + heads_bytes / rate + 6 * latency
    except ValueError:
        heads = None
    collectives = 4 + (4 if layout != "ring" else 0)
    return {"state": state_flops / flops + state_bytes / rate + collectives * latency,
            "heads": heads, "state_bytes": state_bytes, "heads_bytes": heads_bytes,
            "state_flops": state_flops, "heads_flops": heads_flops}


def resolve(config, cfg, layout: str, num_shards: int, device, rows: int = 1) -> str:
    """parallel.linear_strategy for the run: the config's, or for 'auto' the cheaper by `price`
    that can run; 'state' for a model without Gated DeltaNet layers or on one 'seq' device.
    ValueError, one line, for an unknown value or 'heads' where the key heads do not split."""
    wanted = config.parallel.linear_strategy
    if wanted not in ("state", "heads", "auto"):
        raise ValueError(f"parallel.linear_strategy={wanted!r}: choose 'state', 'heads' or "
                         f"'auto'")
    if not linear_layers(cfg) or num_shards == 1:
        return "state"
    if wanted == "heads":
        check_heads(linear_of(cfg).num_key_heads, num_shards)
    if wanted != "auto":
        return wanted
    p = price(cfg, layout, config.seq_len, num_shards, device, rows)
    return "heads" if p["heads"] is not None and p["heads"] < p["state"] else "state"
