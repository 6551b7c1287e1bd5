"""The planner's packed documents (--documents): segment ids of sample rows, drawn from a length
distribution or read from the run's own first rows, and what the formulas take from them."""

from __future__ import annotations

import os

import numpy as np

from plan_model import ROOT


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


def keys_per_query(documents) -> float | None:
    """Mean keys a query sees with documents masked (None: one causal document per row)."""
    if documents is None:
        return None
    from data.document_lengths import document_lengths
    lengths = document_lengths(documents).astype(np.float64)
    return float((lengths * (lengths + 1) / 2).sum() / np.asarray(documents).size)
