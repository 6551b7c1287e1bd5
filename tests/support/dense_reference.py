"""Dense attention in float64 numpy, forward and analytic backward: the tests' ground truth.

Everything is in natural token order with an explicit [batch, heads, seq, seq] mask; nothing is
shared with the kernel under test.
"""

import numpy as np


def mask(batch, seq_len, segment_ids, causal, window=None):
    """[batch, 1, seq, seq] bool: query i may see key j (with a window W: causal, i - W < j <= i;
    bidirectional, |i - j| < W)."""
    m = np.ones((batch, 1, seq_len, seq_len), bool)
    if causal:
        m &= np.tril(np.ones((seq_len, seq_len), bool))
    if window is not None:
        i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
        m &= np.abs(i - j) < window
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        m &= seg[:, None, :, None] == seg[:, None, None, :]
    return m


def attention(q, k, v, segment_ids=None, causal=True, dout=None, window=None, sinks=None,
              soft_cap=None):
    """q [B,S,H,D]; k, v [B,S,h,D]. Returns out [B,S,H,D], and (dq, dk, dv) if dout is given,
    (dq, dk, dv, dsinks) with sinks.

    window: see `mask`. sinks [H]: each head's softmax denominator gains exp(sinks[h]) (a logit
    with no value). soft_cap c: scores become c tanh(scores / c) after scaling, before masking.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, seq_len, heads, dim = q.shape
    group = heads // k.shape[2]
    kr, vr = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    visible = mask(batch, seq_len, segment_ids, causal, window)
    scale = 1.0 / np.sqrt(dim)
    raw = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    capped = raw if soft_cap is None else soft_cap * np.tanh(raw / soft_cap)
    s = np.where(visible, capped, -np.inf)
    row_max = s.max(-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, np.float64)[None, :, None, None]
    if sink is not None:
        row_max = np.maximum(row_max, sink)
    ref = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(s - ref)
    total = p.sum(-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - ref))
    p = p / np.where(total > 0, total, 1.0)
    out = np.einsum("bhqk,bkhd->bqhd", p, vr)
    if dout is None:
        return out
    do = np.asarray(dout, np.float64)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    delta = (dp * p).sum(-1, keepdims=True)  # the sink's column has no value: dp = 0 there
    ds = p * (dp - delta)
    if soft_cap is not None:
        ds = ds * (1.0 - np.tanh(raw / soft_cap) ** 2)
    ds = ds * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda x: x.reshape(batch, seq_len, k.shape[2], group, dim).sum(3)  # GQA: sum group
    grads = (dq, fold(dk), fold(dv))
    if sink is None:
        return out, grads
    p_sink = np.exp(sink - ref) / np.where(total > 0, total, 1.0)  # [B, H, S, 1]
    return out, grads + ((-(p_sink * delta)).sum(axis=(0, 2, 3)),)


def relative_error(actual, expected):
    """max |actual - expected| / max |expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())
