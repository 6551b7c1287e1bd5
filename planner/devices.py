"""The accelerators the planner and `parallel.strategy='auto'` know: peak FLOP/s (flops.py),
memory, the network figures of parallel/strategy_cost.py, and what runs really reach of them.
Nominal vendor figures; where a figure is assumed, its note says so.

Calibration (`Calibration`): the share of peak the matmuls and the attention kernel reach, a
ring step's fixed cost, the share of its transfer that does not hide behind compute and an
attention tile's fixed cost (paid as the platform's kernel declares: parallel/strategy_cost.py).
Fitted to published step times (planner/calibration/step_times/*.toml, with their sources) by
scripts/calibrate.py, whose output the constants below are copied from, or measured on the
machine at hand by scripts/calibrate.py --measure, which writes
planner/calibration/tables/<device>.json (read here, at import); a device with neither keeps the
nominal model (every share 1, perfect overlap, free tiles) and the planner says it is
uncalibrated.

Network: `link_bytes_per_s` is one ring hop (one link, one direction); `collective_bytes_per_s`
what one device drives into an all-gather, reduce-scatter or all-to-all (on a GPU the NVLink
aggregate through the switch, as for a hop; on a TPU torus, assumed half its links, since a
collective spreads over the torus but all-to-all traffic crosses its bisection); `latency_s`
the fixed cost of one hop or collective, kernel launch included (assumed).
"""

from __future__ import annotations

import dataclasses
import json
import os

