"""Model FLOPs, TFLOP/s and MFU.

FLOPs per token (forward + backward = 3 x forward; a multiply-add is 2 FLOPs):

    dense     = 6 * P_matmul                       P_matmul: parameters used in matmuls (all
                                                    projections and the output head; not the
                                                    embedding lookup)
    attention = 3 * L * 4 * S * H * Dh * c         QK^T and PV per query: 2 * S * H * Dh each;
                                                    c = 1/2 for causal (half the S x S scores)

    model TFLOP/s per device = FLOPs per token * tokens/s / devices / 1e12
    MFU                      = model TFLOP/s per device / peak TFLOP/s of one device

Recomputation (remat) is not counted: this is model FLOPs utilisation. With documents masked
(data.mask_documents) a query sees only its own document's earlier keys, so c * S becomes the
mean keys per query of the rows (`keys_per_query`): the train loop measures it on the run's
first rows, the planner on the rows it plans with; both count the same way, here.
"""

from __future__ import annotations

import numpy as np

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


def matmul_params(m) -> int:
    """Parameters that take part in matmuls, for a model.ModelConfig."""
    attention = m.d_model * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
    mlp = 3 * m.d_model * m.mlp_dim
    return m.num_layers * (attention + mlp) + m.d_model * m.vocab_size


def flops_per_token(m, seq_len: int, causal: bool = True,
                    keys_per_query: float | None = None) -> float:
    """keys_per_query: the mean number of keys a query attends to, in place of c * S (packed
    documents, masked: sum over documents of L (L + 1) / 2, divided by S)."""
    dense = 6 * matmul_params(m)
    if keys_per_query is None:
        keys_per_query = seq_len * (0.5 if causal else 1.0)
    return dense + 3 * m.num_layers * 4 * keys_per_query * m.num_heads * m.head_dim


def keys_per_query(segment_ids) -> float | None:
    """Mean keys a query sees with documents masked, causal: sum over documents of
    L (L + 1) / 2, over all tokens; segment_ids [R, S] natural order (None: one document)."""
    if segment_ids is None:
        return None
    from data.document_lengths import document_lengths
    lengths = document_lengths(segment_ids).astype(np.float64)
    return float((lengths * (lengths + 1) / 2).sum() / np.asarray(segment_ids).size)
