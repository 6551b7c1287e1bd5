"""Sample from a trained ringstripe run.

    python sample.py --workdir runs/default --prompt "def fibonacci(n):" --max_new_tokens 200
    python sample.py --workdir runs/default --temperature 0   # greedy

Loads the latest checkpoint (or --step) and the run's tokenizer, and generates with a KV cache:
the prompt is processed once, then each new token costs one pass over the cache. On one device
by default; --devices N shards the parameters over N devices (FSDP layout, as in training).
"""

import sys

from absl import app, flags, logging

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


class SampleError(ValueError):
    pass


def load_run(workdir: str, step, devices: int):
    """(config, tokenizer, graphdef, params, step) of a run's checkpoint."""
    import jax
    import data
    import parallel
    import storage
    from checkpoints import Checkpointer
    from planner import resolve_attention
    from training.state import create_train_state
    from training.resume import saved_config, saved_tokenizer_file

    directory = storage.join(workdir, "checkpoints")
    if not storage.path(directory).is_dir():
        raise SampleError(f"no checkpoints in {workdir!r}: train first (python train.py "
                          f"--workdir {workdir} ...) or point --workdir at a run")
    # Read-only: a trainer may be saving here now; nothing is cleaned, deleted or written.
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        steps = checkpointer.steps()
        if not steps or (step is not None and step not in steps):
            raise SampleError(f"no checkpoint {'at step ' + str(step) if step else ''} in "
                              f"{directory} (available: {steps}): choose one of those steps")
        step = steps[-1] if step is None else step
        meta = checkpointer.read_meta(step)
        config = saved_config(meta)
        tokenizer = data.load_tokenizer(saved_tokenizer_file(meta, config, workdir))
        mesh = parallel.make_mesh(1, devices, devices=jax.devices()[:devices])
        config.mesh.data, config.mesh.seq = 1, devices
        # Decoding attends through the KV cache; the sequence-parallel strategy only shapes the
        # training forward, and the run's (a usp degree, 'auto') need not fit this mesh.
        config.parallel.strategy, config.parallel.ulysses_degree = "ring", 0
        choice = resolve_attention(config, (1, devices), jax.default_backend(),
                                   mesh.devices.flat[0].device_kind)
        # The parameters' shapes and shardings only: the model is never initialised, and only
        # the parameters are read back (not the optimizer's moments, twice their size).
        state, graphdef, *_ = create_train_state(config, mesh, choice, abstract=True)
        params = checkpointer.restore_params(step, state["params"])
    finally:
        checkpointer.close()
    return config, tokenizer, graphdef, params, step


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:  # (Orbax warns that a read-only directory is one)
        logging.set_verbosity(logging.ERROR)
    import jax
    from training.cli import skip_absent_tpu

    skip_absent_tpu()
    jax.config.update("jax_num_cpu_devices", max(FLAGS.devices, 1))
    import numpy as np

    import data
    from model import decode

    try:
        config, tokenizer, graphdef, params, step = load_run(FLAGS.workdir, FLAGS.step,
                                                             FLAGS.devices)
    except (SampleError, data.DataError) as e:
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
