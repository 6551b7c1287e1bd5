"""Sample from a trained ringstripe run.

    python sample.py --workdir runs/default --prompt "def fibonacci(n):" --max_new_tokens 200
    python sample.py --workdir runs/default --temperature 0   # greedy
    python sample.py --workdir runs/default --seq_shards 4 --prompt_file long.py --temperature 0
    python sample.py --workdir runs/default --prompt "def f(" --prompt "class A:"   # a batch

Loads the latest checkpoint (or --step) and the run's tokenizer. The prompts (one per --prompt,
or a whole --prompt_file; of any lengths) are prefilled in one pass with the training forward,
laid out over --seq_shards devices in the run's layout (or --layout), and their keys and values
stay sharded where they were computed: a prompt too long for one device fits on N. Then each
new token costs one pass over the cache (each device its shard, combined exactly). The fake CPU
device count follows --seq_shards; the parameters are sharded over the same devices. A prompt
longer than the run was trained on can be read with --dynamic_rope (its RoPE stretched to the
prompt's length, as scripts/eval_long.py --dynamic_rope does).
"""

import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A training run's --workdir.")
flags.DEFINE_multi_string("prompt", None, "Text to continue (repeat for a batch; default 'def ').")
flags.DEFINE_string("prompt_file", None, "A file whose whole text is a prompt (after --prompt's).")
flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.")
flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0 = greedy.")
flags.DEFINE_integer("top_k", 40, "Sample among the top_k most likely tokens; 0 = all.")
flags.DEFINE_integer("num_samples", 1, "Samples to draw per prompt.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_integer("seq_shards", None, "Devices the prompt and its cache are sharded over "
                     "(default: --devices, 1).")
flags.DEFINE_string("layout", None, "Attention layout of the prefill (default: the run's).")
flags.DEFINE_bool("dynamic_rope", False, "For a prompt longer than the run's trained length, "
                  "stretch its RoPE to the longest prompt's length (dynamic scaling, "
                  "training/extension.py; as scripts/eval_long.py --dynamic_rope).")
flags.DEFINE_integer("devices", 1, "Devices to shard the parameters over (= --seq_shards).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def _prompts(tokenizer) -> list[list[int]]:
    texts = list(FLAGS.prompt or ([] if FLAGS.prompt_file else ["def "]))
    if FLAGS.prompt_file:
        try:
            # newline="": the text exactly as written ('\r' included), as the probes make it
            with open(FLAGS.prompt_file, encoding="utf-8", newline="") as f:
                texts.append(f.read())
        except OSError as e:
            raise ValueError(f"--prompt_file {FLAGS.prompt_file!r}: {e.strerror}") from None
    prompts = [tokenizer.encode(t) for t in texts for _ in range(FLAGS.num_samples)]
    if not all(prompts):
        raise ValueError("a prompt encodes to no tokens: give some text")
    return prompts


def main(argv):
    del argv
    import jax
    from training.cli import start_reader

    start_reader()
    shards = FLAGS.seq_shards or FLAGS.devices
    if shards < 1:
        print("error: --seq_shards must be at least 1", file=sys.stderr)
        sys.exit(2)
    jax.config.update("jax_num_cpu_devices", shards)
    import data
    from flax import nnx

    from model import decode
    from training.saved_run import RunError, load_run, stretched_model

    try:
        # Tiles from the prompt's length (0): the run's were chosen for its seq_len.
        config, tokenizer, graphdef, params, step = load_run(
            FLAGS.workdir, FLAGS.step, shards, tile=0, layout=FLAGS.layout)
        prompts = _prompts(tokenizer)
        if FLAGS.dynamic_rope:
            longest, trained = max(map(len, prompts)), config.seq_len
            config, graphdef = stretched_model(config, graphdef, longest)
            if longest > trained:
                print(f"# dynamic RoPE: {longest:,} tokens read as the trained {trained:,} "
                      f"(stretched {longest / trained:.3g}x)", file=sys.stderr)
    except (RunError, data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

    def report(caches):
        held, total = decode.cache_bytes_per_device(caches)
        print(f"# prefill: {max(map(len, prompts)):,} tokens over {shards} "
              f"device{'s' * (shards > 1)} "
              f"({config.parallel.layout}); KV cache {held / 2**20:.2f} MiB per device of "
              f"{total / 2**20:.2f} MiB", file=sys.stderr)

    rows = decode.generate_sharded(graphdef, params, prompts, FLAGS.max_new_tokens,
                                   nnx.merge(graphdef, params).mesh,
                                   temperature=FLAGS.temperature, top_k=FLAGS.top_k,
                                   seed=FLAGS.seed, eos_id=tokenizer.eos_id, report=report)
    print(f"# {FLAGS.workdir} step {step}, {config.parallel.layout} layout, temperature "
          f"{FLAGS.temperature}, top_k {FLAGS.top_k}", file=sys.stderr)
    for prompt, row in zip(prompts, rows):
        ids = [int(t) for t in row]
        new = ids[len(prompt):]
        if tokenizer.eos_id in new:
            ids = ids[:len(prompt) + new.index(tokenizer.eos_id)]
        print(tokenizer.decode(ids))
        print("-" * 40)


if __name__ == "__main__":
    app.run(main)
