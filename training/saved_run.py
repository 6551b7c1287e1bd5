"""A finished (or running) run's checkpoint, read without touching it: sample.py and
scripts/hf/export.py.

    config, tokenizer, graphdef, params, step = load_run("runs/default", step=None, devices=1)
    model = nnx.merge(graphdef, params)      # the Transformer, on `devices` devices
    export_hf("runs/default", "/tmp/ringstripe-hf")   # a directory transformers loads

Read-only: a trainer may be saving into the workdir at the same time; nothing is cleaned,
deleted or written, and only the parameters are read (not the optimizer's moments).
"""

import dataclasses
import os
import shutil
import sys

import jax
from flax import nnx

import data
import parallel
import run_config
import storage
from storage.run_dir import RunDir
from checkpoints import Checkpointer
from model import hf
from parallel.strategies import BASELINE
from planner import resolve_run
from training import extension
from training.resume import saved_config, saved_tokenizer_file
from training.state import create_train_state


class RunError(ValueError):
    """A workdir or step that holds no checkpoint to read: a one-line message."""


def saved_steps(workdir: str) -> list[int]:
    """The run's complete checkpoints, oldest first ([] when it has none)."""
    directory = RunDir(workdir).checkpoints
    if not storage.path(directory).is_dir():
        return []
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        return checkpointer.steps()
    finally:
        checkpointer.close()


def saved_meta(workdir: str, step=None) -> tuple[int, dict]:
    """(step, the record saved with it) of a run's checkpoint: the latest, or `step`. RunError
    when the workdir has no checkpoints or not that one."""
    directory = RunDir(workdir).checkpoints
    if not storage.path(directory).is_dir():
        raise RunError(f"no checkpoints in {workdir!r}: train first (python train.py "
                       f"--workdir {workdir} ...) or point at a run's workdir")
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        steps = checkpointer.steps()
        if not steps or (step is not None and step not in steps):
            raise RunError(f"no checkpoint {'at step ' + str(step) + ' ' if step else ''}in "
                           f"{directory} (available: {steps}): choose one of those steps")
        step = steps[-1] if step is None else step
        return step, checkpointer.read_meta(step)
    finally:
        checkpointer.close()


def checkpointed_run(workdir: str) -> str:
    """The workdir whose checkpoints stand for `workdir`: itself, or for a staged run's workdir
    (training/stages.py: WORKDIR/stage1, stage2, ...) its last stage that holds checkpoints,
    the model the whole run ended with."""
    run = RunDir(workdir)
    if storage.path(run.checkpoints).is_dir():
        return workdir
    for index in reversed(run.stage_indices()):
        if saved_steps(run.stage(index).root):
            return run.stage(index).root
    return workdir  # saved_meta says there is nothing to read


def load_run(workdir: str, step, devices: int, tile=None, layout: str | None = None):
    """(config, tokenizer, graphdef, params, step) of a run's checkpoint (the latest, or
    `step`), the parameters sharded over the first `devices` devices, which are the mesh's
    'seq' axis. tile: the attention tile its forward uses (parallel.tile's values; 0: the
    kernel's default for each call's length, not the run's seq_len; default: the run's);
    layout: the attention layout its forward uses (default: the run's). A staged run's
    workdir reads its last stage (checkpointed_run), and says so."""
    if (found := checkpointed_run(workdir)) != workdir:
        print(f"# {workdir} is a staged run: reading its last stage, {found}", file=sys.stderr)
        workdir = found
    step, meta = saved_meta(workdir, step)
    config = saved_config(meta)
    reading = {"mesh.data": 1, "mesh.seq": devices,
               # Decoding attends through the KV cache; the sequence-parallel strategy only
               # shapes the training forward, and the run's (a usp degree, 'auto') need not
               # fit this mesh.
               "parallel.strategy": BASELINE, "parallel.ulysses_degree": 0}
    if tile is not None:
        reading["parallel.tile"] = tile
    if layout:
        parallel.get_layout(layout)  # ValueError naming the layouts
        reading["parallel.layout"] = layout
    config = run_config.replace(config, reading)
    tokenizer = data.load_tokenizer(saved_tokenizer_file(meta, config, workdir))
    state, graphdef = _abstract_model(config, devices)
    checkpointer = Checkpointer(RunDir(workdir).checkpoints, read_only=True)
    try:
        params = checkpointer.restore_params(step, state["params"])
    finally:
        checkpointer.close()
    return config, tokenizer, graphdef, params, step


def stretched_model(config, graphdef, length: int):
    """(config, graphdef) of a loaded run read at `length` tokens with dynamic RoPE scaling
    (training/extension.py: stretched): the same parameters, the RoPE stretched by length over
    the run's trained length; the run's own at or below that length."""
    overrides = extension.stretched(config.model, trained=config.seq_len, length=length)
    if not overrides:
        return config, graphdef
    config = run_config.replace(config, {f"model.{k}": v for k, v in overrides.items()})
    return config, _abstract_model(config, config.mesh.seq)[1]


def _abstract_model(config, devices: int):
    """(the train state's shapes and shardings, graphdef) of `config` on the first `devices`
    devices: the model is never initialised, and only the parameters are read back into it
    (not the optimizer's moments, twice their size)."""
    mesh = parallel.make_mesh(1, devices, devices=jax.devices()[:devices])
    resolved = resolve_run(config, (1, devices), jax.default_backend(),
                           mesh.devices.flat[0].device_kind)
    if config.parallel.tiles == (0, 0):  # the kernel's default for each call's length
        attention = dataclasses.replace(resolved.attention, tile_q=0, tile_k=0)
        resolved = dataclasses.replace(resolved, attention=attention)
    arrays, program = create_train_state(config, mesh, resolved, abstract=True)
    return arrays, program.graphdef


def export_hf(workdir: str, out: str, *, step=None, dtype: str | None = None,
              devices: int = 1) -> list[str]:
    """A run's checkpoint as a Hugging Face directory `out` of its family (model/hf/families/):
    config.json (with the run's seq_len as max_position_embeddings and its tokenizer's EOS), the
    safetensors, and the run's
    tokenizer (tokenizer.json as it is; a sentencepiece model as tokenizer.model). Returns
    the files written."""
    config, tokenizer, graphdef, params, step = load_run(workdir, step, devices)
    files = hf.save(nnx.merge(graphdef, params), out, dtype=dtype,
                    max_position_embeddings=config.seq_len, eos_token_id=tokenizer.eos_id)
    name = "tokenizer.json" if tokenizer.path.endswith(".json") else "tokenizer.model"
    shutil.copyfile(tokenizer.path, os.path.join(out, name))
    return files + [name]


def held_out_tokens(config, workdir: str, tokenizer):
    """The evaluation split of a run's token cache (the held-out tail of its token stream), as
    the run made it: opened, or tokenized again if the cache is gone."""
    cache = data.build_token_cache(tokenizer, config.data.source,
                                   data.cache_location(config, workdir),
                                   eval_fraction=config.data.eval_fraction,
                                   max_bytes=config.data.max_bytes,
                                   options=data.source_options(config.data))
    return cache.eval
