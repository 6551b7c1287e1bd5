"""Rows packed from a distribution of document lengths, for measuring layouts without a corpus.

A length spec names a distribution (tokens per document):

    exp:MEAN             exponential: many short documents, a few several times the mean
    lognormal:MU:SIGMA   heavy-tailed (exp(MU) is the median; SIGMA 1.5 spans ~3 decades)
    pareto:ALPHA:MIN     heavier still: MIN x (1 + Pareto(ALPHA)); ALPHA <= 2 has no variance
    one                  one document per row (plain causal attention)

`packed_segment_ids('exp:2048', rows=2, seq_len=8192)` -> int32 [2, 8192] segment ids in natural
order, documents cut where a row ends (as the training data cuts them), each row drawn
independently from a fixed seed: the same spec always gives the same rows.
"""

from __future__ import annotations

import numpy as np

from data.errors import DataError

# name -> (parameter names, draw(rng, params, count) -> float lengths)
_DISTRIBUTIONS = {
    "exp": (("MEAN",), lambda rng, p, n: rng.exponential(p[0], n)),
    "lognormal": (("MU", "SIGMA"), lambda rng, p, n: rng.lognormal(p[0], p[1], n)),
    "pareto": (("ALPHA", "MIN"), lambda rng, p, n: p[1] * (1 + rng.pareto(p[0], n))),
    "one": ((), None),
}
SPECS = tuple(":".join((name, *params)) for name, (params, _) in _DISTRIBUTIONS.items())


def parse_length_spec(spec: str) -> tuple[str, tuple[float, ...]]:
    """('exp', (2048.0,)) for 'exp:2048'; a one-line DataError naming the forms otherwise."""
    name, *values = spec.split(":")
    if name not in _DISTRIBUTIONS:
        raise DataError(f"unknown document length spec {spec!r}: use one of {', '.join(SPECS)}")
    names = _DISTRIBUTIONS[name][0]
    try:
        params = tuple(float(v) for v in values)
    except ValueError:
        params = ()
    if len(params) != len(names) or not all(v > 0 for v in params if name != "lognormal"):
        raise DataError(f"document length spec {spec!r}: write {':'.join((name, *names))} with "
                        f"{'numbers' if name == 'lognormal' else 'positive numbers'}, e.g. "
                        f"{_EXAMPLES[name]}")
    return name, params


_EXAMPLES = {"exp": "exp:2048", "lognormal": "lognormal:7.5:1.5", "pareto": "pareto:1.5:512",
             "one": "one"}


def packed_segment_ids(spec: str, rows: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """int32 [rows, seq_len]: rows packed from documents of the spec's lengths (at least one
    token each), numbered 0, 1, ... from the row's start."""
    name, params = parse_length_spec(spec)
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, seq_len), np.int32)
    if name == "one":
        return out
    draw = _DISTRIBUTIONS[name][1]
    for r in range(rows):
        # seq_len documents of >= 1 token always fill the row; the last is cut at its end.
        ends = np.cumsum(np.maximum(1, draw(rng, params, seq_len).astype(np.int64)))
        out[r] = np.searchsorted(ends, np.arange(seq_len), side="right")
    return out


def document_lengths(segment_ids) -> np.ndarray:
    """Lengths of the runs of equal ids in each row [B, S], concatenated (row order)."""
    seg = np.asarray(segment_ids)
    lengths = []
    for row in seg.reshape(-1, seg.shape[-1]):
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        lengths.append(np.diff(np.r_[starts, row.size]))
    return np.concatenate(lengths)
