"""The public API of parallel/, pinned: signatures, registries, and the seam a new kernel or
strategy plugs into (one file, one registry entry)."""

import inspect

import jax
import numpy as np
import pytest

import parallel
from parallel import kernels, strategies
from parallel.kernels.xla import XlaKernel
from parallel.strategies.ring import Ring
from tests.support import dense_reference as ref

ATTENTION_PARAMETERS = ["q", "k", "v", "mesh", "layout", "segment_ids", "order", "causal",
                        "strategy", "kernel", "tile_q", "tile_k", "scale", "ulysses_degree",
                        "window", "sinks", "logit_soft_cap"]
ATTENTION_DEFAULTS = {"segment_ids": None, "order": None, "causal": True, "strategy": "ring",
                      "kernel": "auto",
                      "tile_q": None, "tile_k": None, "scale": None, "ulysses_degree": None,
                      "window": None, "sinks": None, "logit_soft_cap": None}


@pytest.mark.parametrize("fn", [parallel.attention, parallel.attention_with_stats])
def test_attention_signature(fn):
    params = inspect.signature(fn).parameters
    assert list(params) == ATTENTION_PARAMETERS
    keyword_only = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY]
    assert keyword_only == ATTENTION_PARAMETERS[3:]
    assert {n: p.default for n, p in params.items() if p.default is not p.empty} == \
        ATTENTION_DEFAULTS


def test_layout_and_mesh_signatures():
    for fn in (parallel.permutation, parallel.inverse_permutation):
        params = inspect.signature(fn).parameters
        assert list(params) == ["layout", "seq_len", "num_shards", "segment_ids", "tile"]
        assert [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY] == ["segment_ids",
                                                                                "tile"]
    params = inspect.signature(parallel.make_mesh).parameters
    assert list(params) == ["data", "seq", "devices"]
    assert params["devices"].kind == inspect.Parameter.KEYWORD_ONLY


def test_registries():
    assert list(parallel.LAYOUTS) == ["ring", "striped", "zigzag", "balanced"]
    assert list(parallel.STRATEGIES) == ["ring", "allgather", "ulysses", "usp"]
    assert list(parallel.KERNELS) == ["xla", "pallas_gpu", "pallas_tpu"]
    assert parallel.resolve_kernel("auto", "cpu").name == "xla"  # no fused kernel for CPUs
    assert parallel.resolve_kernel("auto", "gpu").name == "pallas_gpu"
    assert parallel.resolve_kernel("auto", "tpu").name == "pallas_tpu"
    assert parallel.resolve_kernel("pallas_gpu", "cpu").name == "pallas_gpu"  # interpreted
    assert parallel.resolve_kernel("pallas_tpu", "cpu").name == "pallas_tpu"  # interpreted


def test_kernel_choice_errors():
    with pytest.raises(ValueError, match="unknown attention kernel 'flash': choose auto or one of"):
        parallel.resolve_kernel("flash", "cpu")
    with pytest.raises(ValueError, match="kernel 'xla' cannot run on metal"):
        parallel.resolve_kernel("xla", "metal")
    with pytest.raises(ValueError, match="kernel 'pallas_gpu' cannot run on tpu: it runs on gpu"):
        parallel.resolve_kernel("pallas_gpu", "tpu")
    with pytest.raises(ValueError, match="kernel 'pallas_tpu' cannot run on gpu: it runs on tpu"):
        parallel.resolve_kernel("pallas_tpu", "gpu")
    with pytest.raises(ValueError, match="unknown attention strategy 'mesh': choose one of ring"):
        parallel.get_strategy("mesh")


class CountingKernel(XlaKernel):
    """A 'new kernel' for the seam test: the xla kernel, recording how often it is traced."""

    name = "counting"
    traced = 0

    def forward(self, *args):
        CountingKernel.traced += 1
        return super().forward(*args)


class ReverseRing(Ring):
    """A 'new strategy' for the seam test: the ring, registered under another name."""

    name = "reverse_ring"


def test_a_new_kernel_and_strategy_are_one_registry_entry_each(monkeypatch):
    monkeypatch.setitem(kernels.KERNELS, "counting", CountingKernel())
    monkeypatch.setitem(strategies.STRATEGIES, "reverse_ring", ReverseRing())
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 32, 2, 8)).astype(np.float32) for _ in range(3))
    mesh = parallel.make_mesh(1, 4, devices=jax.devices()[:4])
    perm = parallel.permutation("zigzag", 32, 4)
    out = parallel.attention(q[:, perm], k[:, perm], v[:, perm], mesh=mesh, layout="zigzag",
                             strategy="reverse_ring", kernel="counting")
    assert CountingKernel.traced >= 1
    natural = np.asarray(out)[:, parallel.inverse_permutation("zigzag", 32, 4)]
    assert ref.relative_error(natural, ref.attention(q, k, v)) < 1e-5
