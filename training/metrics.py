"""What the train loop measures besides the loss: throughput and MFU over a window of steps,
peak memory, the held-out loss, and the model's FLOPs a token on the run's own rows."""

from __future__ import annotations

import math
import resource

import jax
import numpy as np
from jax.experimental import multihost_utils

import data
from planner import flops


def model_flops_per_token(config, model_cfg, cache, spec) -> float:
    """planner/flops.py's count; with documents masked, each document's causal triangle, as the
    mean over step 0's rows (the planner's --documents data counts the same rows)."""
    rows = (data.natural_segment_ids(cache, spec, config.global_batch_size)
            if config.data.mask_documents else None)
    return flops.flops_per_token(model_cfg, config.seq_len, segment_ids=rows)


def throughput(config, flops_per_token, mesh, steps: int, seconds: float, peak: float) -> dict:
    """tokens/s (all devices, and a device), seconds a step, model TFLOP/s a device and MFU of
    `steps` steps in `seconds`."""
    tokens = steps * config.tokens_per_step
    tokens_per_sec = tokens / seconds
    tflops = flops_per_token * tokens_per_sec / mesh.size / 1e12
    return {
        "throughput/tokens_per_sec": tokens_per_sec,
        "throughput/tokens_per_sec_per_device": tokens_per_sec / mesh.size,
        "throughput/step_time_s": seconds / steps,
        "throughput/model_tflops_per_device": tflops,
        "throughput/mfu": tflops * 1e12 / peak,
    }


def memory_metrics() -> dict:
    """Peak memory so far, in GB: the largest resident set of any process of the run (the host
    side: batches, the token cache, and on CPU the arrays themselves), and where the runtime
    reports it (GPU, TPU), the largest device's peak allocation."""
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    device_gb = max((s.get("peak_bytes_in_use", 0) for s in stats), default=0) / 1e9
    values = np.array([rss_gb, device_gb])
    if jax.process_count() > 1:  # every process logs at the same steps, so all get here
        values = np.asarray(multihost_utils.process_allgather(values)).max(axis=0)
    out = {"memory/host_peak_rss_gb": float(values[0])}
    if values[1]:
        out["memory/device_peak_gb"] = float(values[1])
    return out


def evaluate(eval_step, params, eval_batches) -> dict:
    """eval/loss (the held-out batches' weighted token mean) and eval/perplexity."""
    total = weight = 0.0
    for batch in eval_batches:
        t, w = eval_step(params, batch)
        total, weight = total + float(t), weight + float(w)
    loss = total / max(weight, 1.0)
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 80.0))}
