"""Time per step: attention per layer (each strategy's own cost, parallel/strategy_cost.py), the
dense matmuls overlapped with the FSDP traffic, and the optimizer; the calibrated shares of the
device's nominal rates (planner/devices.py) applied once, here, in `network`."""

from __future__ import annotations

import math

import numpy as np

from model import mixers
from model.config import FULL
from model.mixers import recurrent_layers
from parallel import cost, strategies, strategy_cost
from parallel.choice import MLA_BASELINE
from parallel.kernels import resolve_kernel
from parallel.recurrent import BASELINE as RECURRENT_BASELINE
from planner.devices import Device
from planner import linear_strategy as recurrent_prices
from planner.flops import experts_of, layer_windows, matmul_params, peak_flops
from planner.memory import dtype_bytes, param_counts, _chunk
from planner.run import Run

# a rule's forward and backward are 1 + 2 forwards; in pieces each piece's forward runs again
PIECE_RECOMPUTE = 4 / 3

def network(device: Device, efficiency: float = 1.0) -> strategy_cost.Network:
    """The attention's rates on `device`: its calibrated kernel share of peak, links and
    collectives, the ring step's fixed cost and exposed transfer, a tile's fixed cost and how
    the platform's kernel pays it; x `efficiency` (1: as calibrated)."""
    cal = device.calibration
    kernel = resolve_kernel("auto", device.platform)  # the kernel its calibration measured
    return strategy_cost.Network(
        flops_per_s=peak_flops(device.flops_key) * cal.attention_efficiency * efficiency,
        link_bytes_per_s=device.link_bytes_per_s * efficiency,
        collective_bytes_per_s=device.collective_rate * efficiency,
        latency_s=device.latency_s + cal.ring_step_s, hop_exposed=cal.hop_exposed,
        tile_overhead_s=cal.tile_overhead_s, grid=kernel.grid)


def layer_shape(m, run: Run, layout: str, tiles, with_segments: bool, window=None,
                mla_exchange: str = MLA_BASELINE):
    """One attention layer on one device, as parallel.strategy_cost takes it (window: a
    sliding layer's; mla_exchange: what latent attention passes, the run's choice's)."""
    attending = mixers.mixer_of(m, FULL)
    kv_heads, head_dim = attending.kernel_heads(m)  # latent attention: every head, the width
    return strategy_cost.LayerShape(
        rows=run.rows, seq_len=run.seq_len, num_shards=run.seq, q_heads=m.num_heads,
        kv_heads=kv_heads, head_dim=head_dim, itemsize=dtype_bytes(m.dtype),
        layout=layout, tiles=tuple(tiles), with_segments=with_segments, window=window,
        latent_width=attending.exchanged_width(m, mla_exchange))


def ring_step_tiles(layout: str, num_shards: int, block: int, tiles, documents=None) -> list:
    """Tiles the slowest device computes on each ring step (mean over the rows of `documents`).
    Closed forms for one document, T tiles per side: ring [T(T+1)/2, T^2 x (N-1)], striped
    [T(T+1)/2 x N], zigzag and balanced [T(T+1)/2, T^2/2 x (N-1)]."""
    counts = cost.step_tile_counts(layout, num_shards, block, tiles, documents)
    return counts.max(axis=1).mean(axis=0).tolist()


def document_efficiency(counts, documents, tiles) -> float:
    """Mean over rows of single-device tiles / N / critical path (cost.document_efficiency)."""
    return float(np.mean([cost.document_efficiency(c, cost.single_device_tiles(seg, *tiles))
                          for c, seg in zip(counts, documents)]))


