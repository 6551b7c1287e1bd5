"""Fakes 8 CPU devices before JAX starts, and puts the repository root on sys.path."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402  (must come after XLA_FLAGS)

assert jax.device_count() == 8, f"conftest expected 8 fake CPU devices, got {jax.devices()}"
