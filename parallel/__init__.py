"""Sequence-parallel attention over a ('data', 'seq') mesh: Ring, Striped and Zigzag layouts.

Public API:
  make_mesh(data, seq)                         the ('data', 'seq') device mesh
  permutation(kind, seq_len, num_shards)       natural order -> layout order (host numpy)
  inverse_permutation(kind, seq_len, num_shards)
  attention(q, k, v, *, mesh, kind, ...)       exact causal / bidirectional attention, custom VJP
  attention_with_stats(...)                    (out, tiles computed per device and ring step)
"""

from parallel.layouts import KINDS, block_positions, inverse_permutation, permutation
from parallel.mesh import DATA, SEQ, make_mesh
from parallel.ring import attention, attention_with_stats, default_tile

__all__ = [
    "DATA", "KINDS", "SEQ", "attention", "attention_with_stats", "block_positions",
    "default_tile", "inverse_permutation", "make_mesh", "permutation",
]
