"""A checkpoint's retrieval over a grid of lengths and depths, and its loss along the positions
of held-out text: what scripts/eval_long.py prints and scripts/bench/extension.py compares.

    table = evaluate("runs/passkey/stage2", lengths=[1024, 16384], depths=[0, 0.5, 1],
                     samples=10, seed=0, seq_shards=4)
    table["accuracy"]["passkey"]["16384"]["0.5"]   # share of exact answers in that cell
    table["replies"]["passkey"]["16384"]["0.5"]    # {"keys": [...], "replies": [...]}
    text_loss_by_position("runs/passkey/stage2", 16384, buckets=8, rows=4)   # [8 floats]

Every prompt is prefilled sequence-parallel over `seq_shards` devices in the run's layout (or
`layout`) and answered greedily through the sharded KV cache (model/decode.py), as sample.py
does; the prompts are training/evaluation/probes.py's, their filler the run's held-out text.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from model import decode
from training.evaluation import probes
from training.evaluation import position_loss
from training.saved_run import RunError, held_out_tokens, load_run, stretched_model

ANSWER_TOKENS = 8  # greedy tokens decoded after each prompt: ' ' and five digits, and spare


def _load(workdir, step, seq_shards, layout):
    """(config, tokenizer, graphdef, params, step, held-out text as one stream of tokens)."""
    config, tokenizer, graphdef, params, step = load_run(
        workdir, step, seq_shards, tile=0, layout=layout)
    text = held_out_tokens(config, workdir, tokenizer)
    return config, tokenizer, graphdef, params, step, text[text != tokenizer.eos_id]


def evaluate(workdir: str, *, lengths, depths, samples: int, seed: int = 0,
             seq_shards: int = 1, layout: str | None = None, step: int | None = None,
             probe_names=("passkey",), progress=None, prompts=None,
             dynamic_rope: bool = False) -> dict:
    """The probes' table for a run's checkpoint: accuracy and every reply beside its key, per
    probe, length and depth. progress(probe, done, total) after each cell; prompts: a dict to
    fill with {probe: [(length, depth, the prompts' texts, their keys)]}, for writing out (each
    text encodes to its prompt's ids); dynamic_rope: prompts longer than the run's trained
    length are read with its RoPE stretched to their length (training/extension.py)."""
    config, tokenizer, graphdef, params, step, filler = _load(workdir, step, seq_shards, layout)
    cells = {name: probes.grid(probes.PROBES[name], tokenizer, filler, lengths, depths,
                               samples, seed) for name in probe_names}
    if prompts is not None:
        prompts.update({name: [(n, d, [tokenizer.decode(p) for p in ps], keys)
                               for n, d, ps, keys in grid] for name, grid in cells.items()})
    mesh = nnx.merge(graphdef, params).mesh

    graphs = {}  # prompt length -> graphdef

    def generate(batch):
        length = max(len(prompt) for prompt in batch)
        if length not in graphs:
            graphs[length] = (stretched_model(config, graphdef, length)[1] if dynamic_rope
                              else graphdef)
        return decode.generate_sharded(graphs[length], params, batch, ANSWER_TOKENS, mesh,
                                       temperature=0.0)

    table = {"workdir": workdir, "step": step, "trained_seq_len": config.seq_len,
             "layout": config.parallel.layout, "seq_shards": seq_shards, "samples": samples,
             "dynamic_rope": dynamic_rope, "seed": seed, "lengths": list(lengths),
             "depths": list(depths), "accuracy": {}, "replies": {}}
    for name, grid in cells.items():
        said = probes.replies(grid, generate, tokenizer,
                              None if progress is None else
                              lambda done, total, name=name: progress(name, done, total))
        table["accuracy"][name], table["replies"][name] = {}, {}
        for (length, depth, _, keys), score, got in zip(grid, probes.accuracy(grid, said),
                                                        said):
            table["accuracy"][name].setdefault(str(length), {})[str(depth)] = score
            table["replies"][name].setdefault(str(length), {})[str(depth)] = {
                "keys": keys, "replies": got}
    return table


def mean_over_depths(table: dict, probe: str = "passkey") -> dict[int, float]:
    """{length: the mean accuracy over the table's depths}."""
    return {int(n): float(np.mean(list(row.values())))
            for n, row in table["accuracy"][probe].items()}


def markdown(table: dict, probe: str = "passkey") -> str:
    """The table as markdown rows: depths down, lengths across, their means below."""
    lengths, depths = table["lengths"], table["depths"]
    cells = table["accuracy"][probe]
    lines = ["| depth | " + " | ".join(f"{n:,}" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for depth in depths:
        lines.append(f"| {depth:g} | " + " | ".join(f"{cells[str(n)][str(depth)]:.2f}"
                                                     for n in lengths) + " |")
    means = mean_over_depths(table, probe)
    lines.append("| mean | " + " | ".join(f"{means[n]:.2f}" for n in lengths) + " |")
    return "\n".join(lines)


def text_loss_by_position(workdir: str, length: int, *, buckets: int, rows: int,
                          seq_shards: int = 1, layout: str | None = None,
                          step: int | None = None, dynamic_rope: bool = False) -> list[float]:
    """The mean next-token loss in `buckets` equal ranges of positions 0..length-1, over `rows`
    windows of the run's held-out text read as one document each (the probes' filler, without
    a fact): does the text stay predictable along the whole context? dynamic_rope: as in
    `evaluate`, each window read with the RoPE stretched to `length`."""
    config, _, graphdef, params, _, text = _load(workdir, step, seq_shards, layout)
    if dynamic_rope:
        graphdef = stretched_model(config, graphdef, length)[1]
    if len(text) < rows * (length + 1):
        raise RunError(f"{workdir}'s held-out text has {len(text):,} tokens, fewer than "
                       f"{rows} rows of {length + 1:,}: ask for fewer rows or hold out more "
                       f"(data.eval_fraction)")
    windows = np.stack([np.asarray(text[i * (length + 1):(i + 1) * (length + 1)], np.int32)
                        for i in range(rows)])
    mesh = nnx.merge(graphdef, params).mesh
    batch = position_loss.on_mesh(position_loss.position_batch(
        windows, config.parallel.layout, seq_shards), mesh)
    with jax.set_mesh(mesh):
        return position_loss.curve(position_loss.make_position_eval(graphdef, buckets), params,
                                   batch)
