"""A run's plan on this machine, as scripts/plan.py prints it and every launcher checks it before
it pays for anything: the device and device count it is for (a TPU slice for the TPU compiler),
the planner's analytic figures, the state as built, the compile, and the verdict.

    target = plan_target(config, "configs/tiny.py", device="h100-80gb", devices=16)
    planned = plan_run(config, target)            # fake CPU devices set up first
    fit_verdict(planned)   # 'check: 1.20 GB per device (...), FITS (the planner's estimate)'

A mistake in the request (an unknown device, a device count the mesh does not have, a topology
that is no TPU slice) is a PlanInputError, one line (exit 2 for the commands); a step the TPU
compiler refuses a CompileRefused, and one that does not fit the device a DoesNotFit (exit 1).
The launchers call this in their own process (launch/preflight.py), which has not started JAX:
plan_target sets up the fake CPU devices the compile runs on before anything starts it.
"""

from __future__ import annotations

import dataclasses
import os

from training.analysis.aot import CompileRefused  # noqa: F401  (re-exported: the check's refusal)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PlanInputError(ValueError):
    """The plan's request names no device, slice or device count the run can have: one line."""


class DoesNotFit(Exception):
    """The train step needs more memory than the device has: one line, exit code 1."""


@dataclasses.dataclass(frozen=True)
class PlanTarget:
    """What a run is planned for: a planner device (planner.DEVICES), how many, and for the TPU
    compiler the slice (planner.topology.TpuSlice; None: compiled, if at all, on fake CPUs)."""

    device: str
    devices: int
    tpu_slice: object = None


@dataclasses.dataclass
class PlannedRun:
    plan: dict
    device: object  # planner.Device
    run: object  # planner.Run
    resolved: object  # planner.ResolvedRun
    tpu_slice: object = None


def config_device(config_file: str) -> str:
    """The config file's module-level DEVICE (read, not run), else 'cpu'."""
    from planner.reports.plan import module_constant
    return module_constant(config_file, "DEVICE") or "cpu"


def plan_target(config, config_file: str, device: str | None = None, devices: int = 0,
                compile: str = "no", topology: str | None = None,
                num_slices: int = 1) -> PlanTarget:
    """The device (default: the config file's DEVICE, else cpu), the device count (the mesh's;
    where it has a -1, `devices`) and, with compile='tpu', the TPU slice (`topology`, else the
    device's slice of that many chips); then `devices` fake CPU devices for the compile on the
    host, before JAX starts. PlanInputError, one line, for a request that cannot be met."""
    from planner import DEVICES
    from planner.run import DeviceCountError, device_count
    from training.cli import use_fake_devices
    name = device or config_device(config_file)
    if name not in DEVICES:
        raise PlanInputError(f"--device={name!r} is not a known device: choose one of "
                             f"{', '.join(DEVICES)}")
    try:
        count = device_count(config, name, devices)
    except DeviceCountError as e:
        raise PlanInputError(str(e)) from None
    target = PlanTarget(name, count)
    if compile == "tpu":
        target = _tpu_target(config, name, count, topology, num_slices, device_given=device)
    use_fake_devices(target.devices)  # the compile check runs on the host, whatever is attached
    return target


def _tpu_target(config, name: str, count: int, topology, num_slices: int,
                device_given) -> PlanTarget:
    from parallel.mesh import check_slices, mesh_shape
    from planner.topology import TopologyError, slice_for
    try:
        tpu_slice = slice_for(topology, name, count, num_slices)
    except TopologyError as e:
        raise PlanInputError(str(e)) from None
    if device_given and device_given != tpu_slice.device:
        raise PlanInputError(f"--device={device_given} but --topology={tpu_slice.name} is a "
                             f"{tpu_slice.device} slice: drop --device")
    try:  # before the tables: the compile that follows them would refuse the mesh
        data, _ = mesh_shape(config.mesh.data, config.mesh.seq, tpu_slice.chips)
        check_slices(data, tpu_slice.num_slices, tpu_slice.chips)
    except ValueError as e:
        raise PlanInputError(str(e)) from None
    return PlanTarget(tpu_slice.device, tpu_slice.chips, tpu_slice)


