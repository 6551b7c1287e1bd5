"""Retrieval probes on a checkpoint: passkey and needle-in-a-haystack accuracy over a grid of
context lengths and depths (training/probes.py), as JSON and a heatmap picture beside it.

    python scripts/eval_long.py --workdir runs/default --lengths 1024 4096 16384 \
        --depths 0 0.25 0.5 0.75 1 --json runs/eval_long.json        # + runs/eval_long.png

Each cell holds --samples prompts of exactly its length: the fact at its depth inside held-out
text of the run's own corpus, the question at the end. The prompts are prefilled
sequence-parallel over --seq_shards devices (fake CPU devices) in the run's layout (or
--layout), and answered greedily; an answer counts when its digits are exactly the fact's.
"""

import json
import os
import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A training run's --workdir.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_multi_integer("lengths", [1024, 4096], "Context lengths in tokens (repeatable).")
flags.DEFINE_multi_float("depths", [0.0, 0.25, 0.5, 0.75, 1.0], "Depths of the fact, 0 to 1.")
flags.DEFINE_multi_enum("probes", ["passkey", "needle"], ["passkey", "needle"], "Probes to run.")
flags.DEFINE_integer("samples", 4, "Prompts per cell.")
flags.DEFINE_integer("seed", 0, "Seed of the facts and filler offsets.")
flags.DEFINE_integer("seq_shards", 1, "Devices each prompt is prefilled over.")
flags.DEFINE_string("layout", None, "Attention layout of the prefill (default: the run's).")
flags.DEFINE_string("json", None, "Where to write the table (the picture goes beside it).")
flags.mark_flags_as_required(["workdir", "json"])
FLAGS = flags.FLAGS


def progress(done: int, total: int, label: str) -> None:
    bar = "#" * (30 * done // total)
    sys.stderr.write(f"\r{label} [{bar:<30}] {done}/{total} cells")
    sys.stderr.write("\n" if done == total else "")
    sys.stderr.flush()


def heatmap(table: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    probes = list(table["accuracy"])
    fig, axes = plt.subplots(1, len(probes), figsize=(4.5 * len(probes), 3.8),
                             constrained_layout=True, squeeze=False)
    for ax, probe in zip(axes[0], probes):
        grid = [[table["accuracy"][probe][str(n)][str(d)] for n in table["lengths"]]
                for d in table["depths"]]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(table["lengths"])), [f"{n:,}" for n in table["lengths"]])
        ax.set_yticks(range(len(table["depths"])), [f"{d:g}" for d in table["depths"]])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("depth of the fact")
        ax.set_title(f"{probe} (trained at {table['trained_seq_len']:,})")
    fig.colorbar(image, ax=axes[0].tolist(), label="exact answers")
    fig.savefig(path, dpi=110)


def main(argv):
    del argv
    import jax
    from training.cli import start_reader
    start_reader()
    jax.config.update("jax_num_cpu_devices", FLAGS.seq_shards)
    from flax import nnx

    import data
    from model import decode
    from training import probes
    from training.saved_run import RunError, held_out_tokens, load_run

    try:
        config, tokenizer, graphdef, params, step = load_run(
            FLAGS.workdir, FLAGS.step, FLAGS.seq_shards, {"tile_q": 0, "tile_k": 0},
            FLAGS.layout)
        filler = held_out_tokens(config, FLAGS.workdir, tokenizer)
        filler = filler[filler != tokenizer.eos_id]  # one stream of text, no document breaks
        cells = {name: probes.grid(probes.PROBES[name], tokenizer, filler, FLAGS.lengths,
                                   FLAGS.depths, FLAGS.samples, FLAGS.seed)
                 for name in FLAGS.probes}
    except (RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    mesh = nnx.merge(graphdef, params).mesh

    def generate(prompts):
        return decode.generate_sharded(graphdef, params, prompts, 8, mesh, temperature=0.0)

    table = {"workdir": FLAGS.workdir, "step": step, "trained_seq_len": config.seq_len,
             "layout": config.parallel.layout, "seq_shards": FLAGS.seq_shards,
             "samples": FLAGS.samples, "lengths": FLAGS.lengths, "depths": FLAGS.depths,
             "accuracy": {}}
    for name, probe_cells in cells.items():
        scores = probes.accuracy(probe_cells, generate, tokenizer,
                                 lambda done, total, name=name: progress(done, total, name))
        table["accuracy"][name] = {}
        for (length, depth, _, _), score in zip(probe_cells, scores):
            table["accuracy"][name].setdefault(str(length), {})[str(depth)] = score
    with open(FLAGS.json, "w") as f:
        json.dump(table, f, indent=1)
    picture = os.path.splitext(FLAGS.json)[0] + ".png"
    heatmap(table, picture)
    for name in cells:
        print(f"{name}: exact answers by length (columns) and depth (rows)")
        print("| depth | " + " | ".join(f"{n:,}" for n in FLAGS.lengths) + " |")
        print("|---|" + "---|" * len(FLAGS.lengths))
        for depth in FLAGS.depths:
            cells_text = " | ".join(f"{table['accuracy'][name][str(n)][str(depth)]:.2f}"
                                    for n in FLAGS.lengths)
            print(f"| {depth:g} | {cells_text} |")
    print(f"wrote {FLAGS.json} and {picture}")


if __name__ == "__main__":
    app.run(main)
