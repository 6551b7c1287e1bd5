"""The train step compiled ahead of time from abstract inputs, and XLA's own memory figures for
it: the planner's second opinion (scripts/plan.py --compile), on fake CPU devices. The state is
training/state.py's, abstract: nothing is allocated.

    state_as_built(config, run, choice) -> bytes per device of parameters and optimizer state
    compiled_memory(config, run, choice) -> XLA's memory_analysis() of the jitted step
"""

from __future__ import annotations

from planner.run import Run

# --compile auto compiles when P x seq_len x rows (P x tokens per data shard) is at most this.
# Measured on 2 busy cores: tiny.py (3.6e7) 5 s; default.py (1.1e10) 8 s; llama_1b at 4k tokens
# (9e12) 45 s; the 7B at 256k (1.8e15) 70 s and 1.6 GB of host memory. Compile time grows with the
# program (layers), not with tensor sizes, so --compile yes is affordable for every config here;
# the limit keeps the default run to seconds.
COMPILE_AUTO_LIMIT = 1e11


# ------------------------------------------------------------------------------ XLA's view

def abstract_train_state(config, mesh, choice):
    """(abstract state, graphdef, tx, schedule): training.state's, shapes and shardings only."""
    from training.state import create_train_state
    return create_train_state(config, mesh, choice, abstract=True)[:4]


def _on_mesh(x, mesh, spec):
    import jax
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.NamedSharding(mesh, spec))


def bytes_per_device(tree) -> float:
    """Sum over leaves of the bytes one device holds (shard shape x itemsize)."""
    import jax
    import numpy as np
    return float(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                     for x in jax.tree.leaves(tree)))


def abstract_batch(config, mesh):
    """The batch train_step receives: int32 [B, S] fields and float32 weights, P('data', 'seq')."""
    import jax
    import jax.numpy as jnp
    from data.batches import FIELDS
    shape = (config.global_batch_size, config.seq_len)
    return {f: _on_mesh(jax.ShapeDtypeStruct(shape, jnp.float32 if f == "weights" else jnp.int32),
                        mesh, jax.P("data", "seq")) for f in FIELDS}


def run_mesh(run: Run):
    """The run's ('data', 'seq') mesh over the first run.devices (fake) devices."""
    import jax
    import parallel
    return parallel.make_mesh(run.data, run.seq, devices=jax.devices()[:run.devices])


def state_as_built(config, run: Run, choice) -> dict:
    """Bytes per device of parameters and optimizer state as the code shards them today."""
    mesh = run_mesh(run)
    state, *_ = abstract_train_state(config, mesh, choice)
    return {"parameters": bytes_per_device(state["params"]),
            "optimizer_state": bytes_per_device(state["opt_state"])}


def compiled_memory(config, run: Run, choice) -> dict:
    """XLA's memory_analysis() of the train step compiled for run.devices fake CPU devices."""
    import time
    import jax
    from training import step as step_lib

    start = time.perf_counter()
    mesh = run_mesh(run)
    state, graphdef, tx, schedule = abstract_train_state(config, mesh, choice)
    train_step = step_lib.make_train_step(
        graphdef, tx, schedule, mask_documents=config.data.mask_documents,
        grad_accum_steps=config.optim.grad_accum_steps,
        skip_nonfinite=config.optim.skip_nonfinite)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    with jax.set_mesh(mesh):
        jitted = jax.jit(train_step, donate_argnums=0, out_shardings=(shardings, None))
        step_start = time.perf_counter()
        compiled = jitted.lower(state, abstract_batch(config, mesh)).compile()
        step_compile_s = time.perf_counter() - step_start
        stats = compiled.memory_analysis()
    figures = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in
               ("argument", "output", "alias", "temp", "generated_code")}
    figures["total"] = (figures["argument"] + figures["output"] - figures["alias"]
                        + figures["temp"])
    figures["compile_s"] = time.perf_counter() - start  # state, optimizer init and the step
    figures["step_compile_s"] = step_compile_s  # the train step's lower + compile alone
    figures["hlo_lines"] = compiled.as_text().count("\n")  # program size, after optimisation
    return figures


def compile_decision(mode: str, params: int, run: Run) -> tuple[bool, str]:
    """(compile?, why). auto: P x tokens per data shard <= COMPILE_AUTO_LIMIT."""
    size = params * run.seq_len * run.global_batch / run.data
    if mode == "yes":
        return True, "asked (--compile yes)"
    if mode == "no":
        return False, "skipped (--compile no)"
    if size <= COMPILE_AUTO_LIMIT:
        return True, f"small problem (P x tokens per data shard = {size:.1e})"
    return False, (f"skipped (too large to compile on this host: P x tokens per data shard = "
                   f"{size:.1e} > {COMPILE_AUTO_LIMIT:.0e}; --compile yes forces it)")
