"""Bytes per device: parameters, optimizer state, gradients and activations, term by term (the
formulas are tabled in planner/README.md), and the verdict against a device's memory."""

from __future__ import annotations

import dataclasses

from model import mixers
from parallel import chunks
from parallel.choice import MLA_BASELINE
from model.embedding import splits
from model.config import FULL
from model.mixers import recurrent_layers
from planner.flops import (experts_of, matmul_params, mixer_params, mlp_params,
                           recurrent_kinds)
from planner.devices import Device
from planner.run import Run

GB = 1e9
FIT_FRACTION = 0.9  # "fits" if the analytic total is at most this share of the device memory


def param_counts(m) -> dict:
    """Parameter counts of model.Transformer for a ModelConfig `m`.

    matmul  = planner.flops.matmul_params: L (d Dh (2H + 2K) + 3 d F) + d V (output head)
    total   = matmul + V d (embedding; not with tied embeddings) + (2L + 1) d (RMSNorm scales)
    vectors = (2L + 1) d (+ q/k norms, sandwich norms, sinks, attention and experts' biases),
              replicated; every other parameter is a matrix, sharded over all devices
    layer   = d Dh (2H + 2K) + 3 d F, the matrices of one block (the largest: with experts,
              all of a sparse block's)
    active  = total with only the top_k experts of each sparse layer (what a token uses)
    """
    matmul = matmul_params(m, active=False)  # every expert: what memory holds
    embed = 0 if m.tie_embeddings else m.vocab_size * m.d_model
    vectors = (2 * m.num_layers + 1) * m.d_model + 2 * m.d_model * m.sandwich_norms * (
        m.num_layers) + _expert_biases(m) + sum(  # and each mixer's own (model/mixers)
        n * kind.vector_params(m) for kind, n in mixers.used(m).items())
    layer = max(mixer_params(m, i) for i in range(m.num_layers)) + max(
        mlp_params(m, i, active=False) for i in range(m.num_layers))
    return {"total": matmul + embed + vectors, "matmul": matmul, "matrices": matmul + embed,
            "vectors": vectors, "layer": layer, "active": matmul_params(m) + embed + vectors}


def _sparse_top_k(m) -> int:
    """top_k where some block is an expert layer, else 0."""
    moe = experts_of(m)
    return moe.top_k if moe.sparse_layers(m.num_layers) else 0


def _expert_biases(m) -> int:
    """The vectors of every sparse layer (replicated): GPT-OSS's biases, router E, gate and up
    E F_e, down E d; DeepSeek-V3's correction bias E."""
    moe = experts_of(m)
    sparse = len(moe.sparse_layers(m.num_layers))
    correction = sparse * moe.num_experts if moe.correction_bias else 0
    if not moe.expert_bias:
        return correction
    return correction + sparse * moe.num_experts * (1 + 2 * moe.width(m.mlp_dim) + m.d_model)


def state_memory(m, run: Run) -> dict:
    """Bytes per device of parameters, AdamW state and gradients under FSDP over all devices."""
    counts, p = param_counts(m), dtype_bytes(m.param_dtype)
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
    weights = m.num_layers * counts["layer"] + m.vocab_size * m.d_model
    return 2 * weights * dtype_bytes(m.param_dtype)


def activation_memory(m, run: Run, tiles: tuple[int, int],
                      mla_exchange: str = MLA_BASELINE) -> dict:
    """Bytes per device of activations; the formulas are in plan.py's docstring table;
    mla_exchange: what latent attention passes (the run's choice's)."""
    b, n, c, f32 = run.rows, run.block, dtype_bytes(m.dtype), 4
    d, heads, kv, dh, v = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size
    attending = mixers.mixer_of(m, FULL)
    kv, dh = attending.kernel_heads(m)  # latent attention: every head, the kernel's width
    # what travels of a token: its keys and values, or its latent and RoPE key (then a block's
    # expansion to keys and values is alive while its tiles run)
    latent = attending.exchanged_width(m, mla_exchange)
    travels = latent or 2 * kv * dh
    kept = 1 if m.remat else m.num_layers  # layers whose saved values are alive at once
    tokens = b * n
    mlp_chunk, loss_chunk = _chunk(m.mlp_chunk, n), m.loss_chunk or n  # loss: 0 = n at once
    offload = m.remat and m.remat_policy == "offload"
    k, moe = _sparse_top_k(m), experts_of(m)  # top_k (0: no expert layer); X: expert_devices
    x = moe.expert_devices
    return {
        # remat: every layer's input is kept; 'offload' keeps them in host memory
        # (host_offload_bytes) and HBM holds the one being copied back, and the next.
        "block_inputs": ((2 if offload else m.num_layers) * tokens * d * c) if m.remat else 0,
        "norms": kept * tokens * 2 * (2 * c * d + f32),
        # Whole: 6 [b, n, F] saved per layer. Chunked: nothing saved (the MLP's input is the
        # norm's output, counted there); one chunk's 6 [b, k, F] while it is recomputed.
        "swiglu": (kept * tokens if not mlp_chunk else b * mlp_chunk) * 6 * c * m.mlp_dim,
        # An expert layer (never chunked): 6 [b n k, F_e] values, the k copies of each token
        # sorted by expert, their outputs and the float32 weighted outputs. Split over X
        # devices, a device's experts run in X slots of the b n k pairs (model/moe.py
        # exchange: dropless whatever the routing), so the F_e values and outputs are X times.
        "experts": kept * tokens * k * (x * (6 * c * moe.width(m.mlp_dim) + c * d)
                                        + d * (c + f32)),
        # One layer's exchange at a time: the slots sent, received, sorted and returned.
        "expert_exchange": 4 * x * tokens * k * c * d if x > 1 else 0,
        "attention_residuals": kept * tokens * (c * (2 * heads * dh + travels) + f32 * heads
                                                + 2 * f32 * dh),
        # remat_policy 'attention': every layer keeps its attention's output and float32 lse.
        "attention_outputs": (m.num_layers * tokens * heads * (c * dh + f32)
                              if m.remat and m.remat_policy == "attention" else 0),
        # remat_policy 'dots': every layer keeps its q, k, v, o, gate and up matmul outputs.
        "dot_outputs": (m.num_layers * tokens * c * (dh * (heads + 2 * kv) + d + 2 * m.mlp_dim)
                        if m.remat and m.remat_policy == "dots" else 0),
        "kv_ring_buffers": tokens * (2 * c * travels + 2 * f32 * travels + 2 * 4
                                     + (2 * c * kv * dh if latent else 0)),
        "kernel_accumulators": tokens * f32 * (heads * dh + heads),
        "recurrent_layers": recurrent_bytes(m, tokens, b * _chunk(m.linear_chunk, n)),
        "tile_scratch": 3 * f32 * b * heads * tiles[0] * tiles[1],
        "final_norm": tokens * (c * d + f32),
        # The embedding lookup's gathered token ids, every device's (model/embedding.py).
        "embedding_ids": 4 * tokens * run.devices if splits((v, d), run.devices) else 0,
        # The loss makes its gradient with the logits (model/loss.py): dx [b, n, d] saved, a
        # float32 dW [d, V], and one chunk's float32 logits and its dlogits in the compute
        # dtype (the softmax, one-hot and weighting fuse into the pass between them), alive
        # while the loss runs.
        "logits": tokens * c * d + f32 * d * v + b * loss_chunk * v * (f32 + c),
    }