def attention_layer_seconds(m, run: Run, layout: str, tiles, net: strategy_cost.Network,
                            with_segments: bool, documents=None, strategy: str = "ring",
                            degree: int = 1, window=None,
                            mla_exchange: str = MLA_BASELINE) -> dict:
    """One layer's attention, forward (twice when remat reruns it) and backward, on the
    critical path; with documents [R, S] (segment ids of sample rows), the mean row's; window:
    a sliding layer's."""
    shape = layer_shape(m, run, layout, tiles, with_segments, window, mla_exchange)
    counts = cost.step_tile_counts(layout, run.seq, run.block, tiles, documents, shape.mask)
    est = strategies.estimate(shape, net, strategy, degree, documents, step_counts=counts)
    critical = counts.max(axis=1).mean(axis=0)
    compute = strategy_cost.step_seconds(shape, net, counts, shape.pair_tiles)
    compute = compute.max(axis=1).mean(axis=0).tolist()
    kv = strategy_cost.block_bytes(shape, shape.kv_heads)[1] / net.link_bytes_per_s
    kv = kv if run.seq > 1 else 0.0
    return {"tiles_per_side": run.block / math.sqrt(tiles[0] * tiles[1]),
            "critical_path_tiles": float(critical.sum()),
            "forward_s": est["forward_s"], "backward_s": est["backward_s"],
            "seconds": est["forward_s"] * (2 if m.reruns_attention else 1) + est["backward_s"],
            "hop_compute_s_min": min(compute), "hop_transfer_s": kv,
            "comm_bound_forward_steps": sum(c < kv for c in compute[:-1]),
            "document_efficiency": (None if documents is None
                                    else document_efficiency(counts, documents, tiles)),
            "bytes_sent": est["bytes_sent"], "buffer_bytes": est["buffer_bytes"]}


def dense_seconds(m, run: Run, device: Device, efficiency: float = 1.0) -> dict:
    """Matmuls outside attention overlapped with FSDP gathers/scatters: 6 P_mm FLOPs per token
    (forward + backward), + 2 P_mm when remat recomputes the block's matmuls (every policy but
    'dots', which keeps them), + 2 x the MLP's when mlp_chunk recomputes it chunk by chunk;
    at the calibrated matmul share of peak. The traffic (2 all-gathers of the weights, 1
    reduce-scatter of the gradients) runs at the device's collective rate."""
    counts, p = param_counts(m), dtype_bytes(m.param_dtype)
    active = matmul_params(m)  # an expert layer's router and top_k experts
    dense_layers = m.num_layers - len(experts_of(m).sparse_layers(m.num_layers))
    dense_mlp = dense_layers * 3 * m.d_model * m.mlp_dim  # what mlp_chunk recomputes
    per_token = (6 * active + (2 * active if m.reruns_matmuls else 0)
                 + (2 * dense_mlp if _chunk(m.mlp_chunk, run.block) else 0))
    flops = per_token * run.rows * run.block
    rate = peak_flops(device.flops_key) * device.calibration.matmul_efficiency * efficiency
    traffic = 3 * (run.devices - 1) / run.devices * counts["total"] * p
    compute, comm = flops / rate, traffic / (device.collective_rate * efficiency)
    exchange = expert_exchange_bytes(m, run)
    exchange_s = exchange / (device.collective_rate * efficiency)
    return {"flops": flops, "compute_s": compute, "fsdp_traffic_bytes": traffic,
            "fsdp_comm_s": comm, "expert_exchange_bytes": exchange,
            "expert_exchange_s": exchange_s, "seconds": max(compute, comm) + exchange_s}


def expert_exchange_bytes(m, run: Run) -> float:
    """Bytes one device sends in a step's all-to-alls of the expert layers (parallel/experts.py
    exchange): each of a sparse layer's all-to-alls moves, of a device's T tokens' T k pairs,
    X - 1 padded slots of T k rows (XLA:CPU, no ragged collectives), or with ragged
    all-to-alls (TPU, GPU) the pairs bound for the other X - 1 devices, (X - 1) / X of them
    when the routing is even; two in the forward (there and back), two in the backward, two
    more when remat recomputes the forward. Not hidden behind compute in this model."""
    moe = experts_of(m)
    sparse = len(moe.sparse_layers(m.num_layers))
    if not sparse or moe.expert_devices == 1:
        return 0.0
    x = moe.expert_devices
    rows = run.rows * run.block * moe.top_k * ((x - 1) / x if moe.ragged_exchange else x - 1)
    passes = 4 + (2 if m.remat else 0)
    return sparse * passes * rows * m.d_model * dtype_bytes(m.dtype)  # a micro-step's


