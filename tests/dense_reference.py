"""Dense attention in float64 numpy, forward and analytic backward: the tests' ground truth.

Everything is in natural token order with an explicit [batch, heads, seq, seq] mask; nothing is
shared with the kernel under test.
"""

import numpy as np


def mask(batch, seq_len, segment_ids, causal):
    """[batch, 1, seq, seq] bool: query i may see key j."""
    m = np.ones((batch, 1, seq_len, seq_len), bool)
    if causal:
        m &= np.tril(np.ones((seq_len, seq_len), bool))
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        m &= seg[:, None, :, None] == seg[:, None, None, :]
    return m


def attention(q, k, v, segment_ids=None, causal=True, dout=None):
    """q [B,S,H,D]; k, v [B,S,h,D]. Returns out [B,S,H,D], and (dq, dk, dv) if dout is given."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, seq_len, heads, dim = q.shape
    group = heads // k.shape[2]
    kr, vr = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    visible = mask(batch, seq_len, segment_ids, causal)
    scale = 1.0 / np.sqrt(dim)
    s = np.where(visible, np.einsum("bqhd,bkhd->bhqk", q, kr) * scale, -np.inf)
    row_max = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(row_max), row_max, 0.0))
    total = p.sum(-1, keepdims=True)
    p = p / np.where(total > 0, total, 1.0)
    out = np.einsum("bhqk,bkhd->bqhd", p, vr)
    if dout is None:
        return out
    do = np.asarray(dout, np.float64)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda x: x.reshape(batch, seq_len, k.shape[2], group, dim).sum(3)  # GQA: sum group
    return out, (dq, fold(dk), fold(dv))


def relative_error(actual, expected):
    """max |actual - expected| / max |expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())
