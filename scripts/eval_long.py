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

import argparse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a training run's --workdir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096],
                   help="context lengths in tokens")
    p.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0],
                   help="depths of the fact, 0 (start) to 1 (end)")
    p.add_argument("--probes", nargs="+", choices=["passkey", "needle"],
                   default=["passkey", "needle"])
    p.add_argument("--samples", type=int, default=4, help="prompts per cell")
    p.add_argument("--seed", type=int, default=0, help="seed of the facts and filler offsets")
    p.add_argument("--seq_shards", type=int, default=1,
                   help="devices each prompt is prefilled over (fake CPU devices)")
    p.add_argument("--layout", default=None,
                   help="attention layout of the prefill (default: the run's)")
    p.add_argument("--json", required=True,
                   help="where to write the table (the picture goes beside it)")
    return p.parse_args(argv)


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


def main(argv=None):
    args = parse_args(argv)
    import jax
    from training.cli import start_reader
    start_reader()
    jax.config.update("jax_num_cpu_devices", args.seq_shards)
    from flax import nnx

    import data
    from model import decode
    from training import probes
    from training.saved_run import RunError, held_out_tokens, load_run

    try:
        config, tokenizer, graphdef, params, step = load_run(
            args.workdir, args.step, args.seq_shards, {"tile_q": 0, "tile_k": 0},
            args.layout)
        filler = held_out_tokens(config, args.workdir, tokenizer)
        filler = filler[filler != tokenizer.eos_id]  # one stream of text, no document breaks
        cells = {name: probes.grid(probes.PROBES[name], tokenizer, filler, args.lengths,
                                   args.depths, args.samples, args.seed)
                 for name in args.probes}
    except (RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    mesh = nnx.merge(graphdef, params).mesh

    def generate(prompts):
        return decode.generate_sharded(graphdef, params, prompts, 8, mesh, temperature=0.0)

    table = {"workdir": args.workdir, "step": step, "trained_seq_len": config.seq_len,
             "layout": config.parallel.layout, "seq_shards": args.seq_shards,
             "samples": args.samples, "lengths": args.lengths, "depths": args.depths,
             "accuracy": {}}
    for name, probe_cells in cells.items():
        scores = probes.accuracy(probe_cells, generate, tokenizer,
                                 lambda done, total, name=name: progress(done, total, name))
        table["accuracy"][name] = {}
        for (length, depth, _, _), score in zip(probe_cells, scores):
            table["accuracy"][name].setdefault(str(length), {})[str(depth)] = score
    with open(args.json, "w") as f:
        json.dump(table, f, indent=1)
    picture = os.path.splitext(args.json)[0] + ".png"
    heatmap(table, picture)
    for name in cells:
        print(f"{name}: exact answers by length (columns) and depth (rows)")
        print("| depth | " + " | ".join(f"{n:,}" for n in args.lengths) + " |")
        print("|---|" + "---|" * len(args.lengths))
        for depth in args.depths:
            cells_text = " | ".join(f"{table['accuracy'][name][str(n)][str(depth)]:.2f}"
                                    for n in args.lengths)
            print(f"| {depth:g} | {cells_text} |")
    print(f"wrote {args.json} and {picture}")


if __name__ == "__main__":
    main()
