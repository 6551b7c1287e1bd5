"""How a recurrent layer's rule (Gated DeltaNet's, Mamba2's) crosses the 'seq' devices
(parallel.linear_strategy, model/linear_parallel.py): 'state' or 'heads'. The planner prices both
for one layer of each kind on one device, forward and backward, summed over the model's recurrent
layers, and 'auto' takes the cheaper that can run (H heads of a dk x dv state; Mamba2: N x P):

    state   compute  the rule over the device's n = S / N tokens, every head, its values widened
                     by dk columns (gated_delta.block_summary carries d S / d S_in), and the fold
                     of the N blocks' summaries
            bytes    the all-gather of (T, R): (N - 1) H (dk^2 + dk dv) float32 a row, the
                     convolution's halo; zigzag's halves pass their states in place (2N
                     summaries) where that is fewer bytes than moving its tokens to contiguous
                     blocks and back (model/linear_parallel.pieces_in_place), which striped
                     (the tokens that leave a device, at most n) and balanced (N - 1 padded
                     blocks of n each way) always do
    heads   compute  the rule over all S tokens for H / N heads (no widening)
            bytes    an all-to-all of the inputs (q, k, v channels, g, beta) and one of the
                     outputs, (N - 1) / N of n tokens each; the segment ids' and order's
                     all-gathers. Only where N divides the groups (key heads; Mamba2's groups).

Backward moves what forward moves again (the transposed collectives) and computes twice the
forward's FLOPs. 'state' moves a constant number of bytes whatever the length; 'heads' computes
less (no widening) and moves bytes that grow with it, so short rows and few devices favour
'heads', long rows 'state'.

    price(cfg, layout, seq_len, num_shards, device) -> {'state': s, 'heads': s | None, ...}
                                                        (all the model's recurrent layers)
    resolve(config, cfg, layout, num_shards, device) -> 'state' | 'heads'
"""

from __future__ import annotations

from model.linear_parallel import check_heads, pieces_in_place
from parallel.layouts import get_layout
from planner.flops import peak_flops, recurrent_kinds

BACKWARD = 2.0  # the backward's FLOPs against the forward's
F32 = 4


def price(cfg, layout: str, seq_len: int, num_shards: int, device, rows: int = 1) -> dict:
    """Seconds of the model's recurrent layers' rules and exchanges on one device, forward and
    backward (module docstring): {'state', 'heads' (None where some kind's groups do not split
    over the devices), 'state_bytes', 'heads_bytes', 'state_flops', 'heads_flops'}."""
    flops = peak_flops(device.flops_key) * device.calibration.matmul_efficiency
    rate, latency = device.collective_rate, device.latency_s
    out = dict.fromkeys(("state", "heads", "state_bytes", "heads_bytes", "state_flops",
                         "heads_flops"), 0.0)
    for layers, x in recurrent_kinds(cfg):
        one = _one_layer(x, layout, seq_len, num_shards, rows)
        for key, value in one.items():
            out[key] += layers * value
        out["state"] += layers * (one["state_flops"] / flops + one["state_bytes"] / rate
                                  + (4 + (4 if layout != "ring" else 0)) * latency)
        if out["heads"] is not None and x.groups % num_shards == 0:
            out["heads"] += layers * (one["heads_flops"] / flops + one["heads_bytes"] / rate
                                      + 6 * latency)
        else:
            out["heads"] = None
    return out


def _one_layer(x, layout: str, seq_len: int, count: int, rows: int) -> dict:
    """One layer's FLOPs and bytes with each strategy (x: a model.mixers.RecurrentShape)."""
    n = seq_len // count
    h, dk, dv, c = x.heads, x.key_dim, x.value_dim, x.conv_channels
    fold = count * h * 2.0 * dk * dk * (dk + dv)
    state_flops = rows * (n * x.rule_flops(dv + dk) + fold) * (1 + BACKWARD)
    state_bytes = rows * F32 * ((count - 1) * h * (dk * dk + dk * dv)
                                + (x.conv_kernel - 1) * (c + 1))
    token = c + 2 * h + 1 + h * dv  # a token's inputs, segment id and output
    pieces = pieces_in_place(layout, n, count, h * dk * (dk + dv), token)
    if pieces is not None:  # zigzag's halves pass their states in place: N (P - 1) more
        state_bytes += rows * F32 * count * (pieces.shape[1] - 1) * h * (dk * dk + dk * dv)
    elif layout != "ring":  # to contiguous blocks and back (parallel/contiguous.py): a static
        # layout moves the tokens that leave the device (at most n), balanced N - 1 padded blocks
        moved = (count - 1) * n if get_layout(layout).data_dependent else n
        state_bytes += rows * F32 * moved * token
    heads_flops = rows * seq_len * x.rule_flops() / count * (1 + BACKWARD)
    heads_bytes = rows * F32 * ((count - 1) / count * n * (c + 2 * h + h * dv)
                                + (count - 1) * n * 2)
    # backward moves it all again (the transposed collectives)
    return {"state_flops": state_flops, "heads_flops": heads_flops,
            "state_bytes": 2 * state_bytes, "heads_bytes": 2 * heads_bytes}


def resolve(config, cfg, layout: str, num_shards: int, device, rows: int = 1) -> str:
    """parallel.linear_strategy for the run: the config's, or for 'auto' the cheaper by `price`
    that can run; 'state' for a model without recurrent layers or on one 'seq' device.
    ValueError, one line, for an unknown value or 'heads' where the groups do not split."""
    wanted = config.parallel.linear_strategy
    if wanted not in ("state", "heads", "auto"):
        raise ValueError(f"parallel.linear_strategy={wanted!r}: choose 'state', 'heads' or "
                         f"'auto'")
    kinds = recurrent_kinds(cfg)
    if not kinds or num_shards == 1:
        return "state"
    if wanted == "heads":
        for _, x in kinds:
            check_heads(x.groups, num_shards, "Gated DeltaNet layers' key heads" if x.solves
                        else "Mamba2 layers' groups")
    if wanted != "auto":
        return wanted
    p = price(cfg, layout, config.seq_len, num_shards, device, rows)
    return "heads" if p["heads"] is not None and p["heads"] < p["state"] else "state"
