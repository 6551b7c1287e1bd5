"""Reading a run config from the command line: train.py and scripts/plan.py parse their flags here,
so that a config mistake reads the same in both, one line on stderr and exit 2."""

from __future__ import annotations

import ast
import copy
import os
import re
import sys

from absl import flags

from configs import ConfigError, load_file
from run_config import moved_field_error
from training.stages import NOT_STAGED

# --config.stages.K.FIELD=VALUE: one stage's field (training/stages.py), read here, not by absl.
STAGE_FLAG = re.compile(r"--config\.stages\.(\d+)\.([A-Za-z_][\w.]*)=(.*)", re.DOTALL)


def parse_flags(argv, flag_values=flags.FLAGS):
    """absl's parser over `argv`; a config file that is missing or does not load, a bad flag, an
    unknown --config.FIELD or a renamed one is one line on stderr and exit 2 instead of a
    traceback."""
    try:
        return _parse(argv, flag_values)
    except ConfigError as e:
        fail(str(e))


def read_config_file(config: str, overrides=()):
    """The ConfigDict of config file `config` with train.py's --config.FIELD=VALUE `overrides`
    applied, as train.py would read them (stages included), for a caller in its own process
    (the launchers' check); ConfigError, one line, for any mistake parse_flags would refuse."""
    argv = ["ringstripe", f"--config={config}", *overrides]
    flag_values = flags.FlagValues()
    from ml_collections import config_flags
    config_flags.DEFINE_config_file("config", None, "the run's config file",
                                    flag_values=flag_values, lock_config=True, sys_argv=argv)
    _parse(argv, flag_values)
    return flag_values.config


def _parse(argv, flag_values):
    given = [a[2:].split("=")[0] for a in argv if a.startswith("--config.")]
    for name in given:
        moved = moved_field_error(name.removeprefix("config."), flag=True)
        if moved:
            raise ConfigError(moved)
    if "config" in flag_values:
        _check_config_file(argv)
    stage_flags = [m.groups() for m in map(STAGE_FLAG.fullmatch, argv) if m]
    # Taken out of the command line in place: ml_collections reads its --config.FIELD overrides
    # from sys.argv itself (or the list given to DEFINE_config_file), not from argv.
    for arguments in (argv, sys.argv):
        arguments[:] = [a for a in arguments if not STAGE_FLAG.fullmatch(a)]
    try:
        rest = flag_values(argv)
    except flags.Error as e:  # e.g. a value of the wrong type
        fix = "give a value of the field's type" if "--config." in str(e) else "see --helpshort"
        raise ConfigError(f"{e}: {fix}") from None
    except (AttributeError, KeyError) as e:  # ml_collections: an override names no field
        while e.args and isinstance(e.args[0], BaseException):  # a KeyError in an AttributeError
            e = e.args[0]
        # The message: the field in quotes, perhaps then a line "Did you mean ...?".
        name, *hint = str(e.args[0] if e.args else e).splitlines()
        hint = f" ({hint[0].strip()})" if hint else ""
        raise ConfigError(f"unknown config field {name}{hint}: every --config.FIELD must exist "
                          f"in the config file (overrides given: {', '.join(given)})") from None
    if "config" in flag_values:
        config = flag_values["config"].value
        if stage_flags or ("config.num_train_steps" in given and config.get("stages")):
            apply_stage_flags(config, "config.num_train_steps" in given, stage_flags)
    return rest


def apply_stage_flags(config, steps_everywhere: bool, overrides) -> None:
    """The command line's say over config.stages (a ConfigDict; training/stages.py runs them):
    `--config.num_train_steps=N` (steps_everywhere) makes every stage N steps long, and each
    `--config.stages.K.FIELD=VALUE` in `overrides`, as (K, FIELD, VALUE text), sets FIELD in
    stage K (1-based, as the stages are named and numbered in WORKDIR/stageK), whether the
    stage set it or not; a value is read as the config's field of that name is typed. Other
    --config.FIELD flags change the config itself, so every stage that does not set FIELD."""
    entries = [copy.deepcopy(dict(entry)) for entry in config.stages]
    if not entries:
        raise ConfigError("--config.stages.K.FIELD is given but the config has no stages")
    if steps_everywhere:
        for entry in entries:
            entry["steps"] = config.num_train_steps
    for number, name, text in overrides:
        flag = f"--config.stages.{number}.{name}={text}"
        if not 1 <= int(number) <= len(entries):
            raise ConfigError(f"{flag}: the config has stages 1 to {len(entries)}")
        entry = entries[int(number) - 1]
        *sections, field = name.split(".")
        for section in sections:
            entry = entry.setdefault(section, {})
        entry[field] = _typed(config, name, text, flag)
    with config.unlocked():
        config.stages = tuple(entries)


