"""A training run's checkpoint as a Hugging Face directory of its family (model/hf/families/),
which transformers loads.

    python scripts/hf/export.py --workdir runs/default --out /tmp/ringstripe-hf
    python scripts/hf/export.py --workdir runs/default --step 100 --dtype bfloat16 --out DIR

Then, with PyTorch and transformers installed:
    AutoModelForCausalLM.from_pretrained(DIR)

Writes config.json, the safetensors (sharded past 5 GiB, with their index) and the run's
tokenizer; DIR is replaced only once the new files are complete. Reads the checkpoint without
touching the run (a trainer may be writing it).
"""

import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A training run's --workdir.")
flags.DEFINE_string("out", None, "The directory to write.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                  "Stored dtype (default: the parameters', float32).")
flags.mark_flags_as_required(["workdir", "out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from training.cli import start_reader
    start_reader()
    import data
    from training.saved_run import RunError, export_hf

    try:
        files = export_hf(FLAGS.workdir, FLAGS.out, step=FLAGS.step, dtype=FLAGS.dtype)
    except (RunError, data.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{FLAGS.out}: {', '.join(files)}")


if __name__ == "__main__":
    app.run(main)
