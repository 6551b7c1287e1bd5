"""Sequence-parallel attention over a ('data', 'seq') mesh, as three independent choices:

    layout    where tokens sit on the seq shards     LAYOUTS: ring, striped, zigzag, balanced
    strategy  how keys/values meet the queries       STRATEGIES: ring, allgather, ulysses, usp
    kernel    the work on one block pair             KERNELS: xla, pallas_tpu, pallas_gpu
                                                     (+ 'auto': the platform's best)

Public API:
  make_mesh(data, seq, *, devices=None)          the ('data', 'seq') device mesh
  mesh_shape(data, seq, count)                   its (data, seq) sizes, -1 filled in
  permutation(layout, seq_len, num_shards, *, segment_ids=None, tile=None)
                                                 natural -> layout order (host numpy; [S], or
                                                 [B, S] for balanced, placed per row)
  row_order(layout, segment_ids, num_shards)     [B, S]: attention's `order` for these rows
  inverse_permutation(...)                       layout -> natural order
  attention(q, k, v, *, mesh, layout, segment_ids=None, order=None, causal=True,
            strategy='ring', kernel='auto', tile_q=None, tile_k=None, scale=None,
            ulysses_degree=None)
  attention_with_stats(...)                      (out, tiles per device and step, K/V received)
  latent_attention(q, c, k_rope, kv_b, *, mesh, layout, ...)   MLA whose devices pass the latent
                                                 (parallel/latent.py), exact as attention()
  SAVED_BY_NAME                                  the checkpoint names of attention's output and
                                                 lse (model.remat_policy 'attention' keeps them)
  choose(layout=, strategy=, kernel=, tile_q=, tile_k=, seq_len=, num_shards=, platform=,
         q_heads=)                               a run's AttentionChoice: no 'auto', tiles set;
                                                 choice.attention_kwargs() and
                                                 choice.permutation(...) agree on the tiles
  cost                                           the tile rule and cost model (critical path)
  strategy_cost                                  time, traffic and memory per strategy
"""

from parallel import cost, strategy_cost
from parallel.attention import SAVED_BY_NAME, attention, attention_with_stats
from parallel.latent import latent_attention
from parallel.kernels import KERNELS, resolve_kernel
from parallel.layouts import (LAYOUTS, block_positions, check_divisible, get_layout,
                              inverse_permutation, permutation, row_order)
from parallel.mesh import DATA, SEQ, make_mesh, mesh_shape
from parallel.choice import AttentionChoice, choose, default_tile
from parallel.strategies import STRATEGIES, get_strategy
from parallel.xla_options import compiler_options

__all__ = [
    "AttentionChoice", "DATA", "KERNELS", "LAYOUTS", "SAVED_BY_NAME", "SEQ", "STRATEGIES",
    "attention", "attention_with_stats", "latent_attention", "block_positions", "check_divisible", "choose", "cost",
    "compiler_options", "default_tile", "get_layout", "get_strategy", "inverse_permutation",
    "make_mesh", "mesh_shape", "permutation", "resolve_kernel", "row_order", "strategy_cost",
]
