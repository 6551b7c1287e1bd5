"""Fakes 8 CPU devices before JAX starts (pyproject.toml puts the repository root on the path).

The tests compile hundreds of small programs and run each a few times: LLVM's optimisation of
the CPU code is most of the compile time and buys nothing at these sizes, so it is off
(FAST_COMPILE), here and in every train.py the tests start (tests/train_runs.py). It changes
how fast the code runs, not what it computes."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {FAST_COMPILE}"
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)

assert jax.device_count() == 8, f"conftest expected 8 fake CPU devices, got {jax.devices()}"
