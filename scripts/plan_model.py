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

GB = 1e9
FIT_FRACTION = 0.9  # "fits" if the analytic total is at most this share of the device memory


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator: peak from training/flops.py, the rest nominal vendor figures."""

    title: str
    flops_key: str  # device_kind substring looked up in training.flops.PEAK_FLOPS
    memory_bytes: float  # HBM capacity, nominal decimal GB
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # one ring hop: bytes/s from a device to its neighbour, one direction
    link_note: str
    chips_per_host: int  # processes = devices / chips_per_host (one process per host)

    @property
    def platform(self) -> str:
        """Its jax backend: what kernel='auto' picks there, and the kernel's tile rules."""
        if self.flops_key == "cpu":
            return "cpu"
        return "tpu" if self.flops_key.startswith("tpu") else "gpu"


DEVICES = {
    "a100-80gb": Device("A100 80GB", "a100", 80 * GB, 2.0e12, 300 * GB,
                        "NVLink 3: 300 GB/s per direction", 8),
    "h100-80gb": Device("H100 80GB", "h100", 80 * GB, 3.35e12, 450 * GB,
                        "NVLink 4: 450 GB/s per direction", 8),
    "h200": Device("H200", "h200", 141 * GB, 4.8e12, 450 * GB,
                   "NVLink 4: 450 GB/s per direction", 8),
    "tpu-v4": Device("TPU v4", "tpu v4", 32 * GB, 1.2e12, 50 * GB,
                     "ICI: ~50 GB/s per link per direction, the ring using one link per hop "
                     "(assumed; all-gathers over the 3D torus could use more)", 4),
    "tpu-v5e": Device("TPU v5e", "tpu v5e", 16 * GB, 0.82e12, 50 * GB,
                      "ICI: ~50 GB/s per link per direction (1,600 Gbit/s per chip over 4 "
                      "links; assumed)", 4),
    "tpu-v5p": Device("TPU v5p", "tpu v5p", 95 * GB, 2.76e12, 100 * GB,
                      "ICI: ~100 GB/s per link per direction (4,800 Gbit/s per chip over 6 "
                      "links; assumed)", 4),
    "cpu": Device("CPU (fake device)", "cpu", 0.0, 20 * GB, 10 * GB,  # memory: host / devices
                  "nominal 10 GB/s between fake devices", 1 << 30),
}


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
               layout=config.parallel.attention)


def process_count(device: Device, devices: int) -> int:
    """One process per host: GPUs 8 per host, TPU v4/v5p/v5e 4 chips per host (assumed)."""
    return max(1, math.ceil(devices / device.chips_per_host))


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
    """Bytes per device of activations; the formulas are in the module docstring's table."""
    b, n, c, f32 = run.rows, run.block, _bytes(m.dtype), 4
    d, heads, kv, dh = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
    kept = 1 if m.remat else m.num_layers  # layers whose saved values are alive at once
    tokens = b * n
    return {
        "block_inputs": (m.num_layers * tokens * d * c) if m.remat else 0,
        "norms": kept * tokens * 2 * ((2 * f32 + c) * d + 2 * f32),
        "swiglu": kept * tokens * 6 * c * m.mlp_dim,
        "attention_residuals": kept * tokens * (c * dh * (2 * heads + 2 * kv) + f32 * heads
                                                + 2 * f32 * dh),
        "kv_ring_buffers": tokens * (4 * c * kv * dh + 4 * f32 * kv * dh + 2 * 4),
        "kernel_accumulators": tokens * f32 * (heads * dh + heads),
        "tile_scratch": 3 * f32 * b * heads * tiles[0] * tiles[1],
        "final_norm": tokens * ((2 * f32 + c) * d + 2 * f32),
        "logits": 2 * f32 * tokens * m.vocab_size,
    }


def fit(total: float, device: Device) -> dict:
    """Verdict against the nominal memory: fits (<= 90%), tight (90-100%), does not fit."""
    share = total / device.memory_bytes
    verdict = ("fits" if share <= FIT_FRACTION else "tight" if share <= 1.0 else "does not fit")
    return {"total_bytes": total, "device_bytes": device.memory_bytes, "share": share,
            "headroom_bytes": device.memory_bytes - total, "verdict": verdict}


