"""Run configs: one get_config() per file, returning an ml_collections.ConfigDict.
configs/default.py is the embedded default: every field at the default run_config/schema.py
declares (with its type and comment); the other files start from it. Here, the runs of this
machine (CPU, fake devices); configs/tpu/ and configs/gpu/ hold the real model sizes on TPU
slices and GPU nodes. accelerator_run and accelerator_precision are what those share; their
model shapes are model/presets.py's.

    config = load_file("configs/tiny.py")      # ConfigError, one line, for a file that fails

ConfigError (run_config.errors's) is the one-line error of any bad config, flag or
config-dependent input.
"""

import importlib.util
import os

import ml_collections

from model import presets
from run_config.errors import ConfigError


SUBFOLDERS = ("", "tpu", "gpu")  # where config files live, as package suffixes


def accelerator_run(config) -> None:
    """Run-level settings the real-hardware configs share (configs/tpu/, configs/gpu/)."""
    config.cpu_devices = 8  # fake devices if this ever runs on a CPU (irrelevant on GPU/TPU)
    config.tracker = "wandb"  # wandb (offline unless WANDB_MODE=online) plus metrics.jsonl
    config.num_train_steps = 1000  # optimizer steps
    config.eval_every_steps = 200  # evaluate every this many steps (and at the end)
    config.eval_batches = 2  # batches in one evaluation
    config.log_every_steps = 10  # metrics every this many steps
    config.checkpoint_every_steps = 100  # asynchronous checkpoint every this many steps
    config.optim.learning_rate = 3e-4  # peak learning rate (LLaMA-7B's)
    config.optim.warmup_steps = 100  # linear warmup steps


def accelerator_precision(model) -> None:
    """bf16 compute, fp32 master weights, remat: how every real-hardware config trains; `model`
    is a config's `model` section."""
    model.update(presets.ACCELERATOR_PRECISION)
    model.remat = True  # recompute each block in the backward pass: keep only block inputs
    # The other memory switches as these configs were measured with them (BENCHMARKS.md),
    # where a config has not set them: not yet left to the planner's 'auto' on a pod.
    for switch, value in (("remat_policy", "nothing"), ("scan_layers", False),
                          ("loss_chunk", 0), ("mlp_chunk", 0)):
        if model[switch] == "auto":
            model[switch] = value


def load_file(path: str, argument: str = "") -> ml_collections.ConfigDict:
    """The ConfigDict that the config file at `path` builds (get_config(argument) when given);
    ConfigError, one line, for a file that is missing, does not run, has no get_config() or
    returns something else."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist: give a file such as "
                          f"configs/tiny.py")
    try:
        spec = importlib.util.spec_from_file_location("_ringstripe_config_file", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        get_config = getattr(module, "get_config", None)
        config = None if get_config is None else get_config(argument) if argument else \
            get_config()
    except Exception as e:  # whatever the file raises is the answer
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise ConfigError(f"config file {path} does not load: {type(e).__name__}: "
                          f"{getattr(e, 'msg', None) or e}{where}: fix the file") from None
    if get_config is None:
        raise ConfigError(f"config file {path} defines no get_config(): it must return the "
                          f"run's ml_collections.ConfigDict")
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config() returned an object of type "
                          f"{type(config).__name__}, not an ml_collections.ConfigDict")
    return config


def module_named(name: str):
    """The config module `name` (a file's name without '.py': 'tiny', 'llama3_8b_v5p') in
    configs/ or one of its subfolders; ConfigError, one line, where there is none."""
    for folder in SUBFOLDERS:
        path = os.path.join(os.path.dirname(__file__), folder, f"{name}.py")
        if name.isidentifier() and os.path.isfile(path):
            return importlib.import_module(".".join(p for p in ("configs", folder, name) if p))
    raise ConfigError(f"no config configs/{name}.py: name a file under configs/ without "
                      f"'.py', e.g. llama3_8b_v5p")
