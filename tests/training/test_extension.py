"""training/extension.py: each context-extension method as RoPE fields the model accepts, and
what each does to the frequencies (model/rope.py) against the formulas written out here."""

import types

import numpy as np
import pytest

import run_config
from model.rope import RopeScaling, frequencies
from training import extension


@pytest.mark.parametrize("method", extension.METHODS)
def test_each_method_is_a_rope_the_model_takes(method):
    fields = extension.rope(method, theta=10_000.0, head_dim=32, trained=512, factor=32.0)
    scaling = RopeScaling.from_config(fields["rope_scaling"])
    assert scaling.problem() is None
    inv_freq, _ = frequencies(32, fields["rope_theta"], scaling)
    plain = 10_000.0 ** (-np.arange(0, 32, 2) / 32)
    slowest_turns = 16_384 * inv_freq[-1] / (2 * np.pi)  # turns of the slowest pair at 2x
    if method == "zero-shot":
        np.testing.assert_allclose(inv_freq, plain, rtol=1e-6)
    elif method == "linear":
        np.testing.assert_allclose(inv_freq, plain / 32, rtol=1e-6)
    else:  # the fastest pair kept (local order), the slowest slowed down by about the factor
        assert inv_freq[0] == pytest.approx(plain[0], rel=1e-6)
        assert slowest_turns <= 512 * plain[-1] / (2 * np.pi) * 1.01
    if method == "theta":
        assert fields["rope_theta"] == pytest.approx(10_000.0 * 32 ** (32 / 30))


def test_an_unknown_method_is_one_line():
    with pytest.raises(ValueError, match="choose one of zero-shot, theta"):
        extension.rope("ntk", theta=1.0, head_dim=8, trained=8, factor=2.0)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}])
def test_dynamic_scaling_turns_a_longer_prompt_no_farther_than_training(scaling):
    """Stretched to 4x the trained length, the slowest pair turns over the prompt exactly as far
    as it turned over the trained length; the fastest pair is kept (linear slows every pair);
    nothing changes up to the trained length."""
    model = types.SimpleNamespace(rope_theta=10_000.0, head_dim=32,
                                  rope_scaling=RopeScaling.from_config(scaling))
    assert extension.stretched(model, trained=512, length=512) == {}
    over = extension.stretched(model, trained=512, length=2048)
    before, factor_before = frequencies(32, 10_000.0, RopeScaling.from_config(scaling))
    after, factor_after = frequencies(32, over.get("rope_theta", 10_000.0), RopeScaling.from_config(
        {**scaling, **over.get("rope_scaling", {})}))
    assert 2048 * after[-1] == pytest.approx(512 * before[-1], rel=1e-6)
    assert after[0] == pytest.approx(before[0] / (4 if scaling["rope_type"] == "linear" else 1),
                                     rel=1e-6)
    if scaling["rope_type"] == "yarn":  # the derived attention factor follows the new factor
        assert factor_after == pytest.approx(0.1 * np.log(32.0) + 1)
        assert factor_before == pytest.approx(0.1 * np.log(8.0) + 1)


def test_a_stretched_run_is_the_same_model_with_the_stretched_rope():
    """saved_run.stretched_model: the graph decoding reads holds the stretched RoPE (so its
    parameters load into it unchanged); at the trained length the run's own graph."""
    from flax import nnx

    from configs import default
    from training.saved_run import _abstract_model, stretched_model
    config = default.get_config()
    config.seq_len, config.mesh.seq, config.parallel.strategy = 128, 1, "ring"
    config.model.update(dict(d_model=32, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                             num_layers=1, vocab_size=64))
    config.parallel.tile = 0
    config = run_config.build(config)
    assert stretched_model(config, "the run's graph", 128) == (config, "the run's graph")
    stretched, graphdef = stretched_model(config, None, 512)
    assert config.model.rope_theta == 10_000.0  # the loaded run's config is left as it was
    assert stretched.model.rope_theta == pytest.approx(10_000.0 * 4 ** (16 / 14))
    # The graph holds it: merged with the parameters' shapes, its attention reads that theta.
    shapes = _abstract_model(stretched, 1)[0]["params"]
    assert nnx.merge(graphdef, shapes).cfg.rope_theta == stretched.model.rope_theta
