"""The docs' pictures, each from one command (needs matplotlib: pip install -e '.[plots]').

  python scripts/plot_figures.py work        # work per device per ring step, every layout
  python scripts/plot_figures.py throughput runs/bench_train_lengths.json   # bench_train --json
  python scripts/plot_figures.py losses runs/cmp_ring runs/cmp_striped runs/cmp_zigzag ...
  python scripts/plot_figures.py positions runs/extend_8k   # the loss by position over training

work: tiles[d, s], the tiles device d computed on ring step s as the kernel itself counts them
(parallel.attention_with_stats on N fake CPU devices), for each layout, on one long document and
on a row of packed documents of the default config's corpus (masked). The devices wait for each
other at every hop, so a step lasts as long as its busiest device: a dark cell beside light ones
is time the others spend idle. Titles give the critical path (sum over steps of the busiest
device) and the efficiency (single-device tiles / N / critical path).

throughput: median tokens/s of train.py per layout against the sequence length, and the ratio to
ring, from scripts/bench/train.py's JSON (bars: min and max over its windows).

losses: train/loss of training runs (their metrics.jsonl) overlaid, and each run's distance from
the first: runs of one config that differ only in layout should coincide.

positions: eval/loss_by_position of one run at each of its evals (train.py logs it with
config.eval_position_buckets), one curve per eval step, coloured from early to late: a curve
that keeps falling along the positions is a model that uses its context.

Each writes a PNG where --out says; by default beside what it reads: throughput beside the JSON
(runs/bench_train_lengths.png), losses beside the first run (runs/losses.png), positions in the
run (WORKDIR/loss_by_position.png), work under runs/. The repository's own figures
(docs/figures/) are redrawn only when --out names them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from planner.documents import kernel_counts, stdlib_rows
from storage.run_dir import RunDir, read_metrics

LAYOUTS = ("ring", "striped", "zigzag", "balanced")
LOSSES = ("train/loss", "eval/loss")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDLIB_WORKDIR = os.path.join(ROOT, "runs", "bench_documents")  # its tokenizer, token cache


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="figure", required=True)
    work = sub.add_parser("work", help="tiles per device per ring step (kernel counters)")
    work.add_argument("--shards", type=int, default=8, help="ring size N (fake CPU devices)")
    work.add_argument("--seq-len", type=int, default=16384)
    work.add_argument("--tile", type=int, default=256, help="tile_q = tile_k")
    work.add_argument("--documents", default="stdlib",
                      help="the packed row: stdlib (the default config's corpus) or a length "
                           "spec such as exp:2048")
    work.add_argument("--out", help="the PNG (default: runs/work_per_step.png)")
    tput = sub.add_parser("throughput", help="tokens/s vs sequence length (bench_train JSON)")
    tput.add_argument("json", help="scripts/bench/train.py --json output")
    tput.add_argument("--out", help="the PNG (default: the JSON's path with .png)")
    losses = sub.add_parser("losses", help="loss curves of train.py runs overlaid")
    losses.add_argument("workdirs", nargs="+", help="train.py workdirs (metrics.jsonl)")
    losses.add_argument("--out", help="the PNG (default: losses.png beside the first workdir)")
    positions = sub.add_parser("positions", help="the loss by position at each eval of a run")
    positions.add_argument("workdirs", nargs=1, metavar="workdir", help="a train.py workdir")
    positions.add_argument("--out", help="the PNG (default: WORKDIR/loss_by_position.png)")
    args = p.parse_args(argv)
    args.out = args.out or default_out(args)
    return args


def default_out(args) -> str:
    """Beside what the figure reads, never into the repository's docs/figures/."""
    if args.figure == "throughput":
        return os.path.splitext(args.json)[0] + ".png"
    if args.figure == "losses":
        return os.path.join(os.path.dirname(os.path.abspath(args.workdirs[0])), "losses.png")
    if args.figure == "positions":
        return os.path.join(args.workdirs[0], "loss_by_position.png")
    return os.path.join("runs", "work_per_step.png")


