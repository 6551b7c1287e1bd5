"""The planner's analytic model, printed by scripts/plan.py (whose docstring derives every
formula): the accelerators it knows, the shape of a run, and the memory and time per step."""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from training.devices import DEVICES, Device  # noqa: E402,F401  (plan.py imports them here)

GB = 1e9
FIT_FRACTION = 0.9  # "fits" if the analytic total is at most this share of the device memory


# ------------------------------------------------------------------------------ run shape

@dataclasses.dataclass(frozen=True)
class Run:
    """The sizes the formulas need, resolved from the config and the device count."""

    devices: int
    data: int
    seq: int  # N, the ring
    seq_len: int
    global_batch: int
    accum: int
    layout: str

    @property
    def block(self) -> int:  # n: tokens of one sequence per device
        return self.seq_len // self.seq

    @property
    def rows(self) -> int:  # b: sequences per device in one micro-step
        return self.global_batch // self.data // self.accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def mesh_shape(data: int, seq: int, devices: int) -> tuple[int, int]:
    """(data, seq) with a -1 filled from the device count (both -1: data 1), as make_mesh does."""
    if data == -1 and seq == -1:
        data = 1
    if data == -1:
        data = devices // seq
    if seq == -1:
        seq = devices // data
    return data, seq


def device_count(config, device_name: str, given: int) -> int:
    """mesh.data x mesh.seq when both are set; else --devices, else 8 (cpu: cpu_devices)."""
    if config.mesh.data > 0 and config.mesh.seq > 0:
        return config.mesh.data * config.mesh.seq
    if given:
        return given
    return config.cpu_devices if device_name == "cpu" else 8


def make_run(config, devices: int) -> Run:
    data, seq = mesh_shape(config.mesh.data, config.mesh.seq, devices)
    return Run(devices=devices, data=data, seq=seq, seq_len=config.seq_len,
               global_batch=config.global_batch_size, accum=config.optim.grad_accum_steps,
               layout=config.parallel.layout)


def process_count(device: Device, devices: int) -> int:
    """One process per host: GPUs 8 per host, TPU v4/v5p/v5e 4 chips per host (assumed)."""
    return max(1, math.ceil(devices / device.chips_per_host))


