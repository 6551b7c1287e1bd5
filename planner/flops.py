"""Model FLOPs, TFLOP/s and MFU.

FLOPs per token (forward + backward = 3 x forward; a multiply-add is 2 FLOPs):

    dense     = 6 * P_matmul                       P_matmul: parameters used in matmuls (all
                                                    projections and the output head; not the
                                                    embedding lookup; of an expert layer, the
                                                    router and the top_k experts a token uses)
    attention = 3 * L * 4 * S * H * Dh * c         QK^T and PV per query: 2 * S * H * Dh each;
                                                    c = 1/2 for causal (half the S x S scores);
                                                    a sliding layer: the keys its window leaves
    linear    = 3 * L_linear * rule                 a recurrent layer's chunked rule per token
                                                    (Gated DeltaNet's, Mamba2's SSD:
                                                    RecurrentShape.rule_flops): no S in it

    model TFLOP/s per device = FLOPs per token * tokens/s / devices / 1e12
    MFU                      = model TFLOP/s per device / peak TFLOP/s of one device

Recomputation (remat) is not counted: this is model FLOPs utilisation. With documents masked
(data.mask_documents) a query sees only its own document's earlier keys, so c * S becomes the
mean keys per query of the rows (`document_keys_per_query`): the train loop measures it on the run's
first rows, the planner on the rows it plans with; both count the same way, here.
"""

from __future__ import annotations

import numpy as np

from data.document_lengths import document_lengths
from model import mixers
from model.config import FULL, MoEConfig
from model.mixers import recurrent_layers
from parallel.recurrent import RecurrentShape

# Peak dense bf16 FLOP/s per device (chip), by a substring of jax's device_kind, lower case.
PEAK_FLOPS = {
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,
    "tpu v6e": 918e12,
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
    "b200": 2250e12,
    # Nominal: one fake CPU device is about one core; override with peak_tflops_per_device.
    "cpu": 0.1e12,
}


def peak_flops(device_kind: str, override_tflops: float = 0.0) -> float:
    if override_tflops:
        return override_tflops * 1e12
    kind = device_kind.lower()
    for name, peak in PEAK_FLOPS.items():
        if name in kind:
            return peak
    return float("nan")  # unknown device: MFU is reported as NaN rather than invented


def matmul_params(m, active: bool = True) -> int:
    """Parameters that take part in matmuls, for a model.ModelConfig. With experts, `active`
    counts the top_k experts a token goes through (what its FLOPs are: MFU counts these),
    else all of them (what memory holds)."""
    return (sum(mixer_params(m, i) + mlp_params(m, i, active) for i in range(m.num_layers))
            + m.d_model * m.vocab_size)


def mixer_params(m, i: int) -> int:
    """The matrices that mix block i's tokens, as its kind counts them (model/mixers)."""
    return mixers.mixer_at(m, i).matrix_params(m)


def recurrent_kinds(m) -> list[tuple[int, RecurrentShape]]:
    """(layers, shape) of each kind of recurrent layer the model has."""
    return mixers.recurrent(m)


def head_widths(m) -> tuple[int, int]:
    """(query/key width, value width) of an attention layer's head (head_dim twice, or latent
    attention's), as the attending kind says."""
    return mixers.mixer_of(m, FULL).head_widths(m)


def mlp_params(m, i: int, active: bool = True) -> int:
    """The matrices of block i's MLP: 3 d F dense; sparse (model/moe.py), the router d E and
    3 d F_e for each of top_k (active) or num_experts experts."""
    moe = experts_of(m)
    if not moe.sparse(i):
        return 3 * m.d_model * m.mlp_dim
    experts = moe.top_k if active else moe.num_experts
    shared = 3 * m.d_model * moe.shared_width(m.mlp_dim) + m.d_model * moe.shared_expert_gate
    return (experts * 3 * m.d_model * moe.width(m.mlp_dim) + m.d_model * moe.num_experts
            + shared)


def experts_of(m):
    """The MoEConfig of a ModelConfig (or of a model section whose moe is a mapping)."""
    return MoEConfig.from_config(m.moe)


def layer_windows(m) -> dict:
    """{window or None: number of layers} of a model config (sliding layers' window; None for
    full attention; Gated DeltaNet layers are not attention layers)."""
    sliding = sum(t == "sliding_attention" for t in m.layer_types)
    full = m.num_layers - sliding - recurrent_layers(m)
    window = m.sliding_window or None
    out = {None: full} if full else {}
    if sliding:
        out[window] = sliding
    return out


def flops_per_token(m, seq_len: int, causal: bool = True,
                    keys_per_query: float | None = None, segment_ids=None) -> float:
    """keys_per_query: the mean number of keys a query attends to in a full layer, in place of
    c * S (packed documents, masked: sum over documents of L (L + 1) / 2, divided by S). A
    sliding layer counts the keys its window leaves (from segment_ids' documents when given)."""
    dense = 6 * matmul_params(m)
    attention = 0.0
    for window, layers in layer_windows(m).items():
        if window is None and keys_per_query is not None:
            kpq = keys_per_query
        elif segment_ids is not None:
            kpq = document_keys_per_query(segment_ids, window)
        else:  # c S, and for a window the band of the S x S scores it leaves
            full = seq_len * (0.5 if causal else 1.0)
            w = min(window or seq_len, seq_len)
            kpq = full if w >= seq_len else (w - w * w / (2 * seq_len)) * (1 if causal else 2)
        attention += layers * kpq
    qk, v = head_widths(m)
    linear = sum(layers * shape.rule_flops() for layers, shape in recurrent_kinds(m))
    return dense + 3 * 2 * attention * m.num_heads * (qk + v) + 3 * linear


def document_keys_per_query(segment_ids, window: int | None = None) -> float | None:
    """Mean keys a query sees with documents masked, causal: sum over documents of
    L (L + 1) / 2 (with a window W: the pairs less than W apart), over all tokens; segment_ids
    [R, S] natural order (None: one document)."""
    if segment_ids is None:
        return None
    lengths = document_lengths(segment_ids).astype(np.float64)
    if window is None:
        return float((lengths * (lengths + 1) / 2).sum() / np.asarray(segment_ids).size)
    w = np.minimum(lengths, window)  # per document: W (W + 1) / 2 + (L - W) W
    return float((w * (w + 1) / 2 + (lengths - w) * w).sum() / np.asarray(segment_ids).size)


# The backward of one attention block pair: five matmuls to the forward's two.
BACKWARD_FLOPS = 2.5


def causal_pair_tflops(heads, head_dim, n, forward_s, backward_s):
    """(forward, forward+backward) TFLOP/s of one causal block pair of n tokens, counting the
    visible half of the scores: forward 4 H d n(n+1)/2, backward BACKWARD_FLOPS times that."""
    flops = 4 * heads * head_dim * n * (n + 1) / 2
    return (flops / forward_s / 1e12,
            flops * (1 + BACKWARD_FLOPS) / (forward_s + backward_s) / 1e12)