def pyplot():
    try:
        import matplotlib
    except ImportError:
        fail("matplotlib is not installed: pip install -e '.[plots]'")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


# ---------------------------------------------------------------- work per device per step

def packed_row(args):
    """Segment ids [S] of one row of packed documents (natural order)."""
    if args.documents != "stdlib":
        from data.document_lengths import packed_segment_ids
        return packed_segment_ids(args.documents, 1, args.seq_len)[0]
    return stdlib_rows(args.seq_len, 1, STDLIB_WORKDIR)[0]


def kernel_tiles(seg_row, layout, shards, tile):
    """tiles[d, s] as the kernel (the backend's default) counted them, the row laid out by
    `layout`."""
    return kernel_counts(seg_row, layout, shards, tile, "auto")[0]


def plot_work(args):
    if "jax" not in sys.modules:  # N fake devices, set before JAX starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.shards}")
    import numpy as np

    from parallel import cost

    rows = {"one document (unmasked)": np.zeros(args.seq_len, np.int32),
            f"packed documents ({args.documents}), masked": packed_row(args)}
    plt = pyplot()
    fig, axes = plt.subplots(len(LAYOUTS), len(rows), figsize=(4.2 * len(rows), 2.6 * len(LAYOUTS)),
                             squeeze=False, constrained_layout=True)
    for col, (title, seg) in enumerate(rows.items()):
        single = int(kernel_tiles(seg, "ring", 1, args.tile).sum())
        counts = {layout: kernel_tiles(seg, layout, args.shards, args.tile) for layout in LAYOUTS}
        top = max(int(c.max()) for c in counts.values())
        for row, (layout, tiles) in enumerate(counts.items()):
            ax = axes[row, col]
            image = ax.imshow(tiles, cmap="viridis", vmin=0, vmax=top, aspect="auto")
            ax.set_title(f"{layout}: critical path {cost.critical_path(tiles)} tiles, "
                         f"eff. {cost.document_efficiency(tiles, single):.2f}", fontsize=9)
            ax.set_xlabel("ring step")
            ax.set_ylabel("device")
            ax.set_xticks(range(args.shards))
            ax.set_yticks(range(args.shards))
        fig.colorbar(image, ax=axes[:, col], label=f"{args.tile}x{args.tile} tiles computed",
                     shrink=0.6)
        axes[0, col].annotate(title, (0.5, 1.25), xycoords="axes fraction", ha="center",
                              fontsize=11, weight="bold")
    fig.suptitle(f"Work per device per ring step: S = {args.seq_len:,}, N = {args.shards} "
                 f"devices, tiles {args.tile}", fontsize=12)
    return fig


# ---------------------------------------------------------------- tokens/s vs length

def plot_throughput(args):
    with open(args.json) as f:
        bench = json.load(f)
    results, a = bench["results"], bench["args"]
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    kinds = sorted({(r["layout"], r["strategy"], r["masked"]) for r in results},
                   key=lambda k: (k[2], LAYOUTS.index(k[0]) if k[0] in LAYOUTS else 9, k[1]))
    for layout, strategy, masked in kinds:
        mine = sorted((r for r in results if (r["layout"], r["strategy"], r["masked"])
                       == (layout, strategy, masked)), key=lambda r: r["seq_len"])
        lengths = [r["seq_len"] for r in mine]
        median = [r["median_tokens_per_sec"] for r in mine]
        spread = [[m - min(r["windows"]) for m, r in zip(median, mine)],
                  [max(r["windows"]) - m for m, r in zip(median, mine)]]
        label = (f"{layout}" + ("" if strategy == "ring" else f" ({strategy})")
                 + (", documents masked" if masked else ""))
        style = "--" if masked else "-"
        left.errorbar(lengths, median, yerr=spread, fmt=style + "o", capsize=3, label=label)
        if all(r["x_ring"] is not None for r in mine):
            right.plot(lengths, [r["x_ring"] for r in mine], style + "o", label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["seq_len"] for r in results}),
                      [f"{s:,}" for s in sorted({r["seq_len"] for r in results})])
        ax.set_xlabel("sequence length (tokens per row)")
        ax.grid(alpha=0.3)
    left.set_ylabel("tokens/s (median of steady-state steps)")
    left.set_title("train.py throughput")
    right.set_ylabel("tokens/s / ring's tokens/s")
    right.set_title("speed-up over the ring layout")
    right.axhline(1.0, color="gray", lw=0.8)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"{os.path.basename(a['config'])}, batch {a['batch']}, tiles {a['tile']}, "
                 f"{a['processes']} processes each pinned to one CPU core", fontsize=11)
    return fig


