"""train_and_evaluate(config, workdir): the whole run, from config to metrics.

config -> checks (nothing written yet) -> mesh -> the workdir's lock -> the latest checkpoint's run
compared with this one -> tokenizer + token cache -> sharded model and optimizer -> restore the
latest good checkpoint, if any -> for each step: batch (host numpy,
permuted into the layout, prefetched) -> jitted step -> metrics every log_every_steps (timed over
a window that ends in a device sync) -> eval every eval_every_steps -> asynchronous checkpoint
every checkpoint_every_steps, at the end, and when asked to stop (SIGTERM / preemption).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import numpy as np
from flax import nnx

import data
import model
import parallel
import run_config
from checkpoints import Checkpointer, CheckpointError, StopRequest, WorkdirLock, abstract_like
from planner import flops, memory
from run_config import ConfigError
from storage.run_dir import RunDir
from training import (init_from, position_loss, resume, stages, state as state_lib,
                      step as step_lib, trackers)
from training.resolved import (announce_resolved, as_checkpoint_ran, mesh_shape_of,
                               resolve_here, resolve_on_documents)
from training.saved_run import saved_meta, saved_steps
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


def model_flops_per_token(config, model_cfg, cache, spec) -> float:
    """planner/flops.py's count; with documents masked, each document's causal triangle, as the
    mean over step 0's rows (the planner's --documents data counts the same rows)."""
    rows = (data.natural_segment_ids(cache, spec, config.global_batch_size)
            if config.data.mask_documents else None)
    return flops.flops_per_token(model_cfg, config.seq_len, segment_ids=rows)


def _throughput(config, flops_per_token, mesh, steps: int, seconds: float, peak: float) -> dict:
    tokens = steps * config.tokens_per_step
    tokens_per_sec = tokens / seconds
    tflops = flops_per_token * tokens_per_sec / mesh.size / 1e12
    return {
        "throughput/tokens_per_sec": tokens_per_sec,
        "throughput/tokens_per_sec_per_device": tokens_per_sec / mesh.size,
        "throughput/step_time_s": seconds / steps,
        "throughput/model_tflops_per_device": tflops,
        "throughput/mfu": tflops * 1e12 / peak,
    }


def memory_metrics() -> dict:
    """Peak memory so far, in GB: the largest resident set of any process of the run (the host
    side: batches, the token cache, and on CPU the arrays themselves), and where the runtime
    reports it (GPU, TPU), the largest device's peak allocation."""
    import resource
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    device_gb = max((s.get("peak_bytes_in_use", 0) for s in stats), default=0) / 1e9
    values = np.array([rss_gb, device_gb])
    if jax.process_count() > 1:  # every process logs at the same steps, so all get here
        from jax.experimental import multihost_utils
        values = np.asarray(multihost_utils.process_allgather(values)).max(axis=0)
    out = {"memory/host_peak_rss_gb": float(values[0])}
    if values[1]:
        out["memory/device_peak_gb"] = float(values[1])
    return out


