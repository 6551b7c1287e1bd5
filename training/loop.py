"""train_and_evaluate(config, workdir): the whole run, from config to metrics.

config -> mesh -> tokenizer + token cache -> sharded model and optimizer -> for each step:
batch (host numpy, permuted into the layout) -> jitted step -> metrics every log_every_steps
(timed over a window that ends in block_until_ready) -> eval every eval_every_steps.
"""

from __future__ import annotations

import functools
import math
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

import data
import model
import parallel
from training import flops, optim, step as step_lib, trackers
from training.validate import ConfigError, validate_config


def _barrier(name: str):
    """Blocks until every process gets here (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def prepare_data(config, workdir: str, mesh):
    """Tokenizer and token cache; process 0 builds shared files, the others wait and read."""
    cache_dir = config.data.cache_dir or os.path.join(workdir, "cache")
    os.makedirs(cache_dir, exist_ok=True)
    kw = dict(process_index=jax.process_index(), barrier=lambda: _barrier("data"))
    tokenizer = data.get_tokenizer(config.data, cache_dir, **kw)
    if tokenizer.vocab_size != config.model.vocab_size:
        raise ConfigError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} pieces but "
            f"model.vocab_size is {config.model.vocab_size}: set --config.model.vocab_size="
            f"{tokenizer.vocab_size} or use a matching tokenizer")
    cache = data.build_token_cache(tokenizer, config.data.source, cache_dir,
                                   eval_fraction=config.data.eval_fraction,
                                   max_bytes=config.data.max_bytes, **kw)
    spec = data.BatchSpec(seq_len=config.seq_len, global_batch=config.global_batch_size,
                          seed=config.seed, kind=config.parallel.attention,
                          num_seq_shards=mesh.shape[parallel.SEQ],
                          mask_documents=config.data.mask_documents,
                          reset_positions=config.data.reset_positions,
                          eos_id=tokenizer.eos_id)
    return tokenizer, cache, spec


def create_train_state(config, mesh):
    """Sharded model parameters and optimizer state, and the pieces the steps need."""
    model_cfg = model.ModelConfig.from_config(config.model, config.parallel.attention)
    net = model.create(model_cfg, mesh, config.seed)
    graphdef, params = nnx.split(net, nnx.Param)
    tx, schedule = optim.make_optimizer(config.optim, config.num_train_steps)
    with jax.set_mesh(mesh):
        opt_state = jax.jit(tx.init)(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), jax.NamedSharding(mesh, jax.P()))
    state = {"step": step, "params": params, "opt_state": opt_state}
    return state, graphdef, tx, schedule, model_cfg


def _throughput(config, model_cfg, mesh, steps: int, seconds: float, peak: float) -> dict:
    tokens = steps * config.global_batch_size * config.seq_len
    tokens_per_sec = tokens / seconds
    tflops = flops.flops_per_token(model_cfg, config.seq_len) * tokens_per_sec / mesh.size / 1e12
    return {
        "throughput/tokens_per_sec": tokens_per_sec,
        "throughput/tokens_per_sec_per_device": tokens_per_sec / mesh.size,
        "throughput/step_time_s": seconds / steps,
        "throughput/model_tflops_per_device": tflops,
        "throughput/mfu": tflops * 1e12 / peak,
    }


def evaluate(eval_step, params, eval_batches) -> dict:
    total = weight = 0.0
    for batch in eval_batches:
        t, w = eval_step(params, batch)
        total, weight = total + float(t), weight + float(w)
    loss = total / max(weight, 1.0)
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 80.0))}


def train_and_evaluate(config, workdir: str) -> dict:
    """Trains for config.num_train_steps; returns the last logged metrics."""
    validate_config(config, jax.device_count(), jax.process_count())
    os.makedirs(workdir, exist_ok=True)
    mesh = parallel.make_mesh(config.mesh.data, config.mesh.seq)
    tokenizer, cache, spec = prepare_data(config, workdir, mesh)
    state, graphdef, tx, schedule, model_cfg = create_train_state(config, mesh)
    mask_docs = config.data.mask_documents
    shardings = jax.tree.map(lambda x: x.sharding, state)
    train_step = jax.jit(
        step_lib.make_train_step(graphdef, tx, schedule, mask_documents=mask_docs,
                                 grad_accum_steps=config.optim.grad_accum_steps),
        donate_argnums=0, out_shardings=(shardings, None))
    eval_step = jax.jit(step_lib.make_eval_step(graphdef, mask_documents=mask_docs))
    eval_fn = functools.partial(data.eval_rows, cache.eval, spec)
    eval_batches = [data.to_global(eval_fn, i, mesh, spec)
                    for i in range(data.num_eval_batches(cache.eval, spec, config.eval_batches))]

    is_main = jax.process_index() == 0
    peak = flops.peak_flops(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    track = trackers.make_trackers(config, workdir, (mesh.shape["data"], mesh.shape["seq"]),
                                   is_main)
    if is_main:
        print(f"ringstripe: {config.parallel.attention} attention, mesh data "
              f"{mesh.shape['data']} x seq {mesh.shape['seq']} on {jax.device_count()} "
              f"{jax.devices()[0].platform} devices; {model.count_params(nnx.merge(graphdef, state['params'])):,} "
              f"parameters; {cache.num_tokens:,} tokens in the cache; "
              f"{config.global_batch_size * config.seq_len:,} tokens per step", flush=True)

    train_fn = functools.partial(data.batch_rows, cache.train, spec)
    prefetch = data.Prefetcher(train_fn, mesh, spec, start_step=0)
    last = {}
    window_start, window_steps = None, 0
    try:
        with jax.set_mesh(mesh):
            for step in range(1, config.num_train_steps + 1):
                batch_step, batch = prefetch.next()
                assert batch_step == step - 1, (batch_step, step)
                state, metrics = train_step(state, batch)
                if window_start is None:  # the first step compiles: time from its end
                    jax.block_until_ready(state)
                    window_start, window_steps = time.perf_counter(), 0
                    continue
                window_steps += 1
                is_eval = step % config.eval_every_steps == 0 or step == config.num_train_steps
                if step % config.log_every_steps and not is_eval:
                    continue
                metrics = jax.device_get(metrics)  # waits for this step: ends the window
                now = time.perf_counter()
                last = {k: float(v) for k, v in metrics.items()}
                if not math.isfinite(last["train/loss"]):
                    raise FloatingPointError(f"loss is {last['train/loss']} at step {step}")
                last.update(_throughput(config, model_cfg, mesh, window_steps,
                                        now - window_start, peak))
                if is_eval:
                    last.update(evaluate(eval_step, state["params"], eval_batches))
                track.log(step, last)
                window_start, window_steps = time.perf_counter(), 0
    finally:
        prefetch.close()
        track.close()
    return last
