"""Parallel efficiency of every layout with packed documents, from the kernel's own counters.

Usage:
  python scripts/bench/documents.py                       # stdlib rows + synthetic lengths
  python scripts/bench/documents.py --sources exp:2048 --tiles 512 --rows 2 --json runs/d.json

For each source of document lengths, each row of --seq-len tokens and each tile size:

    single = tiles ONE device computes on the whole row in natural order
             (`attention_with_stats` on a 1-device mesh: same tile, same skip rules)
    path   = sum over ring steps of the busiest device's tiles
             (`attention_with_stats` on N devices, in the layout's order)
    efficiency = single / N / path

1.0 means the N devices share exactly the single device's work and never wait for each other.
The table prints the mean over rows (and the worst row for balanced), and the host time that
balanced's placement took per row.

Sources: `stdlib` (the embedded corpus, tokenized as configs/default.py does, rows cut as the
training data cuts them, documents at EOS), or a length spec of data/document_lengths.py:
`exp:MEAN` (exponential lengths), `lognormal:MU:SIGMA` (heavy-tailed), `pareto:ALPHA:MIN`
(heavier), `one` (one document per row). q, k, v are zeros with one head of 8: only the counts
matter, not the values.
"""

from __future__ import annotations

import argparse
import json
import os

from planner.documents import kernel_counts, stdlib_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYOUTS = ("ring", "striped", "zigzag", "balanced")

STDLIB_WORKDIR = os.path.join(ROOT, "runs", "bench_documents")  # its tokenizer, token cache


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sources", nargs="+",
                   default=["stdlib", "exp:2048", "exp:256", "exp:16384", "lognormal:7.5:1.5",
                            "pareto:1.5:512", "one"])
    p.add_argument("--seq-len", type=int, default=65536)
    p.add_argument("--shards", type=int, default=8, help="N, fake CPU devices on 'seq'")
    p.add_argument("--tiles", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--rows", type=int, default=4, help="rows per source")
    p.add_argument("--kernel", default="xla")
    p.add_argument("--workdir", default=STDLIB_WORKDIR,
                   help="where the stdlib tokenizer and token cache are built (once)")
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


def measure(args, source, rows):
    """One result dict per tile: mean efficiency per layout, worst balanced row, placing time."""
    import numpy as np

    from parallel import cost

    results = []
    for tile in args.tiles:
        eff = {layout: [] for layout in LAYOUTS}
        placing = []
        for row in rows:
            single, _ = kernel_counts(row, "ring", 1, tile, args.kernel)
            for layout in LAYOUTS:
                tiles, seconds = kernel_counts(row, layout, args.shards, tile, args.kernel)
                eff[layout].append(cost.document_efficiency(tiles, int(single.sum())))
                if layout == "balanced":
                    placing.append(seconds)
        results.append(dict(source=source, tile=tile, rows=len(rows),
                            efficiency={k: float(np.mean(v)) for k, v in eff.items()},
                            balanced_worst=float(min(eff["balanced"])),
                            balanced_place_s=float(np.median(placing))))
        print_row(results[-1], flush=True)
    return results


def print_header(args):
    print(f"S = {args.seq_len}, N = {args.shards}, kernel {args.kernel}, {args.rows} rows per "
          f"source; efficiency = single-device tiles / N / critical path (mean over rows)")
    print("| source | tile | " + " | ".join(LAYOUTS) + " | balanced worst row | place s/row |")
    print("|---|---|" + "---|" * len(LAYOUTS) + "---|---|")


def print_row(r, flush=False):
    cells = " | ".join(f"{r['efficiency'][layout]:.2f}" for layout in LAYOUTS)
    print(f"| {r['source']} | {r['tile']} | {cells} | {r['balanced_worst']:.2f} | "
          f"{r['balanced_place_s']:.3f} |", flush=flush)


def main(argv=None):
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.shards}")
    import jax

    from data import DataError
    from data.document_lengths import packed_segment_ids, parse_length_spec

    try:
        [parse_length_spec(source) for source in args.sources if source != "stdlib"]
    except DataError as e:
        raise SystemExit(f"bench_documents: {e}")
    jax.config.update("jax_platforms", "cpu")
    print_header(args)
    results = []
    for source in args.sources:
        rows = (stdlib_rows(args.seq_len, args.rows, args.workdir) if source == "stdlib"
                else packed_segment_ids(source, args.rows, args.seq_len))
        results += measure(args, source, rows)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