# ------------------------------------------------------------------------------ time

def step_tile_counts(layout: str, num_shards: int, block: int, tiles: tuple[int, int],
                     documents=None):
    """tiles[r, d, s]: tiles device d computes on ring step s for row r, from parallel.cost (the
    rule the kernels run). documents: segment ids [R, S] in natural order (a sample of packed
    rows), or None for one causal document per row ([1, N, N])."""
    from parallel import cost, get_layout
    if documents is not None:
        return cost.layout_tile_counts(layout, documents, num_shards, *tiles)
    if get_layout(layout).data_dependent:
        # One document: balanced starts from (and keeps) a zigzag over units of one tile.
        from parallel.layouts import balanced
        unit = np.lcm(*tiles)
        order = balanced.order_of(balanced.zigzag_units(num_shards * block // unit, num_shards),
                                  unit)
        return cost.placement_tile_counts(order, None, num_shards, *tiles)[None]
    return cost.ring_tile_counts(layout, num_shards, block, *tiles)[None]


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


def attention_layer_seconds(m, run: Run, layout: str, tiles: tuple[int, int], rate: float,
                            link: float, with_segments: bool, documents=None) -> dict:
    """One layer's attention, forward (x2 with remat) and backward, on the critical path;
    with documents [R, S] (segment ids of sample rows), the mean row's."""
    tq, tk = tiles
    per_side = run.block / math.sqrt(tq * tk)  # T (exact for square tiles)
    tile_flops = 4 * run.rows * tq * tk * m.head_dim * m.num_heads
    counts = step_tile_counts(layout, run.seq, run.block, tiles, documents)
    steps = counts.max(axis=1).mean(axis=0).tolist()
    compute = [t * tile_flops / rate for t in steps]
    kv, dkv = (x / link for x in ring_transfer_bytes(m, run, with_segments))
    if run.seq == 1:
        kv = dkv = 0.0
    forward = sum(max(c, kv) for c in compute[:-1]) + compute[-1]
    # The backward's last step also sends its K/V (one loop of N steps compiles the kernel once);
    # then the last dK/dV hop brings them home.
    backward = (sum(max(2 * c, kv + dkv) for c in compute[:-1]) + max(2 * compute[-1], kv)
                + dkv)
    comm_bound_steps = sum(c < kv for c in compute[:-1])
    return {"tiles_per_side": per_side, "critical_path_tiles": sum(compute) * rate / tile_flops,
            "forward_s": forward, "backward_s": backward,
            "seconds": forward * (2 if m.remat else 1) + backward,
            "hop_compute_s_min": min(compute), "hop_transfer_s": kv,
            "comm_bound_forward_steps": comm_bound_steps,
            "document_efficiency": (None if documents is None
                                    else document_efficiency(counts, documents, tiles))}


def dense_seconds(m, run: Run, rate: float, link: float) -> dict:
    """Matmuls outside attention (x4/3 with remat) overlapped with FSDP gathers/scatters."""
    counts, p = param_counts(m), _bytes(m.param_dtype)
    flops = (8 if m.remat else 6) * counts["matmul"] * run.rows * run.block
    traffic = 3 * (run.devices - 1) / run.devices * counts["total"] * p
    compute, comm = flops / rate, traffic / link
    return {"flops": flops, "compute_s": compute, "fsdp_traffic_bytes": traffic,
            "fsdp_comm_s": comm, "seconds": max(compute, comm)}


def optimizer_seconds(m, run: Run, device: Device, efficiency: float) -> float:
    """About 8 parameter-sized HBM passes (clip + AdamW) over this device's shard."""
    shard_bytes = param_counts(m)["total"] * _bytes(m.param_dtype) / run.devices
    return 8 * shard_bytes / (device.hbm_bytes_per_s * efficiency)


def step_time(m, run: Run, layout: str, device: Device, efficiency: float, mask_documents: bool,
              model_flops: float, documents=None) -> dict:
    """Predicted step time, tokens/s and MFU for one attention layout."""
    from training.flops import peak_flops
    peak = peak_flops(device.flops_key)
    rate, link = peak * efficiency, device.link_bytes_per_s * efficiency
    tiles = tile_sizes(m, layout, run.block, device)
    attn = attention_layer_seconds(m, run, layout, tiles, rate, link, mask_documents, documents)
    dense = dense_seconds(m, run, rate, link)
    opt = optimizer_seconds(m, run, device, efficiency)
    seconds = run.accum * (m.num_layers * attn["seconds"] + dense["seconds"]) + opt
    return {"layout": layout, "tiles": list(tiles), "attention_layer": attn, "dense": dense,
            "attention_s": run.accum * m.num_layers * attn["seconds"],
            "dense_s": run.accum * dense["seconds"], "optimizer_s": opt, "step_s": seconds,
            "tokens_per_s": run.tokens_per_step / seconds,
            "mfu": model_flops / (seconds * run.devices * peak)}


# ------------------------------------------------------------------------------ the plan

def sample_documents(config, spec: str | None, rows: int, workdir: str | None):
    """Segment ids [rows, seq_len] (natural order) for --documents, or None (one document)."""
    from training.validate import ConfigError
    if spec is None:
        return None
    if not config.data.mask_documents:
        raise ConfigError(f"--documents={spec} needs data.mask_documents=True (without it every "
                          "row is one causal document): set --config.data.mask_documents=True or "
                          "drop --documents")
    if rows < 1:
        raise ConfigError(f"--document_rows={rows}: sample at least one row")
    if spec == "data":
        from training.loop import sample_segment_ids
        return sample_segment_ids(config, workdir or os.path.join(ROOT, "runs", "plan"), rows)
    from data.document_lengths import packed_segment_ids
    return packed_segment_ids(spec, rows, config.seq_len)


def describe_documents(spec: str | None, segment_ids) -> dict | None:
    """Length statistics of the sampled rows (a row's last document is cut where it ends)."""
    from data.document_lengths import document_lengths
    if segment_ids is None:
        return None
    lengths = document_lengths(segment_ids)
    return {"spec": spec, "rows": len(segment_ids), "documents": int(lengths.size),
            "mean_tokens": float(lengths.mean()), "median_tokens": float(np.median(lengths)),
            "max_tokens": int(lengths.max())}


def analytic_plan(config, device: Device, run: Run, efficiency: float, documents=None) -> dict:
    """Every analytic figure: parameters, memory terms, fit, FLOPs and time per layout;
    documents: segment ids [R, seq_len] of sample rows (None: one document per row)."""
    import model
    from training.flops import flops_per_token, peak_flops
    m = model.ModelConfig.from_config(config.model, config.parallel)
    tiles = tile_sizes(m, run.layout, run.block, device)
    state = state_memory(m, run)
    acts = activation_memory(m, run, tiles)
    total = sum(state.values()) + sum(acts.values())
    model_flops = flops_per_token(m, run.seq_len, keys_per_query=_keys_per_query(documents))
    model_flops *= run.tokens_per_step
    times = {layout: step_time(m, run, layout, device, efficiency, config.data.mask_documents,
                               model_flops, documents) for layout in _layouts_for(run)}
    return {"params": param_counts(m), "state_bytes": state, "activation_bytes": acts,
            "fit": fit(total, device), "tiles": list(tiles), "model_flops_per_step": model_flops,
            "peak_flops": peak_flops(device.flops_key), "efficiency": efficiency, "time": times}


def _keys_per_query(documents) -> float | None:
    """Mean keys a query sees with documents masked (None: one causal document per row)."""
    if documents is None:
        return None
    from data.document_lengths import document_lengths
    lengths = document_lengths(documents).astype(np.float64)
    return float((lengths * (lengths + 1) / 2).sum() / np.asarray(documents).size)


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
