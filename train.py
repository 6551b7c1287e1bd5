"""Train a ringstripe model.

    python train.py --config configs/default.py --workdir runs/default
    python train.py --config configs/tiny.py --workdir /tmp/tiny --config.parallel.layout=ring

Config fields are overridden with --config.FIELD=VALUE (an unknown field is an error). Multi-process
runs call jax.distributed.initialize(): with --coordinator_address/--num_processes/--process_id,
or from the environment on a TPU pod or cluster (--distributed).
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

# Importable as in Flax's examples: `from train import train_and_evaluate`. (Importing JAX here
# starts no backend, so main() can still set the fake CPU device count first.)
from training import train_and_evaluate  # noqa: E402
from training.cli import parse_flags, skip_absent_tpu

config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                 lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and the data cache.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process runs).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-process runs).")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with no arguments "
                  "(TPU pods and clusters where JAX finds its peers in the environment).")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def start_jax(config):
    """Sets the fake CPU device count before any backend starts, then joins the other
    processes if this is a multi-process run."""
    import jax

    skip_absent_tpu()
    jax.config.update("jax_num_cpu_devices", config.cpu_devices)
    if config.profile.num_steps:  # XLA:CPU traces its ops only when asked (training/analysis/profile.py)
        from training.analysis.profile import CPU_TRACE_FLAG
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_TRACE_FLAG}".strip()
    if FLAGS.coordinator_address:
        jax.distributed.initialize(FLAGS.coordinator_address, num_processes=FLAGS.num_processes,
                                   process_id=FLAGS.process_id)
    elif FLAGS.distributed:  # the peers from the environment: a TPU pod's, srun's, a JobSet's
        try:
            jax.distributed.initialize()
        except ValueError as e:  # no cluster environment JAX knows (e.g. SLURM without srun)
            from training.cli import fail
            fail(f"--distributed found no cluster to join ({e}): start train.py under srun, "
                 f"on every TPU worker, or pass --coordinator_address/--num_processes/"
                 f"--process_id")


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:  # keep JAX's INFO chatter (e.g. "no TPU") off the console
        logging.set_verbosity(logging.WARNING)
    config = FLAGS.config
    start_jax(config)
    import data
    from checkpoints import CheckpointError
    from checkpoints.preemption import ABORT_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted
    from training import ConfigError, NonFiniteError
    from training.thread_log import ThreadLog

    background = ThreadLog().install()  # Orbax's save threads report a failure there, not here

    def fail(code, message):
        where = background.save(FLAGS.workdir)
        print(f"error: {message}" + (f" (tracebacks: {where})" if where else ""), file=sys.stderr)
        sys.exit(code)

    try:
        # The fields set on the command line win over what config.init_from's source says.
        explicit = config_flags.get_override_values(FLAGS["config"])
        train_and_evaluate(config, FLAGS.workdir, explicit=explicit)
    except (ConfigError, data.DataError, CheckpointError) as e:
        fail(2, e)
    except NonFiniteError as e:
        fail(3, e)
    except Preempted:  # saved (its line is out): not 0, so that a scheduler starts it again
        sys.exit(PREEMPTED_EXIT_CODE)
    except OSError as e:  # a full disk, a vanished mount: the checkpoints made so far stay
        where = f" ({e.filename})" if e.filename else ""
        fail(4, f"{e.strerror or e}{where}: free space or fix the storage, then run the same "
                f"command again (it resumes from the last complete checkpoint)")
    except KeyboardInterrupt:  # Ctrl-C outside the steps (data, the model's set-up, the end)
        print("ringstripe: interrupted outside a training step, nothing saved now; the same "
              "command continues from the last complete checkpoint, if any", file=sys.stderr)
        sys.exit(ABORT_EXIT_CODE)
    where = background.save(FLAGS.workdir)  # reports of a failure that a retry overcame
    if where:
        print(f"ringstripe: background threads reported errors, kept in {where}",
              file=sys.stderr)

if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
