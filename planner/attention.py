"""A run's configured attention, read from its config once: `choice_from_config` returns the
`parallel.AttentionChoice` of the config's parallel.* (the config checks use it as it is;
planner/recommend.py replaces what the config leaves 'auto', the strategy and the tile, by
what it predicts fastest, and planner.resolve_run calls it once for a run).
"""

from __future__ import annotations

import parallel
from planner.run import configured_layout


def choice_from_config(config, num_shards: int, platform: str, strategy: str | None = None,
                       ulysses_degree: int | None = None, why: str = "configured",
                       tiles: tuple[int, int] | None = None,
                       layout: str | None = None) -> parallel.AttentionChoice:
    """The config's parallel.* on `num_shards` 'seq' devices of `platform`; `strategy` (and its
    degree), `tiles` and `layout` in place of the config's (for 'auto'; without them, its
    'auto' stands in as the natural layout, the ring strategy and the kernel's default tile).
    ValueError, one line, if the choice cannot run."""
    p = config.parallel
    if strategy is None and p.strategy == parallel.choice.AUTO:
        strategy, ulysses_degree = parallel.strategies.BASELINE, None
    degree = p.ulysses_degree if strategy is None else ulysses_degree
    tile_q, tile_k = tiles or config.parallel.tiles or (0, 0)
    return parallel.choose(layout=layout or configured_layout(config),
                           strategy=strategy or p.strategy, kernel=p.kernel,
                           tile_q=tile_q, tile_k=tile_k, seq_len=config.seq_len,
                           num_shards=num_shards, platform=platform,
                           q_heads=config.model.num_heads, ulysses_degree=degree, why=why)
