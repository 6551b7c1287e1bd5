"""Checks a run config (a run_config.RunConfig) before anything is compiled or written: one clear
line per problem."""

from __future__ import annotations

import dataclasses

import parallel
import run_config
from data import DataError
from data.sources import most_tokens
from model import mixers
from model.config import AUTO, FULL, SLIDING
from parallel.experts import expert_split
from planner.attention import choice_from_config
from planner.run import configured_layout
from run_config import ConfigError
from training.resume import RUN_FIELDS


def _mesh_shape(config, device_count):
    try:
        return parallel.mesh_shape(config.mesh.data, config.mesh.seq, device_count)
    except ValueError:
        raise ConfigError(
            f"mesh.data x mesh.seq = {config.mesh.data} x {config.mesh.seq} does not match the "
            f"{device_count} devices: choose sizes whose product is {device_count} "
            f"(or -1 for one of them)") from None


def _validate_experts(config, data: int, seq: int):
    """model.moe is a valid expert layer, and mesh.expert splits its experts over groups of
    devices the mesh has (parallel/experts.py expert_split)."""
    expert, moe = config.mesh.expert, config.model.moe
    try:
        if expert != 1 and not moe.num_experts:
            raise ValueError(f"mesh.expert={expert} splits experts, but model.moe.num_experts is "
                             "0: set model.moe.num_experts, or mesh.expert=1")
        expert_split({parallel.DATA: data, parallel.SEQ: seq}, expert)
        dataclasses.replace(moe, expert_devices=expert)  # checks num_experts % expert
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _validate_kernel(p, platform):
    """parallel.kernel runs on this backend (the names of layout, strategy and tile are
    ParallelConfig's own to check)."""
    try:
        parallel.resolve_kernel(p.kernel, platform)
    except ValueError as e:
        raise ConfigError(f"parallel.kernel={p.kernel!r}: {e}") from None


def validate_config(config, device_count: int, process_count: int, platform: str = "cpu") -> None:
    """ConfigError on the first problem. process_count no longer limits anything (rows may be
    split over processes); the train loop and the planner still pass it.

    Example: tiny.py with global_batch_size=1 and mesh data 1 x seq 2 on 2 devices validates
    whether they are one process or two (each then builds half of the row).
    """
    config = run_config.typed(config)  # each section has checked its own fields
    _validate_kernel(config.parallel, platform)
    _validate_resume_accepts(config.resume_accepted)
    data, seq = _mesh_shape(config, device_count)
    _validate_experts(config, data, seq)
    try:
        parallel.check_divisible(configured_layout(config), config.seq_len, seq)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    block = config.block(seq)
    for field in ("loss_chunk", "mlp_chunk", "linear_chunk"):
        size = getattr(config.model, field)
        if not isinstance(size, int) or isinstance(size, bool):
            continue  # 'auto', or a wrong kind of value (_validate_switches says which)
        if size < 0 or (size and block % size):
            raise ConfigError(f"model.{field}={size} does not divide the per-device block of "
                              f"{block} tokens (seq_len / mesh.seq): choose a divisor of {block}"
                              f" (0 = whole)")
    _validate_tile(config, block)
    _validate_attention(config, seq, platform)
    # Not the processes: a process builds only the rows and columns its devices hold, so one row
    # may be split over hosts along 'seq' (data/pipeline.py, local_block).
    accum = config.optim.grad_accum_steps
    for what, count in (("the data shards", data),
                        ("data shards x optim.grad_accum_steps", data * accum)):
        if config.global_batch_size % count:
            raise ConfigError(f"global_batch_size={config.global_batch_size} is not divisible "
                              f"by {what} ({count}): use a multiple of {count}")
    _validate_model(config.model, device_count)
    _validate_corpus_size(config)


def _validate_resume_accepts(accepted) -> None:
    unknown = [name for name in accepted if name not in RUN_FIELDS]
    if unknown:
        raise ConfigError(f"resume_accepts names {unknown[0]!r}: choose among "
                          f"{', '.join(RUN_FIELDS)} (comma-separated)")


def _validate_corpus_size(config):
    """Refuses, before a tokenizer is trained or a token read, a corpus that cannot hold one
    training and one eval batch even at the most tokens its bytes could make (the eval split
    grows to one batch by itself, data/token_cache.py; a run needs a batch of each)."""
    try:
        bound = most_tokens(config.data.source, config.data.max_bytes)
    except DataError:
        return  # a missing source is the data pipeline's one-line error
    batch = config.global_batch_size * config.seq_len + 1
    if bound is not None and bound < 2 * batch:
        raise ConfigError(f"data.source={config.data.source!r} can make at most "
                          f"{bound:,} tokens, fewer than one training and one eval batch of "
                          f"{config.global_batch_size} x {config.seq_len + 1:,} tokens need: "
                          f"bring a larger corpus, or lower seq_len or global_batch_size")


def _validate_tile(config, block: int) -> None:
    """parallel.tile's tiles divide the per-device block ('auto' and 0 give none)."""
    for tile in config.parallel.tiles or ():
        if tile and block % tile:
            raise ConfigError(f"parallel.tile={config.parallel.tile!r}: {tile} does not divide "
                              f"the per-device block of {block} tokens (seq_len / mesh.seq): "
                              f"choose a divisor of {block}, or 'auto'")


def _validate_attention(config, seq, platform):
    """The kernel compiles the tiles it gets (parallel.tile, or its defaults: 'auto' weighs
    only tiles it compiles), and parallel.ulysses_degree fits the strategy, mesh.seq and the
    query heads ('auto' picks a degree that does)."""
    p = config.parallel
    tile = f"parallel.tile={p.tile!r}"
    fields = (f"parallel.kernel={p.kernel!r}, {tile}" if p.strategy == AUTO else
              f"parallel.strategy={p.strategy!r}, parallel.kernel={p.kernel!r}, "
              f"parallel.ulysses_degree, {tile}, model.num_heads")
    try:
        choice_from_config(config, seq, platform)  # a strategy left 'auto': the ring's
    except ValueError as e:
        raise ConfigError(f"{fields}: {e}") from None


def _validate_model(m, device_count):
    # Parameters are sharded on their first axis over every device (FSDP).
    for name, size in (("d_model", m.d_model), ("mlp_dim", m.mlp_dim),
                       ("vocab_size", m.vocab_size), ("num_heads x head_dim",
                                                      m.num_heads * m.head_dim)):
        if size % device_count:
            raise ConfigError(f"model.{name}={size} is not divisible by the {device_count} "
                              f"devices its parameters are sharded over: use a multiple of "
                              f"{device_count}")
    _validate_attention_kinds(m)


def _validate_attention_kinds(m):
    """Per-layer attention (model.layer_types and what goes with it), one line each."""
    types = m.layer_types
    if types and len(types) != m.num_layers:
        raise ConfigError(f"model.layer_types has {len(types)} entries for "
                          f"model.num_layers={m.num_layers}: give one per layer, or () for all "
                          f"'{FULL}'")
    unknown = sorted(set(types) - set(mixers.layer_types()))
    if unknown:
        raise ConfigError(f"model.layer_types: {unknown[0]!r} is not a layer type: use "
                          f"{' or '.join(repr(t) for t in mixers.layer_types())}")
    try:  # what each kind of mixer the layers use asks of the config (model/mixers)
        mixers.check(m)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    window = m.sliding_window
    if window < 0 or (SLIDING in types and not window):
        raise ConfigError(f"model.sliding_window={window}: sliding layers need a window of at "
                          f"least 1 token (keys a query sees, itself included)")