def recurrent_bytes(m, tokens: int, piece_tokens: int = 0) -> float:
    """Gated DeltaNet and Mamba2 layers (parallel/recurrent/), float32 inside, per layer
    alive at once (one with remat, else all of them): the convolution's inputs, g and beta, the
    gate z; the convolution's output and q, k, v one per head; the chunked rule's residuals
    (a chunk's C x C decays and scores and a few vectors a head, per token); 'state' widens the
    values by dk columns (block_summary), 'heads' holds its all-to-all's send and receive
    buffers. The larger of the two strategies (the run's is resolved after memory). In pieces
    (model.linear_chunk: piece_tokens of a device's tokens at a time, parallel/recurrent/pieces.py)
    all that is one piece's, beside the layer's output and its gradient over every token."""
    if piece_tokens:
        kept = 1 if m.remat else recurrent_layers(m)
        return (recurrent_bytes(dataclasses.replace(m, remat=True), piece_tokens)
                + kept * tokens * 2 * 4.0 * m.d_model)
    total = 0.0
    for layers, x in recurrent_kinds(m):
        h, dk, dv = x.heads, x.key_dim, x.value_dim
        inputs = x.conv_channels + 2 * h + h * dv
        heads = 2 * h * dk + h * dv
        rule = h * (3 * x.chunk + 3 * (dk + dv))
        strategy = max(2 * h * dk, 2 * (x.conv_channels + 2 * h))
        kept = 1 if m.remat else layers
        total = max(total, kept * tokens * 4.0 * (inputs + heads + rule + strategy))
    return total


def host_offload_bytes(m, run: Run) -> float:
    """Host memory per device under remat_policy 'offload': every layer's block input."""
    if not (m.remat and m.remat_policy == "offload"):
        return 0.0
    return m.num_layers * run.rows * run.block * m.d_model * dtype_bytes(m.dtype)


def saved_activation_bytes(m, run: Run, tiles: tuple[int, int]) -> float:
    """What autodiff keeps between the forward and the backward (the part of
    activation_memory that jax's saved_residuals lists; tests/planner/test_plan.py checks it)."""
    t = activation_memory(m, run, tiles)
    chunked_mlp = _chunk(m.mlp_chunk, run.block)
    per_layer = (t["norms"] + t["attention_residuals"] + t["experts"]
                 + (0 if chunked_mlp else t["swiglu"]))
    loss = run.rows * run.block * dtype_bytes(m.dtype) * m.d_model  # dx (model/loss.py)
    return (t["block_inputs"] + t["dot_outputs"] + t["attention_outputs"] + t["final_norm"]
            + t["embedding_ids"] + loss + (0 if m.remat else per_layer))


def _chunk(chunk: int, block: int) -> int:
    """The tokens per chunk of an MLP chunked by mlp_chunk, 0 when parallel/chunks.py runs it
    whole (its rule, chunks.splits)."""
    return chunk if chunks.splits(chunk, block) else 0


def fit(total: float, device: Device) -> dict:
    """Verdict against the nominal memory: fits (<= 90%), tight (90-100%), does not fit."""
    share = total / device.memory_bytes
    verdict = ("fits" if share <= FIT_FRACTION else "tight" if share <= 1.0 else "does not fit")
    return {"total_bytes": total, "device_bytes": device.memory_bytes, "share": share,
            "headroom_bytes": device.memory_bytes - total, "verdict": verdict}


def dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
