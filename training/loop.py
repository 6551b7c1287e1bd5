"""train_and_evaluate(config, workdir): the whole run, from config to metrics.

config -> checks (nothing written yet) -> mesh -> the workdir's lock -> the latest checkpoint's run
compared with this one -> tokenizer + token cache -> sharded model and optimizer -> restore the
latest good checkpoint, if any -> for each step: batch (host numpy,
permuted into the layout, prefetched) -> jitted step -> metrics every log_every_steps (timed over
a window that ends in a device sync) -> eval every eval_every_steps -> asynchronous checkpoint
every checkpoint_every_steps, at the end, and when asked to stop (SIGTERM / preemption: then
checkpoints.Preempted, which train.py turns into exit 75).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

import data
import model
import parallel
import run_config
from checkpoints import (Checkpointer, CheckpointError, Preempted, StopRequest, WorkdirLock,
                         abstract_like)
from planner import ResolvedRun, flops, memory
from run_config import ConfigError
from storage.run_dir import RunDir
from training import (init_from, metrics as metrics_lib, resume, stages, state as state_lib,
                      step as step_lib, trackers)
from training.evaluation import position_loss
from training.analysis import profile as profile_lib
from training.resolved import (announce_resolved, as_checkpoint_ran, mesh_shape_of,
                               resolve_here, resolve_on_documents)
from training.saved_run import saved_meta, saved_steps
from training.state import Progress, TrainState
from training.trackers import say
from training.validate import validate_config


class NonFiniteError(RuntimeError):
    """The loss or gradients stopped being finite; the last good checkpoint is kept."""


def create_train_state(config, mesh, resolved=None):
    """training.state.create_train_state (config: a config file's ConfigDict or its
    RunConfig), the run resolved here when not given."""
    config = run_config.typed(config)
    resolved = resolved or resolve_here(config, mesh)
    return state_lib.create_train_state(config, mesh, resolved)


def _check_finite(step: int, metrics: dict, config, checkpointer, skipped_in_a_row: int) -> None:
    """Stops the run before a non-finite state can reach a checkpoint; with skip_nonfinite,
    once optim.max_skipped_steps steps in a row were skipped (the run has diverged)."""
    if config.optim.skip_nonfinite:
        limit = config.optim.max_skipped_steps
        if skipped_in_a_row >= limit:
            kept = checkpointer.steps()
            raise NonFiniteError(
                f"{skipped_in_a_row} steps in a row up to step {step} had a non-finite loss or "
                f"gradient and were skipped (optim.max_skipped_steps={limit}); stopped without "
                f"saving (last good checkpoint: {kept[-1] if kept else 'none'}): lower "
                f"optim.learning_rate and resume")
        return
    bad = [k for k in ("train/loss", "learning/grad_norm", "learning/param_norm")
           if not math.isfinite(metrics[k])]
    if bad:
        kept = checkpointer.steps()
        raise NonFiniteError(
            f"{bad[0]} is {metrics[bad[0]]} at step {step}; stopped without saving "
            f"(last good checkpoint: {kept[-1] if kept else 'none'}): lower "
            f"optim.learning_rate, or set optim.skip_nonfinite=True to skip such batches")


def train_and_evaluate(config, workdir: str, explicit=(), stage=None) -> dict:
    """Trains (or resumes) up to config.num_train_steps; returns the last logged metrics.
    config: a config file's ConfigDict, or the RunConfig run_config.build makes of it.
    explicit: the config fields set on purpose (train.py: its --config.FIELD flags), which win
    over what config.init_from's source says (training/init_from.py). With config.stages,
    the stages one after the other (training/stages.py); `stage` is then the one this is.
    Raises checkpoints.Preempted after saving when asked to stop (SIGTERM, Ctrl-C, a
    preemption notice) before the last step."""
    config = run_config.typed(config)
    if stage is None and config.stages:
        return stages.train_stages(config, workdir, explicit, train_and_evaluate)
    # The source's model settings read in (init_from), the run's config complete.
    config, source = init_from.resolve(config, workdir, explicit)
    validate_config(config, jax.device_count(), jax.process_count(), jax.default_backend())
    resume.check_inputs(config, workdir)
    try:  # multi-slice: the mesh's data axis must span the slices
        mesh = parallel.make_mesh(config.mesh.data, config.mesh.seq)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    mesh_shape = mesh_shape_of(mesh)
    # Every 'auto' filled, nothing built or written yet (documents masked: one a row until the
    # corpus is read, below).
    resolved = resolve_here(config, mesh)
    # Refuse a changed run before anything is written or its data built (a changed corpus
    # would train a new tokenizer first); the tokenizer itself is compared on restore.
    identity = resume.run_identity(config)  # the corpus's fingerprint stats its files
    latest = _check_against_latest(config, workdir, identity, resolved)
    lock = WorkdirLock(workdir)
    _take(lock)  # the first write to the workdir
    try:
        checkpointer = Checkpointer(RunDir(workdir).checkpoints,
                                    keep=config.checkpoint_keep, log=say)
        try:
            prepared = data.prepare_data(config, workdir, mesh_shape[1],
                                         resolved.attention)  # data errors
            resolved, prepared = resolve_on_documents(config, mesh, resolved, prepared)
            resolved = announce_resolved(config, resolved, latest)
            setup = RunSetup(config, workdir, mesh, resolved, identity, source, stage)
            return _run(setup, checkpointer, prepared)
        finally:
            checkpointer.close()
    finally:
        lock.release()


def _take(lock) -> None:
    """Process 0 takes the workdir's lock; every process learns whether it did."""
    refusal = None
    if jax.process_index() == 0:
        try:
            lock.acquire(log=say)
        except CheckpointError as e:
            refusal = e
    if jax.process_count() > 1:
        refused = multihost_utils.broadcast_one_to_all(np.int32(refusal is not None))
        if refused and refusal is None:
            refusal = CheckpointError(f"process 0 could not lock {lock.workdir} (see its error)")
    if refusal is not None:
        raise refusal


