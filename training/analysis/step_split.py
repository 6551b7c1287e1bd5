"""How a train step splits into attention tiles and everything else on the machine at hand, and
the most any layout can gain over the ring layout on a run's own rows with that split.

    split = measure_split(config, tokens=8192, tile=512)   # one device, this process
    split.rest_s, split.tile_s                              # seconds = rest_s + tile_s x tiles
    rows = layout_bound(split, segment_ids, num_shards=2, tile=512)

The step is the config's real train step (training/step.py on the state training/state.py
builds) on this process's first device, `tokens` tokens a row (one device's share of a row
split N ways), attention tiles of `tile`, documents masked. Its rows are documents of equal
lengths (the whole row, halves, quarters, .. down to one tile), so the tiles it computes run
from the causal triangle down to the diagonal while everything else (embedding, projections,
MLP, loss, optimizer) stays the same: a least-squares line through (tiles, seconds) splits the
step. A row of the run then costs the ring layout rest + tile_s x its critical path in tiles
(parallel.cost: the busiest device on each ring step), and no layout less than rest + tile_s x
its tiles / N: every device busy, none waiting. Their ratio bounds what a layout can gain on
that row; `layout_bound` gives it per row.

The split assumes the rest does not depend on the documents and a tile costs the same masked or
not (both hold for the xla kernel on XLA:CPU: BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import numpy as np

import run_config
from parallel import cost
from planner import resolve_run
from planner.run import make_run
from training import step as step_lib
from training.analysis.aot import run_mesh
from training.state import create_train_state


@dataclasses.dataclass(frozen=True)
class StepSplit:
    rest_s: float  # a step's seconds outside the attention tiles
    tile_s: float  # seconds a computed tile adds (its forward and backward)
    points: tuple  # (document length, tiles, median seconds) measured


def document_rows(tokens: int, lengths) -> np.ndarray:
    """Segment ids [len(lengths), tokens]: row i is documents of lengths[i] tokens, end to end."""
    return np.stack([np.arange(tokens) // length for length in lengths]).astype(np.int32)


def measure_split(config, tokens: int, tile: int, repeats: int = 3) -> StepSplit:
    """Time the config's train step on one device (module docstring); `repeats` interleaved
    rounds over the document lengths, medians, after one untimed step (the compile)."""
    config = run_config.replace(config, {
        "seq_len": tokens, "global_batch_size": 1, "mesh.data": 1, "mesh.seq": 1,
        "data.mask_documents": True, "optim.grad_accum_steps": 1,  # the one row is the step
        "parallel.layout": "ring", "parallel.strategy": "ring", "parallel.tile": tile})
    run = make_run(config, 1)
    resolved = resolve_run(config, (1, 1), jax.devices()[0].platform, jax.devices()[0].device_kind)
    mesh = run_mesh(run)
    state, program = create_train_state(config, mesh, resolved)
    step = step_lib.jit_train_step(config, program, state, mesh.devices.flat[0].platform)
    lengths = [tokens >> k for k in range(tokens.bit_length()) if tokens >> k >= tile
               and tokens % (tokens >> k) == 0]
    segments = document_rows(tokens, lengths)
    rng = np.random.default_rng(0)
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))

    def batch(seg):
        fields = {"inputs": rng.integers(3, config.model.vocab_size, tokens),
                  "targets": rng.integers(3, config.model.vocab_size, tokens),
                  "weights": np.ones(tokens, np.float32), "segment_ids": seg,
                  "positions": np.arange(tokens) - np.searchsorted(seg, seg),
                  "order": np.arange(tokens)}
        return {k: jax.device_put(v[None].astype(np.float32 if k == "weights" else np.int32),
                                  sharding) for k, v in fields.items()}

    batches = [batch(seg) for seg in segments]
    seconds = [[] for _ in lengths]
    with jax.set_mesh(mesh):
        state, metrics = step(state, batches[0])
        jax.block_until_ready(metrics)
        for _ in range(repeats):
            for i, b in enumerate(batches):
                start = time.perf_counter()
                state, metrics = step(state, b)
                jax.block_until_ready(metrics)
                seconds[i].append(time.perf_counter() - start)
    tiles = [cost.single_device_tiles(seg, tile, tile) for seg in segments]
    medians = [statistics.median(s) for s in seconds]
    tile_s, rest_s = np.polyfit(tiles, medians, 1)
    return StepSplit(rest_s=float(rest_s), tile_s=float(tile_s),
                     points=tuple(zip(lengths, tiles, medians)))


def layout_bound(split: StepSplit, segment_ids, num_shards: int, tile: int) -> list[dict]:
    """Per row [S] of segment_ids (natural order): the ring layout's critical path and seconds,
    the seconds of the whole row's tiles shared evenly by num_shards devices, and their ratio
    (the most any layout gains over the ring on that row).

    Example: one document of 16 tokens, 2 devices, tiles of 4: ring path 3 + 4 = 7 tiles, all
    tiles 10, an even share 5; with rest 1 s and 1 s a tile, 8 s against 6 s, ratio 1.33."""
    rows = []
    for seg in np.atleast_2d(segment_ids):
        ring = cost.critical_path(cost.placement_tile_counts(np.arange(len(seg)), seg,
                                                             num_shards, tile, tile))
        even = cost.single_device_tiles(seg, tile, tile) / num_shards
        ring_s, even_s = split.rest_s + split.tile_s * ring, split.rest_s + split.tile_s * even
        rows.append(dict(ring_tiles=ring, even_tiles=even, ring_s=ring_s, even_s=even_s,
                         ratio=ring_s / even_s))
    return rows
