"""training/extension.py: each context-extension method as RoPE fields the model accepts, and
what each does to the frequencies (model/rope.py) against the formulas written out here."""

import numpy as np
import pytest

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
