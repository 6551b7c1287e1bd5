"""TPU slices by the names Cloud TPU sells them under, as the TPU compiler's topologies.

    slice_for("v4-32")        -> TpuSlice('v4-32', 'v4:2x2x4', chips 16, megacore)
    slice_for("v5litepod-16") -> TpuSlice('v5litepod-16', 'v5e:4x4', chips 16)
    slice_for(None, "tpu-v4", 16) -> the same v4-32: the slice a config's device and mesh imply

A v4 or v5p slice is named by its TensorCores (two per chip, fused into one 'megacore' device),
a v5e or v6e slice by its chips (one core each). The chips form a 3-D torus (v4, v5p; hosts of
2x2x1 chips) or a 2-D one (v5e, v6e; hosts of 2x2); the shape is the most cubic one of the
chip count, the shape Cloud TPU gives a slice of that size unless asked for another.

`devices(tpu_slice)` returns the slice's devices from libtpu's topology description: no TPU is
needed, only the libtpu package (the test extra); a mesh over them and jax.jit(...).lower(...)
.compile() run XLA:TPU and Mosaic for real (training/analysis/aot.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re


@dataclasses.dataclass(frozen=True)
class Generation:
    device: str  # key of planner.DEVICES
    prefix: str  # the accelerator type's prefix: v4-32, v5litepod-16
    topology_prefix: str  # libtpu's: v4:2x2x4
    cores_per_chip: int  # cores the slice name counts per chip
    dims: int  # torus dimensions
    megacore: bool  # one device per chip (two cores fused)


GENERATIONS = (
    Generation("tpu-v4", "v4", "v4", 2, 3, True),
    Generation("tpu-v5p", "v5p", "v5p", 2, 3, True),
    Generation("tpu-v5e", "v5litepod", "v5e", 1, 2, False),
    Generation("tpu-v6e", "v6e", "v6e", 1, 2, False),
)


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    name: str  # the accelerator type: v4-32
    generation: Generation
    shape: tuple[int, ...]  # chips along each torus axis
    num_slices: int = 1  # slices joined over the data-centre network (multi-slice)

    @property
    def chips(self) -> int:
        """Chips in all slices: the devices a mesh spans."""
        return math.prod(self.shape) * self.num_slices

    @property
    def topology(self) -> str:
        return f"{self.generation.topology_prefix}:{'x'.join(map(str, self.shape))}"

    @property
    def device(self) -> str:
        return self.generation.device

    def label(self) -> str:
        return self.name + (f" x {self.num_slices} slices" if self.num_slices > 1 else "")


class TopologyError(ValueError):
    """A slice name or chip count the table cannot place: one line, with the fix."""


def slice_for(name: str | None, device: str | None = None, chips: int | None = None,
              num_slices: int = 1, flag: str = "--topology") -> TpuSlice:
    """The slice called `name` (an accelerator type, e.g. v4-32), or, with name None, the
    single-generation slice of `device` with `chips` chips in all `num_slices` slices. `flag`:
    the option that gave the name, as errors call it."""
    if name is None:
        gens = [g for g in GENERATIONS if g.device == device]
        if not gens:
            tpus = ", ".join(g.device for g in GENERATIONS)
            raise TopologyError(f"device {device!r} is not a TPU: give {flag} (e.g. v4-32) "
                                f"or a TPU device ({tpus})")
        if not chips or chips % num_slices:
            raise TopologyError(f"{chips} devices do not split into {num_slices} equal slices: "
                                f"make the mesh a multiple of num_slices")
        gen = gens[0]
        name = f"{gen.prefix}-{chips // num_slices * gen.cores_per_chip}"
    match = re.fullmatch(r"(v4|v5p|v5litepod|v6e)-(\d+)", name)
    if not match:
        known = ", ".join(f"{g.prefix}-N" for g in GENERATIONS)
        raise TopologyError(f"{flag}={name!r} is not a TPU slice name: use one of {known} "
                            f"(e.g. v4-32)")
    gen = next(g for g in GENERATIONS if g.prefix == match.group(1))
    cores = int(match.group(2))
    chips_per_slice, rest = divmod(cores, gen.cores_per_chip)
    shape = _torus(chips_per_slice, gen.dims) if not rest else None
    if shape is None:
        sizes = "at least 4 for 3-D tori" if gen.dims == 3 else "at least 4, or 1"
        raise TopologyError(f"{flag}={name}: {cores} cores is not a {gen.prefix} slice "
                            f"(chips a power of two, {sizes})")
    return TpuSlice(name, gen, shape, num_slices)


def _torus(chips: int, dims: int) -> tuple[int, ...] | None:
    """The most cubic power-of-two shape of `chips` over `dims` axes, as Cloud TPU writes it
    (v4-32: 2x2x4, v4-64: 2x4x4; v5litepod-8: 2x4; a single v5e or v6e chip, v5litepod-1: 1x1)."""
    if chips == 1 and dims == 2:
        return (1, 1)
    if chips < 4 or chips & (chips - 1):
        return None
    shape = [2, 2] + [1] * (dims - 2)
    while math.prod(shape) < chips:
        axis = min(range(dims), key=lambda a: (shape[a], -a))  # ties: the later axis
        shape[axis] *= 2
    return tuple(shape)


def devices(tpu_slice: TpuSlice) -> list:
    """The slice's TPU devices from libtpu's topology description (no TPU attached)."""

    # Off a TPU VM there is no metadata server to ask for the slice, and libtpu would print
    # warnings about it: name the slice and this host. Only this process's compile reads them
    # (its platform is the CPU: training.cli.use_fake_devices).
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", tpu_slice.name)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # libtpu takes a machine-wide lock for the chips it would drive; a compile drives none, so
    # two compiles (two test workers) may run at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies  # loads libtpu: only for a TPU compile
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=tpu_slice.topology,
            chips_per_host_bounds=(1, 1, 1) if tpu_slice.shape == (1, 1) else (2, 2, 1),
            num_slices=tpu_slice.num_slices,
            **({"chip_config_name": "megacore"} if tpu_slice.generation.megacore else {}))
    except RuntimeError as e:
        if "not installed" in str(e):
            raise TopologyError("the TPU compiler is not installed: pip install -c "
                                "constraints.txt -e '.[tpu]' (it brings libtpu; make test's "
                                "install has it too)") from None
        raise TopologyError(f"libtpu refused topology {tpu_slice.topology}: "
                            f"{str(e).splitlines()[0]}") from None
    return list(desc.devices)

