"""The shape of a planned run: its mesh, rows per device, processes, and what each host builds."""

from __future__ import annotations

import dataclasses
import math

import parallel
from planner.devices import Device


@dataclasses.dataclass(frozen=True)
class Run:
    """The sizes the formulas need, resolved from the config and the device count."""

    devices: int
    data: int
    seq: int  # N, the ring
    seq_len: int
    global_batch: int
    accum: int
    layout: str

    @property
    def block(self) -> int:  # n: tokens of one sequence per device
        return self.seq_len // self.seq

    @property
    def rows(self) -> int:  # b: sequences per device in one micro-step
        return self.global_batch // self.data // self.accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


class DeviceCountError(ValueError):
    """The devices a job will have are not the devices its config's mesh names."""


def device_count(config, device_name: str, given: int) -> int:
    """mesh.data x mesh.seq when both are set; else --devices, else 8 (cpu: cpu_devices).
    DeviceCountError where both are set and --devices is another count: a launcher passes the
    job's devices, and train.py would stop on them after the job had waited in the queue."""
    if config.mesh.data > 0 and config.mesh.seq > 0:
        mesh = config.mesh.data * config.mesh.seq
        if given and given != mesh:
            fix = (f"--config.mesh.data={given // config.mesh.seq}" if given % config.mesh.seq == 0
                   else "--config.mesh.data=-1 with a ring that divides it")
            raise DeviceCountError(
                f"the job has {given} devices but the config's mesh is data {config.mesh.data} x "
                f"seq {config.mesh.seq} = {mesh} devices: ask for {mesh} devices, or set the mesh "
                f"for {given} ({fix})")
        return mesh
    if given:
        return given
    return config.cpu_devices if device_name == "cpu" else 8


def make_run(config, devices: int, mesh_shape=None) -> Run:
    """The run of `config` on `devices` devices, on its mesh (or on `mesh_shape`, (data, seq),
    the mesh a caller built)."""
    data, seq = mesh_shape or parallel.mesh_shape(config.mesh.data, config.mesh.seq, devices)
    return Run(devices=devices, data=data, seq=seq, seq_len=config.seq_len,
               global_batch=config.global_batch_size, accum=config.optim.grad_accum_steps,
               layout=configured_layout(config))


def configured_layout(config) -> str:
    """config.parallel.layout; for 'auto', the natural order standing in until the planner
    has chosen (what the memory switches are priced with)."""
    layout = config.parallel.layout
    return parallel.layouts.BASELINE if layout == parallel.choice.AUTO else layout


def process_count(device: Device, devices: int) -> int:
    """One process per host: GPUs 8 per host, TPU v4/v5p/v5e 4 chips per host (assumed)."""
    return max(1, math.ceil(devices / device.chips_per_host))


def process_block(run: Run, processes: int) -> tuple[int, int]:
    """(rows, columns) of each global batch one process builds (data/pipeline.local_block),
    with a host's devices consecutive on the mesh, 'seq' fastest: a host smaller than the ring
    holds a slice of each of its rows' columns; a larger one, whole rows."""
    per_host = max(1, run.devices // processes)
    rows = run.global_batch // run.data
    if per_host <= run.seq:
        return rows, run.seq_len * per_host // run.seq
    return rows * (per_host // run.seq), run.seq_len
