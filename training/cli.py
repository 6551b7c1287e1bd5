"""Reading a run config from the command line: train.py and scripts/plan.py parse their flags here,
so that a config mistake reads the same in both, one line on stderr and exit 2."""

from __future__ import annotations

import sys

from absl import flags

from training.validate import RENAMED_FIELDS


def parse_flags(argv, flag_values=flags.FLAGS):
    """absl's parser over `argv`; a bad flag, an unknown --config.FIELD or a renamed one is one
    line on stderr and exit 2 instead of a traceback."""
    given = [a[2:].split("=")[0] for a in argv if a.startswith("--config.")]
    for name in given:
        old = name.removeprefix("config.")
        if old in RENAMED_FIELDS:
            fail(f"--config.{old} was renamed: use --config.{RENAMED_FIELDS[old]}")
    try:
        return flag_values(argv)
    except flags.Error as e:  # e.g. a value of the wrong type
        fix = "give a value of the field's type" if "--config." in str(e) else "see --helpshort"
        fail(f"{e}: {fix}")
    except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
        name = str(e).strip("\"'")
        fail(f"unknown config field '{name}' (overrides: {', '.join(given)}): every "
              f"--config.FIELD must exist in the config file")


def use_fake_devices(count: int) -> None:
    """`count` fake CPU devices and no accelerator, for an ahead-of-time compile on the host
    (the planner's, bench_memory's); must run before JAX starts a backend."""
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)


def fail(message: str):
    """One line on stderr, exit 2: how every command-line mistake ends."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
