"""`parallel.strategy='auto'`: the strategy the planner recommends for this run, on this mesh and
device (parallel/strategy_cost.py; scripts/plan.py prints the whole table).

The rows per device, heads, sequence and tiles come from the config; the rates from the device
table (training/devices.py, training/flops.py) for the backend's device kind. One document per
row is assumed (the planner's --documents refines that). The full plan's memory total is the
planner's; here a strategy is only kept out when its own buffers (allgather's gathered sequence
above all) would take more than BUFFER_SHARE of the device's memory.
"""

from __future__ import annotations

import jax.numpy as jnp

from parallel import strategy_cost
from training import flops
from training.devices import device_for_kind
from training.validate import attention_tiles

BUFFER_SHARE = 0.125


def layer_shape(config, mesh_shape, platform: str) -> strategy_cost.LayerShape:
    m, (data, seq) = config.model, mesh_shape
    _, tiles = attention_tiles(config, platform, config.seq_len // seq)
    rows = config.global_batch_size // data // config.optim.grad_accum_steps
    return strategy_cost.LayerShape(
        rows=rows, seq_len=config.seq_len, num_shards=seq, q_heads=m.num_heads,
        kv_heads=m.num_kv_heads, head_dim=m.head_dim,
        itemsize=jnp.dtype(m.get("dtype", "float32")).itemsize,
        layout=config.parallel.layout, tiles=tiles,
        with_segments=bool(config.data.get("mask_documents", False)))


def resolve(config, mesh_shape, platform: str, device_kind: str) -> tuple[str, int, str]:
    """(strategy, Ulysses degree, a line saying why): the config's own choice unless it is
    'auto'; then the recommendation (ties: the smaller buffers)."""
    p = config.parallel
    strategy = p.get("strategy", "ring")
    if strategy != "auto":
        return strategy, p.get("ulysses_degree", 0) or 1, f"{strategy} (configured)"
    device = device_for_kind(device_kind)
    net = strategy_cost.Network(
        flops_per_s=flops.peak_flops(device_kind, config.get("peak_tflops_per_device", 0.0)),
        link_bytes_per_s=device.link_bytes_per_s, latency_s=device.latency_s,
        collective_bytes_per_s=device.collective_rate)
    table = strategy_cost.strategy_table(layer_shape(config, mesh_shape, platform), net)
    limit = BUFFER_SHARE * device.memory_bytes if device.memory_bytes else None
    remat = bool(config.model.get("remat", False))
    best = strategy_cost.recommend(table, remat, limit)
    ring, mine = (strategy_cost.layer_seconds(row, remat) for row in (table[0], best))
    name = best["strategy"] + (f" (ulysses_degree {best['degree']})"
                               if best["strategy"] == "usp" else "")
    return best["strategy"], best["degree"], (
        f"auto -> {name}: predicted {mine * 1e3:.3f} ms of attention per layer against the "
        f"ring's {ring * 1e3:.3f} ms on {device.title}")
