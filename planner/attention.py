"""A run's configured attention, read from its config once: `choice_from_config` returns the
`parallel.AttentionChoice` of the config's parallel.* and model.tile_q/tile_k (the config
checks use it as they are; `planner.resolve_attention`, in recommend.py, also replaces
strategy='auto' by the planner's recommendation).
"""

from __future__ import annotations

import parallel


def choice_from_config(config, num_shards: int, platform: str, strategy: str | None = None,
                       ulysses_degree: int | None = None,
                       why: str = "configured") -> parallel.AttentionChoice:
    """The config's parallel.* and model.tile_q/tile_k on `num_shards` 'seq' devices of
    `platform`; `strategy` (and its degree) in place of the config's (for 'auto').
    ValueError, one line, if the choice cannot run."""
    p = config.parallel
    degree = p.ulysses_degree if strategy is None else ulysses_degree
    return parallel.choose(layout=p.layout, strategy=strategy or p.strategy, kernel=p.kernel,
                           tile_q=config.model.tile_q, tile_k=config.model.tile_k,
                           seq_len=config.seq_len, num_shards=num_shards, platform=platform,
                           q_heads=config.model.num_heads, ulysses_degree=degree, why=why)