def _typed(config, name: str, text: str, flag: str):
    """`text` as a value of the config field `name` (steps: an int, name: a string)."""
    current = {"steps": 1, "name": ""}.get(name)
    if current is None:
        found = _holder(config, name)
        if found is None or name.split(".")[0] in NOT_STAGED:
            raise ConfigError(f"{flag}: {name!r} is not a config field a stage can set: use "
                              f"the names of the config file (seq_len, model.rope_theta, "
                              f"optim.learning_rate, steps, ...)")
        target, field = found
        current = target[field]
    if current == "auto":  # a field whose value may be of any kind (the memory switches)
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    try:
        if isinstance(current, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if isinstance(current, (int, float, str)):
            return type(current)(text)
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ConfigError(f"{flag}: give a value of the field's type "
                          f"({type(current).__name__})") from None


def _holder(config, name: str):
    """(the ConfigDict section that holds config field `name`, the field's own name), or None
    where the config has no such field ('model.rope_theta' -> (config.model, 'rope_theta'))."""
    section, _, field = name.rpartition(".")
    target = config
    for part in section.split(".") if section else ():
        target = target.get(part) if hasattr(target, "get") else None
    return (target, field) if hasattr(target, "get") and field in target else None


def _check_config_file(argv) -> None:
    """The --config file in `argv` loads (config_file). ml_collections would defer a failure to
    the first read of the config and then print a traceback; configs only build a ConfigDict,
    so running one twice costs nothing."""
    value = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if value is None and "--config" in argv[:-1]:
        value = argv[argv.index("--config") + 1]
    if value is not None:  # (absl says that --config is required)
        path, _, argument = value.partition(":")  # ml_collections' "file.py:ARG" form
        load_file(path, argument)


def config_file(path: str, argument: str = ""):
    """The ConfigDict that the config file at `path` builds (configs.load_file); a file that
    is missing, does not run, has no get_config() or returns something else is one line and
    exit 2."""
    try:
        return load_file(path, argument)
    except ConfigError as e:
        fail(str(e))


def use_fake_devices(count: int) -> None:
    """`count` fake CPU devices and no accelerator, for an ahead-of-time compile on the host
    (the planner's, bench_memory's); must run before JAX starts a backend."""
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)


def skip_absent_tpu() -> None:
    """Tell JAX the platform is the CPU where no TPU chip and no GPU is visible (before it starts).

    libtpu comes with the tpu and test extras (the test's for the TPU compile check (planner/topology.py)). Where it
    is installed JAX probes a TPU at start even on a machine without one, and libtpu prints
    warnings about TPU metadata it cannot find; a run on such a machine runs on the CPU anyway.
    JAX_PLATFORMS, when set, is left as it is."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    import jax
    try:
        from jax._src import hardware_utils  # the PCI scan JAX itself starts with
        tpu_chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
        gpus = hardware_utils.has_visible_nvidia_gpu() or hardware_utils.num_available_amd_gpus(1)
    except (ImportError, AttributeError, OSError):  # another jax: let it probe as it does
        return
    if not tpu_chips and not gpus:
        jax.config.update("jax_platforms", "cpu")


def start_reader(flag_values=flags.FLAGS) -> None:
    """What a command that reads a run's checkpoints (sample.py, scripts/hf/export.py,
    scripts/eval_positions.py) does first: Orbax's INFO lines about every read stay off the
    console unless --verbosity asks for them, and the platform is the CPU where there is no
    accelerator (skip_absent_tpu)."""
    from absl import logging
    if not flag_values["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    skip_absent_tpu()


def fail(message: str):
    """One line on stderr, exit 2: how every command-line mistake ends."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
