"""The model gives the same loss and gradients with every layout and mesh as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model
import parallel
from training import step as step_lib
from tests.support.model_cases import (assert_as_one_device, attention, loss_and_grads, MIXED,
                                       natural_batch, SIZES)


@pytest.fixture(scope="module")
def single_device():
    return loss_and_grads("ring", 1, 1)


@pytest.mark.parametrize("layout,data,seq,strategy", [
    ("ring", 1, 4, "ring"), ("striped", 1, 4, "ring"), ("zigzag", 1, 4, "ring"),
    ("striped", 2, 4, "ring"), ("balanced", 2, 4, "ring"), ("zigzag", 2, 4, "allgather")])
def test_same_loss_and_gradients_as_one_device(single_device, layout, data, seq, strategy):
    want_loss, want_grads, _ = single_device
    loss, grads, _ = loss_and_grads(layout, data, seq, strategy)
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    errors = jax.tree.map(lambda g, w: np.abs(g - w).max() / np.abs(w).max(), grads, want_grads)
    assert max(jax.tree.leaves(errors)) < 1e-4


@pytest.fixture(scope="module")
def single_device_mixed():
    return loss_and_grads("ring", 1, 1, **MIXED)


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,data,seq,overrides", [  # (every layout: test_init_from.py)
    ("zigzag", 1, 4, dict(scan_layers=True)), ("balanced", 2, 4, dict(loss_chunk=4))])
def test_local_and_global_layers_with_every_option_as_one_device(single_device_mixed, layout,
                                                                 data, seq, overrides):
    loss, grads, _ = loss_and_grads(layout, data, seq, **MIXED, **overrides)
    assert_as_one_device(loss, grads, single_device_mixed, overrides.get("scan_layers", False))


def test_parameters_are_sharded_over_the_whole_mesh():
    _, _, params = loss_and_grads("striped", 2, 4)
    kernel = params["blocks"][0]["attention"]["q"]["kernel"][...]
    assert kernel.sharding.spec[0] == ("data", "seq")
    assert kernel.addressable_shards[0].data.shape == (SIZES["d_model"] // 8, 32)


def test_rope_uses_original_positions():
    """Shifting every position by a constant leaves attention scores unchanged (relative
    positions), while a layout permutation without its positions would change them."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((1, 8, 2, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 8, 2, 16)), jnp.float32)
    pos = jnp.arange(8)[None]
    scores = lambda p: jnp.einsum("bqhd,bkhd->bhqk", model.layers.rope(q, p, 1e4),
                                  model.layers.rope(k, p, 1e4))
    np.testing.assert_allclose(scores(pos), scores(pos + 37), atol=1e-4)
    assert not np.allclose(scores(pos), scores(pos[:, ::-1]), atol=1e-2)


def test_bfloat16_compute_keeps_float32_parameters():
    mesh = parallel.make_mesh(1, 4, devices=jax.devices()[:4])
    cfg = model.ModelConfig(dtype="bfloat16", remat=True, **SIZES)
    net = model.create(cfg, mesh, seed=0, choice=attention("striped"))
    graphdef, params = nnx.split(net, nnx.Param)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    batch = {k: jnp.asarray(v) for k, v in natural_batch().items()}
    with jax.set_mesh(mesh):
        total, weight = jax.jit(lambda p, b: step_lib.token_loss_sums(graphdef, p, b, True))(
            params, batch)
    assert np.isfinite(float(total)) and abs(float(total / weight) - np.log(64)) < 1.0