def _check_against_latest(config, workdir, identity, resolved):
    """The newest checkpoint's run and parameters against this one (`resolved` with the memory
    switches the checkpoint ran with), and stop_at_step after its step, read without writing
    (a checkpoint that does not read is left to the restore, which tells damage from trouble;
    falling back to an older one only moves the start earlier). Its record, or None."""
    steps = saved_steps(workdir)
    if not steps:
        return None
    if config.stop_at_step and config.stop_at_step <= steps[-1]:
        raise ConfigError(f"stop_at_step={config.stop_at_step} is not after step {steps[-1]}, "
                          f"which this run resumes from: raise it, or set "
                          f"--config.stop_at_step=0")
    try:
        _, meta = saved_meta(workdir, steps[-1])
    except Exception:  # noqa: BLE001
        return None
    directory = RunDir(workdir).checkpoints
    resume.check_compatible(directory, steps[-1], meta, as_checkpoint_ran(resolved, meta).model)
    resume.check_same_run(config, directory, steps[-1], meta, identity)
    return meta


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What a run was worked out to be before its first step, read by every part of the loop."""

    config: run_config.RunConfig
    workdir: str
    mesh: jax.sharding.Mesh
    resolved: ResolvedRun
    identity: dict  # resume.run_identity's fingerprints, the tokenizer's included
    source: init_from.Source | None  # config.init_from's, for a start
    stage: stages.Stage | None  # the stage this is, of a staged run

    @property
    def mesh_shape(self) -> tuple[int, int]:
        return mesh_shape_of(self.mesh)


def _restore(setup: RunSetup, checkpointer, arrays, program) -> TrainState:
    """The latest good checkpoint of this run, or a fresh start from `arrays`."""
    def check(step, meta):
        resume.check_compatible(checkpointer.directory, step, meta, program.model)
        resume.check_same_run(setup.config, checkpointer.directory, step, meta, setup.identity)

    restored = checkpointer.restore_latest(abstract_like(arrays), check, log=say)
    if restored is None:
        return TrainState(0, arrays, setup.config.seed, Progress())
    step, arrays, meta = restored
    return TrainState(step, arrays, setup.config.seed, Progress.from_meta(meta))


def _compile_steps(config, program, arrays):
    """The jitted train step (donates the arrays, keeps every array's sharding) and eval step."""
    platform = jax.devices()[0].platform
    train_step = step_lib.jit_train_step(config, program, arrays, platform)
    eval_step = jax.jit(step_lib.make_eval_step(program.graphdef,
                                                mask_documents=config.data.mask_documents),
                        compiler_options=parallel.compiler_options(platform))
    return train_step, eval_step


def _eval_batches(config, cache, spec, mesh):
    """The fixed evaluation batches, built once, as global arrays."""
    eval_fn = functools.partial(data.eval_rows, cache.eval, spec)
    count = data.num_eval_batches(cache.eval, spec, config.eval_batches)
    return [data.to_global(eval_fn, i, mesh, spec) for i in range(count)]


def _position_eval(config, cache, mesh, choice, graphdef):
    """(the jitted per-position eval, its batch on the mesh) for config.eval_position_buckets,
    or None (off, or no held-out document of seq_len + 1 tokens: said once)."""
    buckets = config.eval_position_buckets
    if not buckets:
        return None
    rows = position_loss.long_documents(cache.eval, cache.eos_id, config.seq_len,
                                        config.global_batch_size)
    rows = rows[:len(rows) // mesh.shape[parallel.DATA] * mesh.shape[parallel.DATA]]
    if not len(rows):
        say(f"ringstripe: no held-out document has {config.seq_len + 1:,} tokens, so "
            f"eval/loss_by_position is not logged (raise data.eval_fraction)")
        return None
    batch = position_loss.position_batch(rows, choice.layout, mesh.shape[parallel.SEQ],
                                         choice.balance_unit)
    return position_loss.make_position_eval(graphdef, buckets), position_loss.on_mesh(batch, mesh)


def _announce(setup: RunSetup, num_params: int, cache, model_cfg) -> None:
    count, (data_shards, seq_shards) = jax.device_count(), setup.mesh_shape
    active = ""
    if model_cfg.sparse_layers:  # what a token goes through: what MFU counts
        moe = model_cfg.moe
        split = f", over {moe.expert_devices} devices" if moe.expert_devices > 1 else ""
        active = (f" ({memory.param_counts(model_cfg)['active']:,} active a token: "
                  f"{moe.top_k} of {moe.num_experts} experts{split})")
    say(f"ringstripe: {setup.resolved.attention.label()}, mesh data {data_shards} x seq "
        f"{seq_shards} on {count} {jax.devices()[0].platform} device{'s' * (count > 1)}; "
        f"{num_params:,} parameters{active}; {cache.num_tokens:,} tokens in the cache; "
        f"{setup.config.tokens_per_step:,} tokens per step")


def _initial_state(setup: RunSetup, checkpointer) -> tuple[TrainState, state_lib.TrainProgram]:
    """The run's state before its next step, and its program: the latest good checkpoint of
    this run; else, at a start, the weights of config.init_from's source (read only then: a
    resume never needs them), or random ones."""
    config, mesh, source = setup.config, setup.mesh, setup.source

    def from_source(model_cfg, abstract):
        say(f"ringstripe: initial weights from {source}")
        return init_from.initial_params(source, model_cfg, abstract, mesh)

    initial = from_source if source is not None and not checkpointer.steps() else None
    arrays, program = state_lib.create_train_state(config, mesh, setup.resolved,
                                                   initial_params=initial)
    state = _restore(setup, checkpointer, arrays, program)
    if not state.step and source is not None and initial is None:  # every checkpoint damaged
        arrays, program = state_lib.create_train_state(config, mesh, setup.resolved,
                                                       initial_params=from_source)
        state = TrainState(0, arrays, config.seed, state.progress)
    if setup.stage is not None and setup.stage.index > 1 and not state.step and source is not None:
        state.progress = Progress.from_meta(source.meta)  # the stage before's counters, run
    return state, program


def _run(setup: RunSetup, checkpointer, prepared) -> dict:
    config, mesh, resolved = setup.config, setup.mesh, setup.resolved
    tokenizer, cache, spec = prepared
    choice = resolved.attention
    setup = dataclasses.replace(setup, identity={**setup.identity,
                                                 "tokenizer": tokenizer.fingerprint})
    state, program = _initial_state(setup, checkpointer)
    start_step, progress = state.step, state.progress
    train_step, eval_step = _compile_steps(config, program, state.arrays)
    eval_batches = _eval_batches(config, cache, spec, mesh)
    by_position = _position_eval(config, cache, mesh, choice, program.graphdef)
    peak = flops.peak_flops(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    flops_per_token = metrics_lib.model_flops_per_token(config, program.model, cache, spec)
    track = trackers.make_trackers(config, setup.workdir, setup.mesh_shape, resolved,
                                   jax.process_index() == 0, progress.wandb_run_id, start_step,
                                   setup.stage)
    _announce(setup, model.count_params(nnx.merge(program.graphdef, state.arrays["params"])),
              cache, program.model)
    if start_step:
        track.event(start_step, "resumed", {"restored_step": start_step, **resolved.record(),
                                            "attention": choice.layout,
                                            "mesh": list(setup.mesh_shape)})

    tokenizer_path = resume.tokenizer_location(config, setup.workdir, tokenizer)

    def save():
        checkpointer.save(state.step, state.arrays, resume.checkpoint_meta(
            config, state, setup.mesh_shape, tokenizer_path, resolved, setup.identity))
        track.persist()  # the rows up to this checkpoint outlive a kill

    tokens_per_step = config.tokens_per_step
    prefetch = data.make_prefetcher(config.data, cache, mesh, spec, start_step=start_step)
    stop = StopRequest(checkpointer)
    profiler = profile_lib.StepProfiler(config.profile, setup.workdir)
    train_step = profiler.wrap(train_step)
    profiled = None  # the profile's summary, said at the end
    last, window_start, window_steps = {}, None, 0
    skipped, skipped_in_a_row = [], 0  # with skip_nonfinite: each step's flag, read at logs
    try:
        with jax.set_mesh(mesh):
            for step in range(start_step + 1, config.num_train_steps + 1):
                batch_step, batch = prefetch.next()
                assert batch_step == step - 1, (batch_step, step)
                profiler.before(step)
                with profiler.annotate(step):
                    state.arrays, metrics = train_step(state.arrays, batch)
                state.step = step
                summary = profiler.after(step, state.arrays)
                if summary:  # (its window's time is in this log window's throughput)
                    profiled = summary
                    track.profile(step, summary, profiler.directory)
                if config.optim.skip_nonfinite:
                    skipped.append(metrics["learning/skipped"])
                window_steps += 1
                first = window_start is None  # of this start or resume: it compiles
                if first:  # so its loss is logged, and its time left out of every window
                    jax.block_until_ready(state.arrays)
                    window_start, window_steps = time.perf_counter(), 0
                    progress.train_tokens += tokens_per_step
                is_last = step == config.num_train_steps
                is_eval = step % config.eval_every_steps == 0 or is_last
                is_save = step % config.checkpoint_every_steps == 0 or is_last
                preempted = stop.should_stop(step)
                stopping = preempted or step == config.stop_at_step
                if not (first or step % config.log_every_steps == 0 or is_eval or is_save
                        or stopping):
                    continue
                host = step_lib.host_metrics(jax.device_get(metrics), is_eval)  # ends window
                now = time.perf_counter()
                for flag in jax.device_get(skipped):
                    skipped_in_a_row = skipped_in_a_row + 1 if flag else 0
                skipped.clear()
                _check_finite(step, host, config, checkpointer, skipped_in_a_row)
                last = dict(host)
                if window_steps:  # throughput over the steps since the last log (none: first)
                    progress.train_time_s += now - window_start
                    progress.train_tokens += window_steps * tokens_per_step
                    last.update(metrics_lib.throughput(config, flops_per_token, mesh, window_steps,
                                            now - window_start, peak))
                if first:  # what this run resolved to ('auto' too), once a start
                    sections = resolved.sections()
                    last.update({f"attention/{k}": v for k, v in sections["attention"].items()})
                    last.update({f"memory/{k}": v
                                 for k, v in sections["memory_switches"].items()})
                last.update({"progress/train_time_s": progress.train_time_s,
                             "progress/train_tokens": progress.train_tokens,
                             **metrics_lib.memory_metrics()})
                if is_eval:
                    params = state.arrays["params"]
                    last.update(metrics_lib.evaluate(eval_step, params, eval_batches))
                    if by_position:  # the loss at each range of original positions
                        position_eval, position_rows = by_position
                        last["eval/loss_by_position"] = position_loss.curve(
                            position_eval, params, position_rows)
                        last["eval/position_bucket_tokens"] = (
                            config.seq_len / config.eval_position_buckets)
                track.log(step, last)
                if is_save or stopping:
                    save()
                if stopping:
                    checkpointer.wait()
                    track.event(step, "stopped on request", {"checkpoint": step})
                    if preempted and not is_last:  # not finished: the engine starts it again
                        raise Preempted(step)
                    return last
                window_start, window_steps = time.perf_counter(), 0
    finally:
        profiler.close()
        if profiled:
            say(profile_lib.describe(profiled, profiler.directory))
        stop.close()
        prefetch.close()
        track.close()
    return last

