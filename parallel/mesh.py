"""The device mesh: ('data', 'seq').

'data' shards the batch (data parallelism, and FSDP for parameters later); 'seq' shards the
sequence, and the attention ring runs along it. Axes are Auto (GSPMD-style propagation): the
sequence-parallel kernel runs inside `jax.shard_map`, and the rest of the model is annotated with
shardings rather than typed with them.
"""

from __future__ import annotations

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

DATA, SEQ = "data", "seq"


def mesh_shape(data: int, seq: int, count: int) -> tuple[int, int]:
    """(data, seq) for `count` devices: at most one of them -1, filled with the remaining
    devices (both -1: data 1). ValueError, one line, when the sizes do not match the count.

    Example: mesh_shape(2, -1, 8) -> (2, 4).
    """
    if data == -1 and seq == -1:
        data = 1
    if data == -1 or seq == -1:
        known = seq if data == -1 else data
        if known < 1 or count % known:
            raise ValueError(
                f"mesh: {known} does not divide the {count} devices: "
                f"choose mesh.data x mesh.seq = {count}")
        data, seq = (count // known, seq) if data == -1 else (data, count // known)
    if data < 1 or seq < 1 or data * seq != count:
        raise ValueError(
            f"mesh: data {data} x seq {seq} = {data * seq} does not match the {count} devices: "
            f"choose sizes whose product is {count} (or -1 for one of them)")
    return data, seq


def make_mesh(data: int = -1, seq: int = -1, *, devices=None) -> Mesh:
    """A ('data', 'seq') mesh over all devices (or `devices`), sized by `mesh_shape`.

    Example with 8 devices: make_mesh(2, -1) -> data 2 x seq 4.
    """
    devices = list(jax.devices() if devices is None else devices)
    data, seq = mesh_shape(data, seq, len(devices))
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices > 1:
        return _multi_slice_mesh(data, seq, devices, slices)
    return jax.make_mesh((data, seq), (DATA, SEQ), axis_types=(AxisType.Auto, AxisType.Auto),
                         devices=devices)


def check_slices(data: int, slices: int, count: int) -> None:
    """ValueError unless the mesh's data axis spans `slices` slices of `count` devices in all."""
    if data % slices:
        raise ValueError(f"mesh: data {data} is not a multiple of the {slices} slices: the "
                         f"sequence ring stays inside a slice, so choose mesh.data = a multiple "
                         f"of {slices} (mesh.seq at most {count // slices})")


def _multi_slice_mesh(data: int, seq: int, devices, slices: int) -> Mesh:
    """TPU slices joined over the data-centre network: 'data' spans the slices, and each
    'seq' ring stays inside one slice, on its chip-to-chip links (a ring hop over the
    data-centre network would be an order of magnitude slower)."""
    check_slices(data, slices, len(devices))
    grid = mesh_utils.create_hybrid_device_mesh((data // slices, seq), (slices, 1), devices)
    return Mesh(grid, (DATA, SEQ), axis_types=(AxisType.Auto, AxisType.Auto))
