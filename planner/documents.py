"""The planner's packed documents (--documents): segment ids of sample rows, drawn from a length
distribution or read from the run's own first rows, and what the formulas take from them."""

from __future__ import annotations

import numpy as np

from data import sample_segment_ids
from data.document_lengths import document_lengths, packed_segment_ids


class PlanError(ValueError):
    """A planner flag that cannot work with this config; scripts/plan.py prints one line, exit 2."""


def sample_documents(config, spec: str | None, rows: int, workdir: str | None):
    """Segment ids [rows, seq_len] (natural order) for --documents, or None (one document)."""
    if spec is None:
        return None
    if not config.data.mask_documents:
        raise PlanError(f"--documents={spec} needs data.mask_documents=True (without it every "
                          "row is one causal document): set --config.data.mask_documents=True or "
                          "drop --documents")
    if rows < 1:
        raise PlanError(f"--document_rows={rows}: sample at least one row")
    if spec == "data":
        return sample_segment_ids(config, workdir, rows)
    return packed_segment_ids(spec, rows, config.seq_len)


def describe_documents(spec: str | None, segment_ids) -> dict | None:
    """Length statistics of the sampled rows (a row's last document is cut where it ends)."""
    if segment_ids is None:
        return None
    lengths = document_lengths(segment_ids)
    return {"spec": spec, "rows": len(segment_ids), "documents": int(lengths.size),
            "mean_tokens": float(lengths.mean()), "median_tokens": float(np.median(lengths)),
            "max_tokens": int(lengths.max())}
