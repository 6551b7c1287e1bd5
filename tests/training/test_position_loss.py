"""The loss by original position (training/evaluation/position_loss.py) is one curve whatever the layout
and the number of devices, and it is the plain per-token cross-entropy of the model's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model
import parallel
from training.evaluation import position_loss
from tests.support.model_cases import attention

SIZES = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)
ROWS, LENGTH, BUCKETS = 2, 64, 4


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(0).integers(0, 64, (ROWS, LENGTH + 1)).astype(np.int32)


def curve(layout, shards, rows, **model_options):
    mesh = parallel.make_mesh(1, shards, devices=jax.devices()[:shards])
    cfg = model.ModelConfig(**SIZES, **model_options)
    graphdef, params = nnx.split(model.create(cfg, mesh, seed=2, choice=attention(layout, tile=0)),
                                 nnx.Param)
    batch = position_loss.on_mesh(position_loss.position_batch(rows, layout, shards), mesh)
    with jax.set_mesh(mesh):
        return position_loss.curve(position_loss.make_position_eval(graphdef, BUCKETS), params,
                                   batch), (mesh, graphdef, params)


@pytest.fixture(scope="module")
def reference(rows):
    """Bucket means of the cross-entropy of the model's own logits, one device, natural order."""
    _, (mesh, graphdef, params) = curve("ring", 1, rows)
    with jax.set_mesh(mesh):
        logits = np.asarray(nnx.merge(graphdef, params)(jnp.asarray(rows[:, :-1])), np.float64)
    picked = np.take_along_axis(logits, rows[:, 1:, None], axis=-1)[..., 0]
    top = logits.max(-1, keepdims=True)
    nll = np.log(np.exp(logits - top).sum(-1)) + top[..., 0] - picked
    return nll.reshape(ROWS, BUCKETS, LENGTH // BUCKETS).mean(axis=(0, 2))


@pytest.mark.parametrize("layout,shards,options", [
    ("striped", 4, {}), ("zigzag", 4, {"loss_chunk": 4}), ("balanced", 4, {}),
])
def test_one_curve_for_every_layout(layout, shards, options, rows, reference):
    values, _ = curve(layout, shards, rows, **options)
    np.testing.assert_allclose(values, reference, rtol=1e-5)
    assert values[0] != pytest.approx(values[-1], rel=1e-3)  # a curve, not one number


def test_long_documents_are_whole_documents_from_their_start():
    eos = 9
    stream = np.array([1, 2, 9, 3, 4, 5, 6, 9, 7, 9, 1, 1, 1, 1, 1, 9])
    out = position_loss.long_documents(stream, eos, length=3, count=5)
    np.testing.assert_array_equal(out, [[3, 4, 5, 6], [1, 1, 1, 1]])
