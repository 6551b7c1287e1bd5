"""Sequence-parallel attention over a ('data', 'seq') mesh, as three independent choices:

    layout    where tokens sit on the seq shards     LAYOUTS: ring, striped, zigzag
    strategy  how keys/values meet the queries       STRATEGIES: ring
    kernel    the work on one block pair             KERNELS: xla  (+ 'auto')

Public API:
  make_mesh(data, seq, *, devices=None)          the ('data', 'seq') device mesh
  permutation(layout, seq_len, num_shards)       natural order -> layout order (host numpy)
  inverse_permutation(layout, seq_len, num_shards)
  attention(q, k, v, *, mesh, layout, segment_ids=None, causal=True, strategy='ring',
            kernel='auto', tile_q=None, tile_k=None, scale=None)
  attention_with_stats(...)                      (out, tiles computed per device and step)
  cost                                           the tile rule and cost model (critical path)
"""

from parallel import cost
from parallel.attention import attention, attention_with_stats
from parallel.kernels import KERNELS, resolve_kernel
from parallel.layouts import (LAYOUTS, block_positions, check_divisible, get_layout,
                              inverse_permutation, permutation, row_order)
from parallel.mesh import DATA, SEQ, make_mesh
from parallel.spec import default_tile
from parallel.strategies import STRATEGIES, get_strategy

__all__ = [
    "DATA", "KERNELS", "LAYOUTS", "SEQ", "STRATEGIES", "attention", "attention_with_stats",
    "block_positions", "check_divisible", "cost", "default_tile", "get_layout", "get_strategy",
    "inverse_permutation", "make_mesh", "permutation", "resolve_kernel", "row_order",
]
