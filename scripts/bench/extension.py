"""Which way of extending a context keeps retrieval past the trained length? From one short
checkpoint, each method (training/extension.py: zero-shot, theta, linear, yarn, llama3) is
trained with the same budget at the long length, then probed for passkey retrieval at every
length up to twice the longest trained, and read for its loss along held-out text.

    python train.py --config configs/passkey.py --workdir runs/passkey    # its three stages
    python scripts/bench/extension.py --workdir runs/passkey --out runs/extension \\
        --json runs/extension.json                                       # + runs/extension.png

An arm replays the recipe's stages after the first (--config: their lengths, batches, data and
optimizers, the same for every method) from the first stage's last checkpoint, with its
method's RoPE for --factor times the first stage's length (default: the factor of the
recipe's own scaling, else twice the longest trained length over it) and each stage's steps times
--budget. --reuse yarn takes the recipe's own stages as the yarn arm when they are exactly that
(the same RoPE and budget) instead of training them again, and an arm this --out already holds
finished is not trained again. Each arm is also read with dynamic scaling past its trained
length ("METHOD + dynamic": its RoPE stretched to each prompt's length, no training;
training/extension.py). Prints one table (mean passkey accuracy over --depths per length, and
the text loss in the last position range at the longest length) and draws both, accuracy by
length and loss by position, in one picture.
"""

import argparse
import json
import os
import sys


def parse_args(argv=None):
    from training.extension import METHODS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/passkey.py",
                   help="the recipe: its first stage made the short checkpoint")
    p.add_argument("--workdir", required=True, help="the recipe's run (WORKDIR/stage1, ...)")
    p.add_argument("--out", required=True, help="where each method trains (OUT/METHOD)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--factor", type=float, default=0.0,
                   help="the extended context as a multiple of the first stage's length "
                        "(0: the recipe's own RoPE scaling factor)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="each later stage's steps times this (1: the recipe's)")
    p.add_argument("--reuse", nargs="*", default=["yarn"],
                   help="methods whose arm is the recipe's own stages (when they are that)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--samples", type=int, default=6, help="keys per cell")
    p.add_argument("--seed", type=int, default=1, help="the probes' keys and filler")
    p.add_argument("--buckets", type=int, default=8, help="position ranges of the text loss")
    p.add_argument("--text_rows", type=int, default=3,
                   help="held-out windows of the longest length for the text loss")
    p.add_argument("--json", required=True, help="the table (the picture goes beside it)")
    return p.parse_args(argv)


