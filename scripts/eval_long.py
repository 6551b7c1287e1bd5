"""Retrieval probes on a checkpoint: passkey (and needle-in-a-haystack) accuracy over a grid of
context lengths and depths (training/evaluation/probes.py), as JSON and a heatmap picture beside it.

    python scripts/eval_long.py --workdir runs/passkey --seq_shards 4 \
        --json runs/passkey_probes.json                          # + runs/passkey_probes.png
    python scripts/eval_long.py --workdir runs/default --lengths 1024 4096 --depths 0 0.5 1 \
        --probes passkey needle --samples 4 --json runs/eval_long.json

Each cell holds --samples prompts of exactly its length: the fact at its depth inside held-out
text of the run's own corpus, the question at the end, in data/passkey.py's template, with keys
training never states (--seed picks them, the filler and its offsets). The prompts are
prefilled sequence-parallel over --seq_shards devices (fake CPU devices) in the run's layout (or
--layout), and answered greedily; an answer counts when its digits are exactly the fact's. The
JSON holds every reply beside its key; --write_prompts DIR writes each prompt's text, to give
to scripts/sample.py (the same prompt, the same answer). --dynamic_rope reads the prompts
longer than the run's trained length with its RoPE stretched to their length, as sample.py
--dynamic_rope does.
"""

import json
import os
import sys

import argparse

DEPTHS = [round(i / 9, 3) for i in range(10)]  # 0, 0.111, ..., 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a training run's --workdir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384],
                   help="context lengths in tokens")
    p.add_argument("--depths", type=float, nargs="+", default=DEPTHS,
                   help="depths of the fact, 0 (start) to 1 (end); default 10 evenly spaced")
    p.add_argument("--probes", nargs="+", choices=["passkey", "needle"], default=["passkey"])
    p.add_argument("--samples", type=int, default=10, help="prompts (keys) per cell")
    p.add_argument("--seed", type=int, default=0, help="seed of the facts and filler offsets")
    p.add_argument("--seq_shards", type=int, default=1,
                   help="devices each prompt is prefilled over (fake CPU devices)")
    p.add_argument("--layout", default=None,
                   help="attention layout of the prefill (default: the run's)")
    p.add_argument("--json", required=True,
                   help="where to write the table (the picture goes beside it)")
    p.add_argument("--dynamic_rope", action="store_true",
                   help="read prompts longer than the run's trained length with its RoPE "
                        "stretched to their length (dynamic scaling, training/extension.py)")
    p.add_argument("--write_prompts", default=None, metavar="DIR",
                   help="also write each prompt's text to DIR/PROBE-LENGTH-DEPTH-SAMPLE.txt")
    args = p.parse_args(argv)
    if args.samples < 1 or min(args.lengths) < 1 or not all(0 <= d <= 1 for d in args.depths):
        p.error("--samples and --lengths must be positive, --depths within 0..1")
    return args


def progress(label: str, done: int, total: int) -> None:
    """A bar redrawn in place on a terminal; in a piped log, a line at each tenth of the cells
    (a redrawn bar would pile up there as one long line)."""
    if sys.stderr.isatty():
        bar = "#" * (30 * done // total)
        sys.stderr.write(f"\r{label} [{bar:<30}] {done}/{total} cells")
        sys.stderr.write("\n" if done == total else "")
    elif done == total or 10 * done // total > 10 * (done - 1) // total:
        sys.stderr.write(f"{label}: {done}/{total} cells\n")
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
        ax.set_title(f"{probe} (trained at {table['trained_seq_len']:,}"
                     + (", RoPE stretched past it)" if table.get("dynamic_rope") else ")"))
    fig.colorbar(image, ax=axes[0].tolist(), label="exact answers")
    fig.savefig(path, dpi=110)


def write_prompts(directory: str, cells: dict) -> None:
    """Each prompt's text (encoding it gives the probe's prompt) and a keys.json of which key
    each file asks for."""
    os.makedirs(directory, exist_ok=True)
    keys = {}
    for name, grid in cells.items():
        for length, depth, prompts, answers in grid:
            for i, (prompt, answer) in enumerate(zip(prompts, answers)):
                file = f"{name}-{length}-{depth:g}-{i}.txt"
                with open(os.path.join(directory, file), "w", encoding="utf-8",
                          newline="") as f:
                    f.write(prompt)
                keys[file] = answer
    with open(os.path.join(directory, "keys.json"), "w") as f:
        json.dump(keys, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    import jax
    from training.cli import start_reader
    start_reader()
    jax.config.update("jax_num_cpu_devices", args.seq_shards)

    import data
    from training.evaluation import retrieval
    from training.saved_run import RunError

    cells = {}
    try:
        table = retrieval.evaluate(
            args.workdir, lengths=args.lengths, depths=args.depths, samples=args.samples,
            seed=args.seed, seq_shards=args.seq_shards, layout=args.layout, step=args.step,
            probe_names=args.probes, progress=progress, prompts=cells,
            dynamic_rope=args.dynamic_rope)
    except (RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.write_prompts:
        write_prompts(args.write_prompts, cells)
    with open(args.json, "w") as f:
        json.dump(table, f, indent=1)
    picture = os.path.splitext(args.json)[0] + ".png"
    heatmap(table, picture)
    for name in args.probes:
        print(f"{name}: exact answers by length (columns) and depth (rows), "
              f"{args.samples} keys a cell"
              + (", RoPE stretched past the trained length" if args.dynamic_rope else ""))
        print(retrieval.markdown(table, name))
    print(f"wrote {args.json} and {picture}")


if __name__ == "__main__":
    main()
