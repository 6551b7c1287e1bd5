"""The accelerators the planner and `parallel.strategy='auto'` know: peak FLOP/s (flops.py),
memory, and the network figures of parallel/strategy_cost.py. Nominal vendor figures; where a
figure is assumed, its note says so.

Network: `link_bytes_per_s` is one ring hop (one link, one direction); `collective_bytes_per_s`
what one device drives into an all-gather, reduce-scatter or all-to-all (on a GPU the NVLink
aggregate through the switch, as for a hop; on a TPU torus, assumed half its links, since a
collective spreads over the torus but all-to-all traffic crosses its bisection); `latency_s`
the fixed cost of one hop or collective, kernel launch included (assumed).
"""

from __future__ import annotations

import dataclasses

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator: peak from training/flops.py, the rest nominal vendor figures."""

    title: str
    flops_key: str  # device_kind substring looked up in training.flops.PEAK_FLOPS
    memory_bytes: float  # HBM capacity, nominal decimal GB
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # one ring hop: bytes/s from a device to its neighbour, one direction
    link_note: str
    chips_per_host: int  # processes = devices / chips_per_host (one process per host)
    collective_bytes_per_s: float = 0.0  # a device's share of a collective (0: one link's)
    latency_s: float = 10e-6

    @property
    def platform(self) -> str:
        """Its jax backend: what kernel='auto' picks there, and the kernel's tile rules."""
        if self.flops_key == "cpu":
            return "cpu"
        return "tpu" if self.flops_key.startswith("tpu") else "gpu"

    @property
    def collective_rate(self) -> float:
        return self.collective_bytes_per_s or self.link_bytes_per_s


DEVICES = {
    "a100-80gb": Device("A100 80GB", "a100", 80 * GB, 2.0e12, 300 * GB,
                        "NVLink 3: 300 GB/s per direction", 8),
    "h100-80gb": Device("H100 80GB", "h100", 80 * GB, 3.35e12, 450 * GB,
                        "NVLink 4: 450 GB/s per direction", 8),
    "h200": Device("H200", "h200", 141 * GB, 4.8e12, 450 * GB,
                   "NVLink 4: 450 GB/s per direction", 8),
    "tpu-v4": Device("TPU v4", "tpu v4", 32 * GB, 1.2e12, 50 * GB,
                     "ICI: ~50 GB/s per link per direction, the ring using one link per hop "
                     "(assumed), collectives 3 of the 6 links (assumed)", 4,
                     collective_bytes_per_s=150 * GB, latency_s=5e-6),
    "tpu-v5e": Device("TPU v5e", "tpu v5e", 16 * GB, 0.82e12, 50 * GB,
                      "ICI: ~50 GB/s per link per direction (1,600 Gbit/s per chip over 4 "
                      "links; assumed), collectives 2 of the 4 links (assumed)", 4,
                      collective_bytes_per_s=100 * GB, latency_s=5e-6),
    "tpu-v5p": Device("TPU v5p", "tpu v5p", 95 * GB, 2.76e12, 100 * GB,
                      "ICI: ~100 GB/s per link per direction (4,800 Gbit/s per chip over 6 "
                      "links; assumed), collectives 3 of the 6 links (assumed)", 4,
                      collective_bytes_per_s=300 * GB, latency_s=5e-6),
    "cpu": Device("CPU (fake device)", "cpu", 0.0, 20 * GB, 10 * GB,  # memory: host / devices
                  "nominal 10 GB/s between fake devices", 1 << 30, latency_s=50e-6),
}


def device_for_kind(device_kind: str) -> Device:
    """The table's entry whose flops_key is in jax's `device_kind` (e.g. 'TPU v5p',
    'NVIDIA H100 80GB HBM3'); the cpu entry when none is (an unknown accelerator)."""
    kind = device_kind.lower()
    for device in DEVICES.values():
        if device.flops_key != "cpu" and device.flops_key in kind:
            return device
    return DEVICES["cpu"]