def plan_run(config, target: PlanTarget, compile: str = "no", efficiency: float = 1.0,
             documents: str | None = None, document_rows: int = 4,
             workdir: str = os.path.join(ROOT, "runs", "plan")) -> PlannedRun:
    """The run validated for the target, planned (every 'auto' resolved as the run resolves
    it), its state as built, and compiled on the host where `compile` says so ('auto': small
    problems only; 'yes'; 'no'; 'tpu': marked pending, compile_for_tpu runs it). Raises the
    config's own one-line errors (ConfigError, DataError, PlanError, TopologyError) and
    CompileRefused."""
    from planner import DEVICES
    from planner.reports import plan as planner_plan
    from planner.run import process_count
    from training.analysis import aot
    from training.validate import validate_config
    device = DEVICES[target.device]
    validate_config(config, target.devices, process_count(device, target.devices),
                    platform=device.platform)
    plan, device, run, resolved = planner_plan.make_plan(
        config, target.device, target.devices, efficiency, documents, document_rows, workdir)
    plan["as_built"] = aot.state_as_built(config, run, resolved)
    plan["today"] = planner_plan.today_scenarios(plan, config, resolved, device, plan["as_built"])
    if target.tpu_slice is not None:
        plan["compiled"] = {"pending": target.tpu_slice.label()}
    else:
        go, why = aot.compile_decision(compile, plan["params"]["total"], run)
        plan["compiled"] = aot.compiled_memory(config, run, resolved) if go else {"status": why}
    return PlannedRun(plan, device, run, resolved, target.tpu_slice)


def compile_for_tpu(planned: PlannedRun, config) -> None:
    """planned.plan['compiled']: the TPU compiler's per-chip figures for the slice (45-150 s
    for a pod config; progress lines on stderr meanwhile)."""
    from data.progress import Ticker
    from planner import topology
    from training.analysis import aot
    label = planned.tpu_slice.label()
    with Ticker(f"plan: the TPU compiler is compiling the train step for {label}",
                "plan: compiled by the TPU compiler"):
        compiled = aot.compiled_memory(config, planned.run, planned.resolved,
                                       topology.devices(planned.tpu_slice))
    compiled.update(topology=label, fits=compiled["total"] <= planned.device.memory_bytes)
    planned.plan["compiled"] = compiled


def fit_verdict(planned: PlannedRun) -> str | None:
    """The check's verdict: DoesNotFit, one line, where the step does not fit the device (the
    TPU compiler's bytes once compile_for_tpu has run, else the planner's); else the planner's
    line 'check: ... FITS' (None for the TPU compiler, whose own lines say it)."""
    device, compiled = planned.device, planned.plan["compiled"]
    if planned.tpu_slice is not None:
        if not compiled["fits"]:
            raise DoesNotFit(
                f"the train step needs {compiled['total'] / 1e9:.2f} GB per chip, a "
                f"{device.title} has {device.memory_bytes / 1e9:.2f} GB "
                f"({planned.tpu_slice.label()}): use remat (model.remat_policy='offload' keeps "
                f"block inputs in host memory), smaller model.loss_chunk/mlp_chunk, a shorter "
                f"seq_len or more chips")
        return None
    fit = planned.plan["fit"]
    need = (f"{fit['total_bytes'] / 1e9:.2f} GB per device ({device.title}: "
            f"{fit['device_bytes'] / 1e9:.2f} GB)")
    if fit["verdict"] == "does not fit":
        raise DoesNotFit(f"the train step needs {need}: use remat (model.remat_policy), smaller "
                         f"model.loss_chunk/mlp_chunk, a shorter seq_len or more devices")
    return f"check: {need}, {fit['verdict'].upper()} (the planner's estimate)"