GB = 1e9
# Calibrations measured on a machine (scripts/calibrate.py --measure): DIR/<device key>.json
# replaces that device's calibration. The repository's holds the CPU measured where it was
# developed; RINGSTRIPE_CALIBRATIONS names another directory (a user's own machine).
CALIBRATIONS = os.environ.get("RINGSTRIPE_CALIBRATIONS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "calibration", "tables")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a run reaches of the nominal figures (see the module docstring)."""

    matmul_efficiency: float = 1.0  # dense matmuls: share of peak FLOP/s
    attention_efficiency: float = 1.0  # the attention kernel's tiles: share of peak FLOP/s
    ring_step_s: float = 0.0  # fixed cost of one ring step or collective (with the latency)
    hop_exposed: float = 0.0  # share of a hop's transfer that never hides behind compute
    tile_overhead_s: float = 0.0  # fixed cost of one attention tile (loop step, slicing)
    source: str = ""  # the published measurements fitted ('' = nominal, uncalibrated)


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator: peak from planner/flops.py, the rest nominal vendor figures."""

    title: str
    flops_key: str  # device_kind substring looked up in planner.flops.PEAK_FLOPS
    memory_bytes: float  # HBM capacity, nominal decimal GB
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # one ring hop: bytes/s from a device to its neighbour, one direction
    link_note: str
    chips_per_host: int  # processes = devices / chips_per_host (one process per host)
    collective_bytes_per_s: float = 0.0  # a device's share of a collective (0: one link's)
    latency_s: float = 10e-6
    kinds: tuple[str, ...] = ()  # substrings of jax's device_kind (lower case) that name it
    calibration: Calibration = Calibration()

    @property
    def platform(self) -> str:
        """Its jax backend: what kernel='auto' picks there, and the kernel's tile rules."""
        if self.flops_key == "cpu":
            return "cpu"
        return "tpu" if self.flops_key.startswith("tpu") else "gpu"

    @property
    def collective_rate(self) -> float:
        return self.collective_bytes_per_s or self.link_bytes_per_s


# `python scripts/calibrate.py --fit`: MaxText's llama3-8b context-parallel step times on 64
# chips (configs/tpu/llama3_8b_v5p.py), fitted at 64k and 256k with the zigzag layout; the 128k
# column, the whole contiguous-layout table and the llama2-7b recipe (configs/tpu/llama2_7b_v5p.py)
# are held out. Rounded from the fit's matmul 1.0 (at its bound: at 1-4k tokens a chip the
# FSDP traffic, not the matmuls, bounds the dense part, so these points do not pin it down),
# attention 0.500, ring step 74.2 us, exposed 0.349, tile 0.257 us (a grid step of one row and
# head: the Pallas TPU grid pays it on every tile of a block pair, masked ones too).
V5P_CALIBRATION = Calibration(matmul_efficiency=1.0, attention_efficiency=0.5, ring_step_s=74e-6,
                              hop_exposed=0.35, tile_overhead_s=0.26e-6,
                              source="MaxText llama3-8b, 64 v5p chips, "
                              "planner/calibration/step_times/llama3_8b_v5p.toml")

DEVICES = {
    "a100-80gb": Device("A100 80GB", "a100", 80 * GB, 2.0e12, 300 * GB,
                        "NVLink 3: 300 GB/s per direction", 8),
    "h100-80gb": Device("H100 80GB", "h100", 80 * GB, 3.35e12, 450 * GB,
                        "NVLink 4: 450 GB/s per direction", 8),
    "h200": Device("H200", "h200", 141 * GB, 4.8e12, 450 * GB,
                   "NVLink 4: 450 GB/s per direction", 8),
    "b200": Device("B200", "b200", 180 * GB, 8.0e12, 900 * GB,
                   "NVLink 5: 900 GB/s per direction (1.8 TB/s bidirectional)", 8),
    "tpu-v4": Device("TPU v4", "tpu v4", 32 * GB, 1.2e12, 50 * GB,
                     "ICI: ~50 GB/s per link per direction, the ring using one link per hop "
                     "(assumed), collectives 3 of the 6 links (assumed)", 4,
                     collective_bytes_per_s=150 * GB, latency_s=5e-6, kinds=("tpu v4",)),
    "tpu-v5e": Device("TPU v5e", "tpu v5e", 16 * GB, 0.82e12, 50 * GB,
                      "ICI: ~50 GB/s per link per direction (1,600 Gbit/s per chip over 4 "
                      "links; assumed), collectives 2 of the 4 links (assumed)", 4,
                      collective_bytes_per_s=100 * GB, latency_s=5e-6,
                      kinds=("tpu v5 lite", "tpu v5e")),
    "tpu-v5p": Device("TPU v5p", "tpu v5p", 95 * GB, 2.76e12, 100 * GB,
                      "ICI: ~100 GB/s per link per direction (4,800 Gbit/s per chip over 6 "
                      "links; assumed), collectives 3 of the 6 links (assumed)", 4,
                      collective_bytes_per_s=300 * GB, latency_s=5e-6,
                      kinds=("tpu v5p", "tpu v5"), calibration=V5P_CALIBRATION),
    "tpu-v6e": Device("TPU v6e", "tpu v6e", 32 * GB, 1.64e12, 112 * GB,
                      "ICI: ~112 GB/s per link per direction (3,584 Gbit/s per chip over 4 "
                      "links; assumed), collectives 2 of the 4 links (assumed)", 4,
                      collective_bytes_per_s=224 * GB, latency_s=5e-6,
                      kinds=("tpu v6 lite", "tpu v6e")),
    "cpu": Device("CPU (fake device)", "cpu", 0.0, 20 * GB, 10 * GB,  # memory: host / devices
                  "nominal 10 GB/s between fake devices", 1 << 30, latency_s=50e-6),
}


def calibration_file(key: str) -> str:
    """Where the measured calibration of DEVICES[key] lives."""
    return os.path.join(CALIBRATIONS, f"{key}.json")


def measured_calibration(key: str) -> Calibration | None:
    """The calibration scripts/calibrate.py --measure wrote for DEVICES[key], or None."""
    try:
        with open(calibration_file(key)) as f:
            return Calibration(**json.load(f)["calibration"])
    except FileNotFoundError:
        return None


DEVICES = {key: dataclasses.replace(device, calibration=measured)
           if (measured := measured_calibration(key)) else device
           for key, device in DEVICES.items()}


def on_host(device: Device, devices: int) -> Device:
    """`device` as `devices` of them see it on this host: fake CPU devices share the host's
    memory, so each has its share of it; an accelerator has its own."""
    if device.flops_key != "cpu":
        return device
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return dataclasses.replace(device, memory_bytes=host / devices)


def device_for_kind(device_kind: str) -> Device:
    """The table's entry one of whose `kinds` (else its flops_key) is in jax's `device_kind`
    (e.g. 'TPU v5' for a v5p, 'TPU v5 lite' for a v5e, 'NVIDIA H100 80GB HBM3'); the cpu entry
    when none is (an unknown accelerator). v5e is listed before v5p: 'tpu v5' is in both."""
    kind = device_kind.lower()
    for device in DEVICES.values():
        if any(name in kind for name in device.kinds or (device.flops_key,)) \
                and device.flops_key != "cpu":
            return device
    return DEVICES["cpu"]
