"""A run's attention, resolved once from its config: `choice_from_config` for the configured
choice, `resolve_attention` for what the run really uses (strategy='auto' replaced by the
planner's recommendation on this mesh and device). The config checks, the train loop, the
planner and sample.py all read the `parallel.AttentionChoice` these return.
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


def resolve_attention(config, mesh_shape, platform: str,
                      device_kind: str) -> parallel.AttentionChoice:
    """The attention this run uses on a (data, seq) mesh of `device_kind` devices: the
    configured choice, or for parallel.strategy='auto' the strategy `planner.recommend` picks
    (the fastest predicted step whose memory fits), with a line saying why."""
    if config.parallel.strategy != "auto":
        return choice_from_config(config, mesh_shape[1], platform)
    from planner import recommend  # the cost model imports this module's neighbours
    return recommend.auto_choice(config, mesh_shape, platform, device_kind)