def picture(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    lengths = result["lengths"]
    colours = {}
    for method, row in result["methods"].items():
        # An arm and its dynamic reading share a colour; the dynamic one is dashed.
        base = method.removesuffix(" + dynamic")
        colour = colours.setdefault(base, f"C{len(colours)}")
        style = dict(color=colour, marker="o", ls="--" if base != method else "-", label=method)
        left.plot(range(len(lengths)), [row["accuracy"][str(n)] for n in lengths], **style)
        loss = row["text_loss"]
        width = max(lengths) / len(loss)
        right.plot([(b + 0.5) * width for b in range(len(loss))], loss, **style)
    left.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    if result["trained"] in lengths:
        left.axvline(lengths.index(result["trained"]), color="grey", ls=":",
                     label="longest trained")
    left.set_ylim(-0.03, 1.03)
    left.set(xlabel="context length (tokens)", ylabel="passkey accuracy (mean over depths)",
             title=f"retrieval after extending {result['short']:,} -> {result['trained']:,}")
    if result["trained"] < max(lengths):
        right.axvline(result["trained"], color="grey", ls=":")
    right.set(xlabel="position in held-out text", ylabel="next-token loss (nats)",
              title=f"text loss along {max(lengths):,} tokens")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def extend(method, rope, first, base, later, steps, args, say) -> str:
    """The arm of `method`: the recipe's later stages from the first's last checkpoint with its
    RoPE (or the recipe's own, when they are those); returns the last stage's workdir."""
    import run_config
    from training import stages, train_and_evaluate
    from training.saved_run import saved_steps
    configs = [run_config.replace(stage_config, {
        "model.rope_theta": rope["rope_theta"], "model.rope_scaling": rope["rope_scaling"],
        "num_train_steps": n}) for (_, stage_config), n in zip(later, steps)]
    if method in args.reuse and all(
            stages.last_step(stage) == stage_config.num_train_steps == cfg.num_train_steps
            and cfg.model == stage_config.model
            for (stage, stage_config), cfg in zip(later, configs)):
        say(f"{method}: the recipe's own stages (the same RoPE and steps)")
        return later[-1][0].workdir
    previous = f"run:{first.workdir}@{base}"
    for (stage, _), cfg in zip(later, configs):
        workdir = os.path.join(args.out, method, f"stage{stage.index}")
        cfg = run_config.replace(cfg, {"init_from": previous})
        if (saved_steps(workdir) or [None])[-1] == cfg.num_train_steps:
            say(f"{method}: {workdir} has its {cfg.num_train_steps} steps (an earlier study)")
        else:
            say(f"{method}: {cfg.num_train_steps} steps of {cfg.seq_len:,} tokens in {workdir}")
            train_and_evaluate(cfg, workdir, explicit=stage.explicit + (
                "model.rope_theta", "model.rope_scaling", "init_from"))
        previous = f"run:{workdir}@{cfg.num_train_steps}"
    return workdir


def probe(workdir, lengths, args, config, say, dynamic=False) -> dict:
    """An arm's passkey accuracy (mean over depths, and the table) at `lengths`, and its text
    loss by position at the longest of args.lengths; `dynamic`: with the RoPE stretched past
    the arm's trained length (training/extension.py: stretched)."""
    from training.evaluation import retrieval
    say(f"{workdir}: probes and text loss{' (dynamic RoPE)' if dynamic else ''}")
    table = retrieval.evaluate(workdir, lengths=lengths, depths=args.depths,
                               samples=args.samples, seed=args.seed,
                               seq_shards=config.cpu_devices, dynamic_rope=dynamic)
    loss = retrieval.text_loss_by_position(workdir, max(args.lengths), buckets=args.buckets,
                                           rows=args.text_rows, seq_shards=config.cpu_devices,
                                           dynamic_rope=dynamic)
    return {"text_loss": loss, "table": {str(n): row for n, row in
                                         table["accuracy"]["passkey"].items()},
            "accuracy": {str(n): v for n, v in retrieval.mean_over_depths(table).items()}}


def main(argv=None):
    args = parse_args(argv)
    from training.cli import config_file, start_reader
    import run_config
    config = run_config.build(config_file(args.config))
    import jax
    start_reader()
    jax.config.update("jax_num_cpu_devices", config.cpu_devices)

    import data
    from training import ConfigError, extension, stages
    from training.saved_run import RunError

    def say(text):
        print(text, file=sys.stderr, flush=True)

    try:
        plan = stages.plan(config, args.workdir)
        if len(plan) < 2:
            raise ConfigError(f"{args.config} has {len(plan)} stage(s): the study needs a "
                              f"short stage and a long one (config.stages)")
        (first, short), later = plan[0], plan[1:]
        base = stages.last_step(first)
        if base != short.num_train_steps:
            raise RunError(f"{first.workdir} has not finished ({base} of "
                           f"{short.num_train_steps} steps): run the recipe first")
        steps = [max(1, round(c.num_train_steps * args.budget)) for _, c in later]
        longest = later[-1][1]
        scaling = longest.model.rope_scaling
        factor = args.factor or (scaling.factor if scaling.rope_type != "default"
                                 else 2 * longest.seq_len / short.seq_len)
        result = {"short": short.seq_len, "trained": longest.seq_len, "factor": factor,
                  "stages": [[c.seq_len, c.global_batch_size, n]
                             for (_, c), n in zip(later, steps)],
                  "lengths": args.lengths, "depths": args.depths, "samples": args.samples,
                  "methods": {}}
        for method in args.methods:
            rope = extension.rope(method, theta=short.model.rope_theta,
                                  head_dim=short.model.head_dim, trained=short.seq_len,
                                  factor=factor)
            workdir = first.workdir
            if method != "zero-shot":
                workdir = extend(method, rope, first, base, later, steps, args, say)
            trained = short.seq_len if method == "zero-shot" else longest.seq_len
            result["methods"][method] = {"workdir": workdir, "rope": rope,
                                         **probe(workdir, args.lengths, args, config, say)}
            # The same arm read with dynamic scaling past its trained length: no training, and
            # the same answers up to it.
            beyond = [n for n in args.lengths if n > trained]
            if beyond:
                stretched = probe(workdir, beyond, args, config, say, dynamic=True)
                for key in ("accuracy", "table"):
                    stretched[key] = {**result["methods"][method][key], **stretched[key]}
                result["methods"][f"{method} + dynamic"] = {"workdir": workdir, "rope": rope,
                                                            **stretched}
    except (ConfigError, RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    png = os.path.splitext(args.json)[0] + ".png"
    picture(result, png)
    budget = ", then ".join(f"{n} steps of {b} x {s:,}" for s, b, n in result["stages"])
    print(f"passkey accuracy (mean over {len(args.depths)} depths x {args.samples} held-out keys)"
          f" from the {result['short']:,}-token checkpoint after {budget} tokens, RoPE for "
          f"{factor:g}x; text loss: held-out text, the last of {args.buckets} ranges of "
          f"{max(args.lengths):,} positions")
    print("| method | " + " | ".join(f"{n:,}" for n in args.lengths) + " | text loss |")
    print("|---|" + "---|" * (len(args.lengths) + 1))
    for method, row in result["methods"].items():
        print(f"| {method} | " + " | ".join(f"{row['accuracy'][str(n)]:.2f}"
                                            for n in args.lengths)
              + f" | {row['text_loss'][-1]:.3f} |")
    print(f"wrote {args.json} and {png}")


if __name__ == "__main__":
    main()
