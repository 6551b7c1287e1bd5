"""Sample from a trained ringstripe run.

    python sample.py --workdir runs/default --prompt "def fibonacci(n):" --max_new_tokens 200
    python sample.py --workdir runs/default --temperature 0   # greedy

Loads the latest checkpoint (or --step) and the run's tokenizer, and generates with a KV cache:
the prompt is processed once, then each new token costs one pass over the cache. On one device
by default; --devices N shards the parameters over N devices (FSDP layout, as in training).
"""

import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A training run's --workdir.")
flags.DEFINE_string("prompt", "def ", "Text to continue.")
flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.")
flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0 = greedy.")
flags.DEFINE_integer("top_k", 40, "Sample among the top_k most likely tokens; 0 = all.")
flags.DEFINE_integer("num_samples", 1, "Samples to draw (a batch).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_integer("devices", 1, "Devices to shard the parameters over.")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import jax
    from training.cli import start_reader

    start_reader()
    jax.config.update("jax_num_cpu_devices", max(FLAGS.devices, 1))
    import numpy as np

    import data
    from model import decode
    from training.saved_run import RunError, load_run

    try:
        config, tokenizer, graphdef, params, step = load_run(FLAGS.workdir, FLAGS.step,
                                                             FLAGS.devices)
    except (RunError, data.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    prompt = tokenizer.encode(FLAGS.prompt)
    if not prompt:
        print("error: the prompt encodes to no tokens: give some text", file=sys.stderr)
        sys.exit(2)
    tokens = decode.generate(graphdef, params, np.tile(prompt, (FLAGS.num_samples, 1)),
                             FLAGS.max_new_tokens, temperature=FLAGS.temperature,
                             top_k=FLAGS.top_k, seed=FLAGS.seed, eos_id=tokenizer.eos_id)
    print(f"# {FLAGS.workdir} step {step}, {config.parallel.layout}-trained, temperature "
          f"{FLAGS.temperature}, top_k {FLAGS.top_k}", file=sys.stderr)
    for row in tokens:
        ids = [int(t) for t in row]
        if tokenizer.eos_id in ids[len(prompt):]:
            ids = ids[:len(prompt) + ids[len(prompt):].index(tokenizer.eos_id)]
        print(tokenizer.decode(ids))
        print("-" * 40)


if __name__ == "__main__":
    app.run(main)