def process_block(run: Run, processes: int) -> tuple[int, int]:
    """(rows, columns) of each global batch one process builds (data/pipeline.local_block),
    with a host's devices consecutive on the mesh, 'seq' fastest: a host smaller than the ring
    holds a slice of each of its rows' columns; a larger one, whole rows."""
    per_host = max(1, run.devices // processes)
    rows = run.global_batch // run.data
    if per_host <= run.seq:
        return rows, run.seq_len * per_host // run.seq
    return rows * (per_host // run.seq), run.seq_len


def tile_sizes(m, layout: str, block: int, device: Device) -> tuple[int, int]:
    """(tile_q, tile_k): the config's, or (0 in the config) parallel's default for this layout
    and the kernel the run will use on this device."""
    import parallel
    largest = parallel.resolve_kernel(m.attention_kernel, device.platform).max_tiles
    return (m.tile_q or parallel.default_tile(layout, block, largest[0]),
            m.tile_k or parallel.default_tile(layout, block, largest[1]))


# ------------------------------------------------------------------------------ parameters

def param_counts(m) -> dict:
    """Parameter counts of model.Transformer for a ModelConfig `m`.

    matmul  = training.flops.matmul_params: L (d Dh (2H + 2K) + 3 d F) + d V (output head)
    total   = matmul + V d (embedding; not with tied embeddings) + (2L + 1) d (RMSNorm scales)
    vectors = (2L + 1) d, replicated; every other parameter is a matrix, sharded over all devices
    layer   = d Dh (2H + 2K) + 3 d F, the matrices of one block
    """
    from training.flops import matmul_params
    matmul = matmul_params(m)
    embed = 0 if m.tie_embeddings else m.vocab_size * m.d_model
    vectors = (2 * m.num_layers + 1) * m.d_model
    attention = m.d_model * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
    layer = attention + 3 * m.d_model * m.mlp_dim
    return {"total": matmul + embed + vectors, "matmul": matmul, "matrices": matmul + embed,
            "vectors": vectors, "layer": layer}


# ------------------------------------------------------------------------------ memory

def state_memory(m, run: Run) -> dict:
    """Bytes per device of parameters, AdamW state and gradients under FSDP over all devices."""
    counts, p = param_counts(m), _bytes(m.param_dtype)
    params = (counts["matrices"] / run.devices + counts["vectors"]) * p
    return {"parameters": params, "optimizer_state": 2 * params,
            "gradients": params * (2 if run.accum > 1 else 1),
            "fsdp_gather": 2 * max(counts["layer"], m.vocab_size * m.d_model) * p}


def gather_all_bytes(m) -> float:
    """2 (L P_layer + V d) p: every layer's gathered weights and full gradient alive at once.

    What XLA:CPU's compile of this program holds (its temporaries grow by exactly 2 P_layer p per
    layer): the forward's all-gathers are kept for the backward instead of being re-issued layer
    by layer. The embedding table is looked up sharded, so it is not counted.
    """
    counts = param_counts(m)
    return 2 * (m.num_layers * counts["layer"] + m.vocab_size * m.d_model) * _bytes(m.param_dtype)


def activation_memory(m, run: Run, tiles: tuple[int, int]) -> dict:
    """Bytes per device of activations; the formulas are in plan.py's docstring table."""
    b, n, c, f32 = run.rows, run.block, _bytes(m.dtype), 4
    d, heads, kv, dh, v = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size
    kept = 1 if m.remat else m.num_layers  # layers whose saved values are alive at once
    tokens = b * n
    mlp_chunk, loss_chunk = _chunk(m.mlp_chunk, n), m.loss_chunk  # loss: chunk <= n
    return {
        "block_inputs": (m.num_layers * tokens * d * c) if m.remat else 0,
        "norms": kept * tokens * 2 * (2 * c * d + f32),
        # Whole: 6 [b, n, F] saved per layer. Chunked: nothing saved (the MLP's input is the
        # norm's output, counted there); one chunk's 6 [b, k, F] while it is recomputed.
        "swiglu": (kept * tokens if not mlp_chunk else b * mlp_chunk) * 6 * c * m.mlp_dim,
        "attention_residuals": kept * tokens * (c * dh * (2 * heads + 2 * kv) + f32 * heads
                                                + 2 * f32 * dh),
        # remat_policy 'dots': every layer keeps its q, k, v, o, gate and up matmul outputs.
        "dot_outputs": (m.num_layers * tokens * c * (dh * (heads + 2 * kv) + d + 2 * m.mlp_dim)
                        if m.remat and m.remat_policy == "dots" else 0),
        "kv_ring_buffers": tokens * (4 * c * kv * dh + 4 * f32 * kv * dh + 2 * 4),
        "kernel_accumulators": tokens * f32 * (heads * dh + heads),
        "tile_scratch": 3 * f32 * b * heads * tiles[0] * tiles[1],
        "final_norm": tokens * ((2 if not loss_chunk else 1) * c * d + f32),
        # Whole: float32 [b, n, V] exp saved by logsumexp, then its gradient. Chunked: dx
        # [b, n, d] saved, a float32 dW [d, V], and one chunk's logits, probabilities, one-hot
        # and dlogits (4 float32 [b, k, V] + one in the compute dtype).
        "logits": (2 * f32 * tokens * v if not loss_chunk
                   else tokens * c * d + f32 * d * v + b * loss_chunk * v * (4 * f32 + c)),
    }


def saved_activation_bytes(m, run: Run, tiles: tuple[int, int]) -> float:
    """What autodiff keeps between the forward and the backward (the part of
    activation_memory that jax's saved_residuals lists; tests/test_plan.py checks it)."""
    t = activation_memory(m, run, tiles)
    chunked_mlp = _chunk(m.mlp_chunk, run.block)
    per_layer = t["norms"] + t["attention_residuals"] + (0 if chunked_mlp else t["swiglu"])
    if m.loss_chunk:
        loss = run.rows * run.block * _bytes(m.dtype) * m.d_model  # dx
    else:
        loss = t["logits"] / 2  # the exp; the gradient comes later
    return (t["block_inputs"] + t["dot_outputs"] + t["final_norm"] + loss
            + (0 if m.remat else per_layer))


def _chunk(chunk: int, block: int) -> int:
    """The tokens per chunk of an MLP chunked by mlp_chunk, 0 when model/chunks.py runs it
    whole (its rule, chunks.splits)."""
    from model.chunks import splits
    return chunk if splits(chunk, block) else 0


def fit(total: float, device: Device) -> dict:
    """Verdict against the nominal memory: fits (<= 90%), tight (90-100%), does not fit."""
    share = total / device.memory_bytes
    verdict = ("fits" if share <= FIT_FRACTION else "tight" if share <= 1.0 else "does not fit")
    return {"total_bytes": total, "device_bytes": device.memory_bytes, "share": share,
            "headroom_bytes": device.memory_bytes - total, "verdict": verdict}


# ------------------------------------------------------------------------------ time

def step_tile_counts(layout: str, num_shards: int, block: int, tiles: tuple[int, int],
                     documents=None):
    """tiles[r, d, s]: tiles device d computes on ring step s for row r (parallel.cost, the
    rule the kernels run); documents: segment ids [R, S] of packed rows, or None."""
    from parallel import cost
    return cost.step_tile_counts(layout, num_shards, block, tiles, documents)


def ring_step_tiles(layout: str, num_shards: int, block: int, tiles: tuple[int, int],
                    documents=None) -> list:
    """Tiles the slowest device computes on each ring step (mean over the rows of `documents`).
    Closed forms for one document, T tiles per side: ring [T(T+1)/2, T^2 x (N-1)], striped
    [T(T+1)/2 x N], zigzag and balanced [T(T+1)/2, T^2/2 x (N-1)].
    """
    counts = step_tile_counts(layout, num_shards, block, tiles, documents)
    return counts.max(axis=1).mean(axis=0).tolist()


def document_efficiency(counts, documents, tiles: tuple[int, int]) -> float:
    """Mean over rows of single-device tiles / N / critical path (cost.document_efficiency):
    counts [R, N, N] from step_tile_counts, documents [R, S]."""
    from parallel import cost
    return float(np.mean([cost.document_efficiency(c, cost.single_device_tiles(seg, *tiles))
                          for c, seg in zip(counts, documents)]))


def ring_transfer_bytes(m, run: Run, with_segments: bool) -> tuple[float, float]:
    """(KV bytes a device sends per forward hop, extra float32 dK/dV bytes per backward hop)."""
    b, n, kv_elems = run.rows, run.block, run.rows * run.block * m.num_kv_heads * m.head_dim
    kv = 2 * kv_elems * _bytes(m.dtype) + (4 * b * n if with_segments else 0)
    return kv, 2 * kv_elems * 4


def layer_shape(m, run: Run, layout: str, tiles: tuple[int, int], with_segments: bool):
    """One attention layer on one device, as parallel.strategy_cost takes it."""
    from parallel.strategy_cost import LayerShape
    return LayerShape(rows=run.rows, seq_len=run.seq_len, num_shards=run.seq,
                      q_heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                      itemsize=_bytes(m.dtype), layout=layout, tiles=tuple(tiles),
                      with_segments=with_segments)


def attention_layer_seconds(m, run: Run, layout: str, tiles: tuple[int, int], rate: float,
                            link: float, with_segments: bool, documents=None,
                            latency: float = 0.0, collective: float | None = None,
                            strategy: str = "ring", degree: int = 1) -> dict:
    """One layer's attention, forward (x2 with remat) and backward, on the critical path
    (parallel.strategy_cost's formulas); with documents [R, S] (segment ids of sample rows),
    the mean row's."""
    from parallel.strategy_cost import Network, estimate
    tq, tk = tiles
    shape = layer_shape(m, run, layout, tiles, with_segments)
    net = Network(flops_per_s=rate, link_bytes_per_s=link, latency_s=latency,
                  collective_bytes_per_s=link if collective is None else collective)
    counts = step_tile_counts(layout, run.seq, run.block, tiles, documents)
    est = estimate(shape, net, strategy, degree, documents, step_counts=counts)
    tile_flops = 4 * run.rows * tq * tk * m.head_dim * m.num_heads
    compute = [t * tile_flops / rate for t in counts.max(axis=1).mean(axis=0).tolist()]
    kv = ring_transfer_bytes(m, run, with_segments)[0] / link if run.seq > 1 else 0.0
    return {"tiles_per_side": run.block / math.sqrt(tq * tk),
            "critical_path_tiles": sum(compute) * rate / tile_flops,
            "forward_s": est["forward_s"], "backward_s": est["backward_s"],
            "seconds": est["forward_s"] * (2 if m.remat else 1) + est["backward_s"],
            "hop_compute_s_min": min(compute), "hop_transfer_s": kv,
            "comm_bound_forward_steps": sum(c < kv for c in compute[:-1]),
            "document_efficiency": (None if documents is None
                                    else document_efficiency(counts, documents, tiles)),
            "bytes_sent": est["bytes_sent"], "buffer_bytes": est["buffer_bytes"]}


def dense_seconds(m, run: Run, rate: float, link: float) -> dict:
    """Matmuls outside attention overlapped with FSDP gathers/scatters: 6 P_mm FLOPs per token
    (forward + backward), + 2 P_mm when remat recomputes the block's matmuls (policy
    'nothing'; 'dots' keeps them), + 2 x the MLP's when mlp_chunk recomputes it chunk by chunk."""
    counts, p = param_counts(m), _bytes(m.param_dtype)
    mlp_params = 3 * m.d_model * m.mlp_dim * m.num_layers
    per_token = (6 * counts["matmul"] + (2 * counts["matmul"] if m.remat and
                                         m.remat_policy == "nothing" else 0)
                 + (2 * mlp_params if _chunk(m.mlp_chunk, run.block) else 0))
    flops = per_token * run.rows * run.block
    traffic = 3 * (run.devices - 1) / run.devices * counts["total"] * p
    compute, comm = flops / rate, traffic / link
    return {"flops": flops, "compute_s": compute, "fsdp_traffic_bytes": traffic,
            "fsdp_comm_s": comm, "seconds": max(compute, comm)}


def optimizer_seconds(m, run: Run, device: Device, efficiency: float) -> float:
    """About 8 parameter-sized HBM passes (clip + AdamW) over this device's shard."""
    shard_bytes = param_counts(m)["total"] * _bytes(m.param_dtype) / run.devices
    return 8 * shard_bytes / (device.hbm_bytes_per_s * efficiency)


def step_time(m, run: Run, layout: str, device: Device, efficiency: float, mask_documents: bool,
              model_flops: float, documents=None, strategy: str = "ring",
              degree: int = 1) -> dict:
    """Predicted step time, tokens/s and MFU for one attention layout and strategy."""
    from training.flops import peak_flops
    peak = peak_flops(device.flops_key)
    rate, link = peak * efficiency, device.link_bytes_per_s * efficiency
    tiles = tile_sizes(m, layout, run.block, device)
    attn = attention_layer_seconds(m, run, layout, tiles, rate, link, mask_documents, documents,
                                   latency=device.latency_s,
                                   collective=device.collective_rate * efficiency,
                                   strategy=strategy, degree=degree)
    dense = dense_seconds(m, run, rate, link)
    opt = optimizer_seconds(m, run, device, efficiency)
    seconds = run.accum * (m.num_layers * attn["seconds"] + dense["seconds"]) + opt
    return {"layout": layout, "strategy": strategy, "degree": degree, "tiles": list(tiles),
            "attention_layer": attn, "dense": dense,
            "attention_s": run.accum * m.num_layers * attn["seconds"],
            "dense_s": run.accum * dense["seconds"], "optimizer_s": opt, "step_s": seconds,
            "tokens_per_s": run.tokens_per_step / seconds,
            "mfu": model_flops / (seconds * run.devices * peak)}


# ------------------------------------------------------------------------------ the plan

def analytic_plan(config, device: Device, run: Run, efficiency: float, documents=None) -> dict:
    """Every analytic figure: parameters, memory terms, fit, FLOPs and time per layout;
    documents: segment ids [R, seq_len] of sample rows (None: one document per row)."""
    import model
    from plan_documents import keys_per_query
    from training.flops import flops_per_token, peak_flops
    m = model.ModelConfig.from_config(config.model, config.parallel)
    tiles = tile_sizes(m, run.layout, run.block, device)
    state = state_memory(m, run)
    acts = activation_memory(m, run, tiles)
    total = sum(state.values()) + sum(acts.values())
    model_flops = flops_per_token(m, run.seq_len, keys_per_query=keys_per_query(documents))
    model_flops *= run.tokens_per_step
    times = {layout: step_time(m, run, layout, device, efficiency, config.data.mask_documents,
                               model_flops, documents) for layout in _layouts_for(run)}
    strategies = strategy_times(m, run, device, efficiency, config.data.mask_documents,
                                model_flops, documents, total, acts["kv_ring_buffers"])
    return {"params": param_counts(m), "state_bytes": state, "activation_bytes": acts,
            "fit": fit(total, device), "tiles": list(tiles), "model_flops_per_step": model_flops,
            "peak_flops": peak_flops(device.flops_key), "efficiency": efficiency, "time": times,
            "strategies": strategies}


def strategy_times(m, run: Run, device: Device, efficiency: float, mask_documents: bool,
                   model_flops: float, documents, memory_total: float, ring_buffers: float):
    """step_time for every strategy (parallel.strategy_cost.options) on the run's layout, each
    with its memory (the plan's total with the ring's K/V buffers swapped for the strategy's),
    and the recommendation: the fastest whose total fits."""
    from parallel import strategy_cost
    rows = []
    for strategy, degree in strategy_cost.options(run.seq, m.num_heads):
        t = step_time(m, run, run.layout, device, efficiency, mask_documents, model_flops,
                      documents, strategy, degree)
        total = memory_total - ring_buffers + t["attention_layer"]["buffer_bytes"]
        rows.append(dict(t, memory=fit(total, device) if device.memory_bytes else None))
    fitting = [r for r in rows if r["memory"] is None or r["memory"]["verdict"] != "does not fit"]
    best = min(fitting or rows, key=lambda r: r["step_s"])
    return {"rows": rows, "choice": {"strategy": best["strategy"], "degree": best["degree"]}}


def _layouts_for(run: Run) -> list[str]:
    """Layouts this sequence length allows (zigzag needs seq_len % 2N == 0)."""
    import parallel

    def allowed(layout):
        try:
            parallel.check_divisible(layout, run.seq_len, run.seq)
            return True
        except ValueError:
            return False
    return [layout for layout in parallel.LAYOUTS if allowed(layout)]


def _bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
