"""RoPE scaling against Hugging Face's (tests/fixtures/hf_rope.npz, written by
scripts/hf/make_rope_fixtures.py with transformers' LlamaRotaryEmbedding): the frequencies, the
attention factor, and the rotated queries at positions far past the pretrained context."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.layers import rope
from model.rope import RopeScaling, frequencies
from tests.support import FIXTURES

FIXTURE = np.load(os.path.join(FIXTURES, "hf_rope.npz"))
CASES = sorted({k.split("/")[0] for k in FIXTURE.files if "/" in k})
THETA = 10_000.0


def _scaling(case):
    params = json.loads(str(FIXTURE[f"{case}/params"]))
    return RopeScaling.from_config(params)


@pytest.mark.parametrize("case", CASES)
def test_frequencies_and_attention_factor_are_hugging_faces(case):
    inv_freq, factor = frequencies(64, THETA, _scaling(case))
    np.testing.assert_allclose(inv_freq, FIXTURE[f"{case}/inv_freq"], rtol=1e-6)
    assert factor == pytest.approx(float(FIXTURE[f"{case}/attention_factor"]), rel=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_queries_rotate_as_hugging_faces_do(case):
    q = jnp.asarray(FIXTURE["q"]).transpose(0, 2, 1, 3)  # theirs [B, H, S, D], ours [B, S, H, D]
    ours = rope(q, jnp.asarray(FIXTURE["positions"]), THETA, _scaling(case))
    # float32 angles up to position 20,000 (about 1e-3 rad of rounding at the highest rates)
    np.testing.assert_allclose(np.asarray(ours).transpose(0, 2, 1, 3), FIXTURE[f"{case}/rotated"],
                               atol=2e-3, rtol=0)


def test_every_rule_is_covered_and_differs_from_none():
    assert {_scaling(c).rope_type for c in CASES} == {"default", "linear", "llama3", "yarn"}
    plain, _ = frequencies(64, THETA)
    for case in CASES:
        if case != "default":
            assert not np.allclose(frequencies(64, THETA, _scaling(case))[0], plain)


@pytest.mark.parametrize("fields,message", [
    (dict(rope_type="ntk"), "rope_type='ntk': choose one of default, linear, llama3, yarn"),
    (dict(rope_type="llama3", factor=8.0), "needs original_max_position_embeddings"),
    (dict(rope_type="linear", factor=0.5), "factor=0.5 must be at least 1"),
])
def test_bad_scaling_is_one_line_before_anything_is_built(fields, message):
    from configs import tiny
    from training.validate import ConfigError, validate_config
    config = tiny.get_config()
    config.model.rope_scaling.update(fields)
    with pytest.raises(ConfigError, match="^model.rope_scaling: ") as error:
        validate_config(config, device_count=4, process_count=1)
    assert message in str(error.value)


def test_a_scaled_model_is_exact_in_every_layout():
    """YaRN on the model: zigzag over 4 devices gives one device's loss and gradients (the
    rotation uses original positions), and the scaling changes the loss."""
    from tests.support.model_cases import loss_and_grads
    yarn = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=8)
    want, want_grads, _ = loss_and_grads("ring", 1, 1, rope_scaling=yarn)
    loss, grads, _ = loss_and_grads("zigzag", 1, 4, rope_scaling=yarn)
    assert abs(loss - want) < 1e-5 * abs(want)
    errors = [np.abs(g - w).max() / np.abs(w).max()
              for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads))]
    assert max(errors) < 1e-4
    assert abs(loss_and_grads("ring", 1, 1)[0] - want) > 1e-4