def linear_layers_seconds(m, run: Run, layout: str, device: Device,
                          linear_strategy: str = RECURRENT_BASELINE) -> float:
    """A micro-step's recurrent layers (Gated DeltaNet, Mamba2), forward and backward: their
    rules and exchanges as planner/linear_strategy.py prices them, by the run's linear_strategy
    (the cheaper that runs while it is still 'auto'); on one 'seq' device the rule alone. In
    pieces (model.linear_chunk; 'heads' runs whole) each piece's forward runs again in the
    backward, and 'state' runs the block twice (parallel/recurrent/pieces.py: a summarising pass)."""
    if not recurrent_layers(m):
        return 0.0
    prices = recurrent_prices.price(m, layout, run.seq_len, run.seq, device, run.rows)
    pieced = PIECE_RECOMPUTE if _chunk(m.linear_chunk, run.block) else 1.0
    if run.seq == 1:
        return prices["heads"] * pieced  # the whole row, every head: no exchange, no widening
    state = prices["state"] * (2 * pieced if pieced > 1 else 1.0)
    if prices["heads"] is None:
        return state
    return prices["heads"] if linear_strategy == "heads" else min(state, prices["heads"])


def optimizer_seconds(m, run: Run, device: Device, efficiency: float = 1.0) -> float:
    """About 8 parameter-sized HBM passes (clip + AdamW) over this device's shard."""
    shard_bytes = param_counts(m)["total"] * dtype_bytes(m.param_dtype) / run.devices
    return 8 * shard_bytes / (device.hbm_bytes_per_s * efficiency)


def step_time(m, run: Run, choice_tiles, layout: str, device: Device, efficiency: float,
              mask_documents: bool, model_flops: float, documents=None, strategy: str = "ring",
              degree: int = 1, mla_exchange: str = MLA_BASELINE,
              linear_strategy: str = RECURRENT_BASELINE) -> dict:
    """Predicted step time, tokens/s and MFU for one layout and strategy on tiles
    `choice_tiles`, the latent and recurrent layers passing what the choice says
    (AttentionChoice.exchanges())."""
    net = network(device, efficiency)
    # a model of Gated DeltaNet layers alone still reports a full layer's figures (0 of them)
    kinds = {window: (layers, attention_layer_seconds(
        m, run, layout, choice_tiles, net, mask_documents, documents, strategy=strategy,
        degree=degree, window=window, mla_exchange=mla_exchange))
        for window, layers in (layer_windows(m) or {None: 0}).items()}
    attention_s = sum(layers * attn["seconds"] for layers, attn in kinds.values())
    attention_s += linear_layers_seconds(m, run, layout, device, linear_strategy) / efficiency
    # The report's layer: a full-attention one where the model has them, else a sliding one.
    attn = kinds[None][1] if None in kinds else next(iter(kinds.values()))[1]
    dense = dense_seconds(m, run, device, efficiency)
    opt = optimizer_seconds(m, run, device, efficiency)
    seconds = run.accum * (attention_s + dense["seconds"]) + opt
    peak = peak_flops(device.flops_key)
    return {"layout": layout, "strategy": strategy, "degree": degree,
            "tiles": list(choice_tiles), "attention_layer": attn, "dense": dense,
            "sliding_layer": next((a for w, (_, a) in kinds.items() if w is not None), None),
            "attention_s": run.accum * attention_s,
            "dense_s": run.accum * dense["seconds"], "optimizer_s": opt, "step_s": seconds,
            "tokens_per_s": run.tokens_per_step / seconds,
            "mfu": model_flops / (seconds * run.devices * peak)}