def evaluate(eval_step, params, eval_batches) -> dict:
    total = weight = 0.0
    for batch in eval_batches:
        t, w = eval_step(params, batch)
        total, weight = total + float(t), weight + float(w)
    loss = total / max(weight, 1.0)
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 80.0))}


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
    the stages one after the other (training/stages.py); `stage` is then the one this is."""
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
            return _run(config, workdir, mesh, resolved, checkpointer, prepared, identity,
                        source, stage)
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
        from jax.experimental import multihost_utils
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


def _restore(config, checkpointer, state, identity, model_cfg):
    """(start step, state, progress): the latest good checkpoint, or a fresh start."""
    def check(step, meta):
        resume.check_compatible(checkpointer.directory, step, meta, model_cfg)
        resume.check_same_run(config, checkpointer.directory, step, meta, identity)

    restored = checkpointer.restore_latest(abstract_like(state), check, log=say)
    if restored is None:
        return 0, state, resume.Progress()
    step, state, meta = restored
    return step, state, resume.Progress.from_meta(meta)


def _compile_steps(config, graphdef, tx, schedule, state):
    """The jitted train step (donates the state, keeps every array's sharding) and eval step."""
    platform = jax.devices()[0].platform
    train_step = step_lib.jit_train_step(config, graphdef, tx, schedule, state, platform)
    eval_step = jax.jit(step_lib.make_eval_step(graphdef,
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


def _announce(config, choice, mesh_shape, num_params: int, cache, model_cfg) -> None:
    count = jax.device_count()
    active = ""
    if model_cfg.sparse_layers:  # what a token goes through: what MFU counts
        moe = model_cfg.moe
        split = f", over {moe.expert_devices} devices" if moe.expert_devices > 1 else ""
        active = (f" ({memory.param_counts(model_cfg)['active']:,} active a token: "
                  f"{moe.top_k} of {moe.num_experts} experts{split})")
    say(f"ringstripe: {choice.label()}, mesh data {mesh_shape[0]} x seq {mesh_shape[1]} on "
        f"{count} {jax.devices()[0].platform} device{'s' * (count > 1)}; "
        f"{num_params:,} parameters{active}; {cache.num_tokens:,} tokens in the cache; "
        f"{config.tokens_per_step:,} tokens per step")


def _initial_state(config, mesh, resolved, checkpointer, identity, source):
    """(start step, state, progress, graphdef, tx, schedule, model_cfg): the latest good
    checkpoint of this run; else, at a start, the weights of config.init_from's source (read
    only then: a resume never needs them), or random ones."""
    def from_source(model_cfg, abstract):
        say(f"ringstripe: initial weights from {source}")
        return init_from.initial_params(source, model_cfg, abstract, mesh)

    initial = from_source if source is not None and not checkpointer.steps() else None
    state, graphdef, tx, schedule, model_cfg = state_lib.create_train_state(
        config, mesh, resolved, initial_params=initial)
    start_step, state, progress = _restore(config, checkpointer, state, identity, model_cfg)
    if not start_step and source is not None and initial is None:  # every checkpoint damaged
        state, graphdef, tx, schedule, model_cfg = state_lib.create_train_state(
            config, mesh, resolved, initial_params=from_source)
    return start_step, state, progress, graphdef, tx, schedule, model_cfg


def _run(config, workdir, mesh, resolved, checkpointer, prepared, identity, source,
         stage) -> dict:
    tokenizer, cache, spec = prepared
    choice = resolved.attention
    mesh_shape = mesh_shape_of(mesh)
    identity = {**identity, "tokenizer": tokenizer.fingerprint}
    start_step, state, progress, graphdef, tx, schedule, model_cfg = _initial_state(
        config, mesh, resolved, checkpointer, identity, source)
    if stage is not None and stage.index > 1 and not start_step and source is not None:
        progress = resume.Progress.from_meta(source.meta)  # the stage before's counters, run
    train_step, eval_step = _compile_steps(config, graphdef, tx, schedule, state)
    eval_batches = _eval_batches(config, cache, spec, mesh)
    by_position = _position_eval(config, cache, mesh, choice, graphdef)
    peak = flops.peak_flops(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    flops_per_token = model_flops_per_token(config, model_cfg, cache, spec)
    track = trackers.make_trackers(config, workdir, mesh_shape, resolved,
                                   jax.process_index() == 0, progress.wandb_run_id, start_step,
                                   stage)
    _announce(config, choice, mesh_shape,
              model.count_params(nnx.merge(graphdef, state["params"])), cache, model_cfg)
    if start_step:
        track.event(start_step, "resumed", {"restored_step": start_step, **resolved.record(),
                                            "attention": choice.layout, "mesh": list(mesh_shape)})

    tokenizer_path = resume.tokenizer_location(config, workdir, tokenizer)

    def save(step):
        checkpointer.save(step, state, resume.checkpoint_meta(
            config, step, progress, mesh_shape, tokenizer_path, resolved, identity))
        track.persist()  # the rows up to this checkpoint outlive a kill

    tokens_per_step = config.tokens_per_step
    prefetch = data.make_prefetcher(config.data, cache, mesh, spec, start_step=start_step)
    stop = StopRequest(checkpointer)
    last, window_start, window_steps = {}, None, 0
    skipped, skipped_in_a_row = [], 0  # with skip_nonfinite: each step's flag, read at logs
    try:
        with jax.set_mesh(mesh):
            for step in range(start_step + 1, config.num_train_steps + 1):
                batch_step, batch = prefetch.next()
                assert batch_step == step - 1, (batch_step, step)
                state, metrics = train_step(state, batch)
                if config.optim.skip_nonfinite:
                    skipped.append(metrics["learning/skipped"])
                window_steps += 1
                first = window_start is None  # of this start or resume: it compiles
                if first:  # so its loss is logged, and its time left out of every window
                    jax.block_until_ready(state)
                    window_start, window_steps = time.perf_counter(), 0
                    progress.train_tokens += tokens_per_step
                is_last = step == config.num_train_steps
                is_eval = step % config.eval_every_steps == 0 or is_last
                is_save = step % config.checkpoint_every_steps == 0 or is_last
                stopping = stop.should_stop(step) or step == config.stop_at_step
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
                    last.update(_throughput(config, flops_per_token, mesh, window_steps,
                                            now - window_start, peak))
                if first:  # what this run resolved to ('auto' too), once a start
                    last.update({f"attention/{k}": v for k, v in choice.record().items()})
                    last.update({f"memory/{k}": v for k, v in resolved.switches.record().items()})
                last.update({"progress/train_time_s": progress.train_time_s,
                             "progress/train_tokens": progress.train_tokens, **memory_metrics()})
                if is_eval:
                    last.update(evaluate(eval_step, state["params"], eval_batches))
                    if by_position:  # the loss at each range of original positions
                        position_eval, position_rows = by_position
                        last["eval/loss_by_position"] = position_loss.curve(
                            position_eval, state["params"], position_rows)
                        last["eval/position_bucket_tokens"] = (
                            config.seq_len / config.eval_position_buckets)
                track.log(step, last)
                if is_save or stopping:
                    save(step)
                if stopping:
                    checkpointer.wait()
                    track.event(step, "stopped on request", {"checkpoint": step})
                    return last
                window_start, window_steps = time.perf_counter(), 0
    finally:
        stop.close()
        prefetch.close()
        track.close()
    return last
