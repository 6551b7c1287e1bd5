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


def stdlib_rows(seq_len: int, rows: int, workdir: str):
    """Segment ids [rows, seq_len] of the default config's first training rows of the embedded
    corpus (natural order); the tokenizer and token cache are built in `workdir` once."""
    import run_config
    from configs import default

    config = run_config.replace(run_config.build(default.get_config()), {"seq_len": seq_len})
    return sample_segment_ids(config, workdir, rows)


def kernel_counts(seg_row, layout, shards, tile, kernel):
    """(tiles[d, s] from attention_with_stats for one row laid out by `layout`, the seconds the
    layout took to place the row): the kernel's own count of what each device computes at each
    ring step (scripts/bench/documents.py's efficiencies, scripts/plot_figures.py's pictures)."""
    import time

    import jax

    import parallel

    seq_len = seg_row.shape[0]
    start = time.perf_counter()
    order = parallel.row_order(layout, seg_row[None], shards, tile=tile)
    placing = time.perf_counter() - start
    mesh = parallel.make_mesh(1, shards, devices=jax.devices()[:shards])
    x = np.zeros((1, seq_len, 1, 8), np.float32)
    _, tiles, _ = parallel.attention_with_stats(
        x, x, x, mesh=mesh, layout=layout, segment_ids=np.take_along_axis(seg_row[None], order, 1),
        order=order, tile_q=tile, tile_k=tile, kernel=kernel)
    return np.asarray(tiles), placing