# ---------------------------------------------------------------- losses

def plot_losses(args):
    runs = {os.path.basename(os.path.normpath(w)): read_metrics(w, LOSSES)
            for w in args.workdirs}
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw=dict(height_ratios=[2, 1]),
                                      constrained_layout=True)
    first_name, first = next(iter(runs.items()))
    for i, (name, steps) in enumerate(runs.items()):
        xs = sorted(s for s in steps if "train/loss" in steps[s])
        line, = top.plot(xs, [steps[s]["train/loss"] for s in xs], lw=2.5 - 0.5 * min(i, 3),
                         label=name)
        if i:  # exact agreement is drawn at the floor of the log axis
            shared = [s for s in xs if "train/loss" in first.get(s, {})]
            gap = [max(abs(steps[s]["train/loss"] - first[s]["train/loss"]), 1e-9)
                   for s in shared]
            bottom.plot(shared, gap, "o-", ms=3, color=line.get_color(), label=name)
    top.set_ylabel("train/loss (nats per token)")
    top.set_title("Loss curves of the layouts overlaid (one config, one seed)")
    top.legend()
    top.grid(alpha=0.3)
    bottom.set_yscale("log")
    bottom.set_ylabel(f"|loss - {first_name}|\n(equal: drawn at 1e-9)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    if len(runs) > 1:
        bottom.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------- loss by position

def plot_positions(args):
    with open(RunDir(args.workdirs[0]).metrics) as f:
        rows = [r for r in map(json.loads, f) if "eval/loss_by_position" in r]
    if not rows:
        fail(f"{args.workdirs[0]}/metrics.jsonl has no eval/loss_by_position: train with "
             f"config.eval_position_buckets > 0")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    colours = plt.get_cmap("viridis")
    for i, row in enumerate(rows):
        width, values = row["eval/position_bucket_tokens"], row["eval/loss_by_position"]
        xs = [(k + 0.5) * width for k in range(len(values))]
        stage = f", stage {row['progress/stage']}" if "progress/stage" in row else ""
        ax.plot(xs, values, "o-", ms=3, color=colours(i / max(len(rows) - 1, 1)),
                label=f"step {row['step']}{stage}")
    ax.set_xlabel("position in the document (middle of each range of tokens)")
    ax.set_ylabel("eval loss (nats per token)")
    ax.set_title(f"Loss by position at each eval: {os.path.basename(args.workdirs[0])}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def fail(message: str):
    print(f"plot_figures: {message}", file=sys.stderr)
    sys.exit(2)


def check_inputs(args):
    """One line and exit 2 for a missing input, before anything is computed."""
    if args.figure == "throughput" and not os.path.isfile(args.json):
        fail(f"no file {args.json}: give scripts/bench/train.py's --json output")
    for workdir in getattr(args, "workdirs", []):
        if not os.path.isfile(RunDir(workdir).metrics):
            fail(f"no {workdir}/metrics.jsonl: give train.py workdirs")


def main(argv=None):
    args = parse_args(argv)
    check_inputs(args)
    pyplot()  # fails early, in one line, without matplotlib
    draw = dict(work=plot_work, throughput=plot_throughput, losses=plot_losses,
                positions=plot_positions)[args.figure]
    fig = draw(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
