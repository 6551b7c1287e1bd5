"""The loss by position on held-out documents, for one or more runs side by side: does a model use
its context, and does it still beyond the length it was trained at?

    python scripts/eval_positions.py --workdir runs/extend_8k/stage1 \
        --workdir runs/extend_8k/stage2 --seq_len 8192 --documents 8 --buckets 8

Takes the first --documents documents of the first run's held-out split that are longer than
--seq_len tokens, each read alone from its start, and prints the mean next-token loss in
--buckets equal ranges of original positions for each run's checkpoint (latest, or --step):
the evaluation train.py logs as eval/loss_by_position (training/evaluation/position_loss.py), laid out
over --seq_shards devices in the run's layout (or --layout); every layout gives the same
curve. --json writes the table.
"""

import json
import sys

from absl import app, flags

flags.DEFINE_multi_string("workdir", None, "A training run's --workdir (repeat to compare).")
flags.DEFINE_integer("step", None, "Checkpoint step (default: each run's latest).")
flags.DEFINE_integer("seq_len", 8192, "Tokens per document read.")
flags.DEFINE_integer("documents", 8, "Held-out documents to average over.")
flags.DEFINE_integer("buckets", 8, "Equal ranges of positions.")
flags.DEFINE_integer("seq_shards", 1, "Devices the rows are sharded over (fake CPU devices).")
flags.DEFINE_string("layout", None, "Attention layout (default: each run's).")
flags.DEFINE_string("json", None, "Write the table here as JSON.")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import jax
    from training.cli import start_reader
    start_reader()
    jax.config.update("jax_num_cpu_devices", FLAGS.seq_shards)
    from flax import nnx

    import data
    from training.evaluation import position_loss
    from training.saved_run import RunError, held_out_tokens, load_run

    columns, rows = {}, None
    try:
        for workdir in FLAGS.workdir:
            config, tokenizer, graphdef, params, step = load_run(
                workdir, FLAGS.step, FLAGS.seq_shards, tile=0, layout=FLAGS.layout)
            if rows is None:
                rows = position_loss.long_documents(
                    held_out_tokens(config, workdir, tokenizer), tokenizer.eos_id,
                    FLAGS.seq_len, FLAGS.documents)
                if not len(rows):
                    raise RunError(f"{workdir}'s held-out split has no document of "
                                   f"{FLAGS.seq_len + 1} tokens: lower --seq_len or hold out "
                                   f"more (data.eval_fraction)")
            mesh = nnx.merge(graphdef, params).mesh
            batch = position_loss.on_mesh(position_loss.position_batch(
                rows, config.parallel.layout, FLAGS.seq_shards), mesh)
            with jax.set_mesh(mesh):
                means = position_loss.curve(position_loss.make_position_eval(
                    graphdef, FLAGS.buckets), params, batch)
            columns[f"{workdir}@{step} (trained at {config.seq_len})"] = means
    except (RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    width = FLAGS.seq_len // FLAGS.buckets
    print(f"loss by position (nats), {len(rows)} held-out documents of {FLAGS.seq_len + 1} "
          f"tokens, each read alone from its start")
    print("| positions | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for b in range(FLAGS.buckets):
        cells = " | ".join(f"{values[b]:.3f}" for values in columns.values())
        print(f"| {b * width:,}-{(b + 1) * width - 1:,} | {cells} |")
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump({"seq_len": FLAGS.seq_len, "documents": len(rows), "bucket": width,
                       "loss": columns}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
