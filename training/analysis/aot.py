"""The train step compiled ahead of time from abstract inputs, and XLA's own memory figures for
it: the planner's second opinion (scripts/plan.py --compile), on fake CPU devices or, with
--compile tpu, by the TPU compiler for a TPU slice's devices (planner/topology.py; no TPU
needed). The state is training/state.py's, abstract: nothing is allocated.

    state_as_built(config, run, resolved) -> bytes per device of parameters and optimizer state
    compiled_memory(config, run, resolved) -> XLA's memory_analysis() of the jitted step
    compiled_memory(config, run, resolved, devices=topology.devices(slice_for("v4-32")))
        -> the same from XLA:TPU and Mosaic, per chip, host memory included
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import parallel
from data.batches import FIELDS
from planner.run import Run
from run_config import ConfigError
from training import step as step_lib
from training.analysis.hlo_overlap import collective_bytes, loop_overlaps, summary
from training.state import create_train_state

# --compile auto compiles when P x seq_len x rows (P x tokens per data shard) is at most this.
# Measured on 2 busy cores: tiny.py (3.6e7) 5 s; default.py (1.1e10) 8 s; llama_1b at 4k tokens
# (9e12) 45 s; the 7B at 256k (1.8e15) 70 s and 1.6 GB of host memory. Compile time grows with the
# program (layers), not with tensor sizes, so --compile yes is affordable for every config here;
# the limit keeps the default run to seconds.
COMPILE_AUTO_LIMIT = 1e11


class CompileRefused(Exception):
    """The TPU compiler refused the program (out of HBM or VMEM, a Mosaic kernel it cannot
    lower): one line that names the piece and the fix."""


# What to change when the compiler runs out of a memory space.
_FIXES = {"vmem": "smaller attention tiles (--config.parallel.tile, e.g. 512)",
          "hbm": "remat (model.remat, remat_policy 'offload'), smaller model.loss_chunk/"
                 "mlp_chunk, a shorter seq_len or more chips"}


def refusal(error: Exception) -> CompileRefused:
    """The compiler's error as one line: what it ran out of (or its first line) and the piece
    whose allocation is largest, named by the jax operation it came from."""
    text = str(error)
    first = next((ln for ln in text.splitlines() if ln.strip()), text).strip()
    first = re.sub(r"^[A-Z_]+: XLA:TPU compile permanent error\. ", "", first)
    space = re.search(r"memory space (\w+)|memory on (HBM)", first)
    op = re.search(r'op_name="([^"]+)"', text)
    piece = f"; largest allocation from {_piece(op.group(1))}" if op else ""
    kind = space and (space.group(1) or space.group(2)).lower()
    fix = f": use {_FIXES[kind]}" if kind in _FIXES else ""
    return CompileRefused(f"the TPU compiler refused the train step: {first.rstrip('.')}{piece}"
                          f"{fix}")


def _piece(op_name: str) -> str:
    """'jit(train_step)/transpose(jvp())/.../jit(_backward)/shard_map/.../pallas_call' ->
    'the attention kernel (pallas_call) in the backward pass'."""
    where = "backward pass" if "transpose(" in op_name else "forward pass"
    leaf = op_name.rsplit("/", 1)[-1]
    what = f"the attention kernel ({leaf})" if leaf == "pallas_call" else leaf
    return f"{what} in the {where}"


# ------------------------------------------------------------------------------ XLA's view

def abstract_train_state(config, mesh, resolved):
    """(abstract arrays, TrainProgram): training.state's, shapes and shardings only;
    resolved: the run's planner.ResolvedRun."""
    return create_train_state(config, mesh, resolved, abstract=True)


def _on_mesh(x, mesh, spec):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.NamedSharding(mesh, spec))


def bytes_per_device(tree) -> float:
    """Sum over leaves of the bytes one device holds (shard shape x itemsize)."""
    return float(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                     for x in jax.tree.leaves(tree)))


def abstract_batch(config, mesh):
    """The batch train_step receives: int32 [B, S] fields and float32 weights, P('data', 'seq')."""
    shape = (config.global_batch_size, config.seq_len)
    return {f: _on_mesh(jax.ShapeDtypeStruct(shape, jnp.float32 if f == "weights" else jnp.int32),
                        mesh, jax.P("data", "seq")) for f in FIELDS}


def run_mesh(run: Run, devices=None):
    """The run's ('data', 'seq') mesh over `devices`, else the first run.devices (fake) ones."""
    return parallel.make_mesh(run.data, run.seq, devices=devices or jax.devices()[:run.devices])


def state_as_built(config, run: Run, resolved) -> dict:
    """Bytes per device of parameters and optimizer state as the code shards them today."""
    mesh = run_mesh(run)
    state, *_ = abstract_train_state(config, mesh, resolved)
    return {"parameters": bytes_per_device(state["params"]),
            "optimizer_state": bytes_per_device(state["opt_state"])}


def compiled_memory(config, run: Run, resolved, devices=None) -> dict:
    """XLA's memory_analysis() of the train step compiled for `devices` (TPU topology devices),
    else for run.devices fake CPU devices. Bytes per device; host_* where the program keeps
    values in host memory (remat offload)."""
    figures, _ = compile_train_step(config, run, resolved, devices)
    return figures


def compile_train_step(config, run: Run, resolved, devices=None):
    """(figures, compiled): compiled_memory's figures and the jax Compiled (its .as_text() is the
    optimized HLO)."""

    start = time.perf_counter()
    try:  # multi-slice: the mesh's data axis must span the slices
        mesh = run_mesh(run, devices)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    state, program = abstract_train_state(config, mesh, resolved)
    jitted = step_lib.jit_train_step(config, program, state, mesh.devices.flat[0].platform)
    with jax.set_mesh(mesh):
        step_start = time.perf_counter()
        lowered = jitted.lower(state, abstract_batch(config, mesh))
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if mesh.devices.flat[0].platform != "tpu":
                raise
            raise refusal(e) from None
        step_compile_s = time.perf_counter() - step_start
        stats = compiled.memory_analysis()
    figures = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in
               ("argument", "output", "alias", "temp", "generated_code")}
    figures["total"] = (figures["argument"] + figures["output"] - figures["alias"]
                        + figures["temp"])
    host = {k: int(getattr(stats, f"host_{k}_size_in_bytes", 0) or 0) for k in
            ("argument", "output", "alias", "temp")}
    figures["host_total"] = host["argument"] + host["output"] - host["alias"] + host["temp"]
    figures["host_temp"] = host["temp"]
    figures["compile_s"] = time.perf_counter() - start  # state, optimizer init and the step
    figures["step_compile_s"] = step_compile_s  # the train step's lower + compile alone
    text = compiled.as_text()
    figures["hlo_lines"] = text.count("\n")  # program size, after optimisation
    # each collective's bytes as the program is written (a ring loop's hop once: one step's)
    figures["collective_bytes"] = collective_bytes(text)
    figures["platform"] = mesh.devices.flat[0].platform
    if figures["platform"] == "tpu":
        figures["transfers"] = summary(loop_overlaps(text))
    return figures, compiled


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
