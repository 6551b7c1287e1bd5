"""Kernels: the work on one (query block, key block) pair. See base.py for the contract.

    xla         tiles of jnp einsums in while loops; runs everywhere (the reference kernel)
    pallas_gpu  a Pallas kernel with the Triton lowering, fused on GPUs; interpreted on CPUs
    pallas_tpu  Pallas TPU (Mosaic) kernels, fused on TPUs; interpreted on CPUs

`kernel="auto"` takes the backend's fused kernel where one is registered, else `xla`. A new
kernel is one file and one entry in the tuple below.
"""

from __future__ import annotations

from parallel.kernels import pallas_gpu, pallas_tpu, xla
from parallel.kernels.base import Kernel

KERNELS: dict[str, Kernel] = {m.KERNEL.name: m.KERNEL for m in (xla, pallas_gpu, pallas_tpu)}


def resolve_kernel(name: str, platform: str) -> Kernel:
    """The kernel `name` for a jax backend `platform` ('cpu', 'gpu', 'tpu').

    'auto' -> the first fused kernel registered for the platform, else 'xla'. ValueError for an
    unknown name or a kernel that cannot run on this platform.
    """
    if isinstance(name, Kernel):
        return name
    if name == "auto":
        fused = [k for k in KERNELS.values() if platform in k.fused_on]
        return fused[0] if fused else KERNELS["xla"]
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}: choose auto or one of "
                         f"{', '.join(KERNELS)}")
    kernel = KERNELS[name]
    if platform not in kernel.platforms:
        raise ValueError(f"attention kernel {name!r} cannot run on {platform}: it runs on "
                         f"{', '.join(kernel.platforms)}; use kernel='auto' or 'xla'")
    return kernel
