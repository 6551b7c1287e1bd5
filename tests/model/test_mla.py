"""model/mixers/latent.py against transformers' own DeepseekV3Attention (tests/fixtures/hf/mla_attention.npz,
written by scripts/hf/make_fixtures.py --mla-attention): DeepSeek-V3's layer (a query latent,
YaRN with its softmax mscale, interleaved RoPE), V2-Lite's (no query latent) and the halves
RoPE convention, at positions past YaRN's original context."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.mixers import latent as mla
from model.rope import RopeScaling
from tests.support import FIXTURES

FIXTURE = os.path.join(FIXTURES, "hf", "mla_attention.npz")
SHAPES = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
CASES = {  # the fixture's cases as our config reads them (scripts/hf/fixture_cases.py, MLA_ATTENTION)
    "v3": (dict(q_lora_rank=24, rope_interleave=True),
           RopeScaling("yarn", factor=4.0, original_max_position_embeddings=64, mscale=1.0,
                       mscale_all_dim=1.0)),
    "v2_lite": (dict(q_lora_rank=0, rope_interleave=True), RopeScaling()),
    "halves": (dict(q_lora_rank=24, rope_interleave=False), RopeScaling()),
}
NAMES = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
         "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj",
         "o": "o_proj"}


def dense_causal(q, k, v, scale):
    """softmax(q k^T scale, causal) v over [B, S, H, d], written out."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = q.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("case", list(CASES))
def test_latent_attention_is_transformers_deepseek_attention(case):
    data = np.load(FIXTURE)
    options, scaling = CASES[case]
    config = mla.MLAConfig(**SHAPES, **options)
    weights = {}
    for ours, theirs in NAMES.items():
        key = f"{case}/{theirs}.weight"
        if key in data:  # torch's Linear is [out, in]; a norm's scale is a vector
            weights[ours] = data[key].T if data[key].ndim == 2 else data[key]
    out = mla.mla_attention(weights, data[f"{case}/x"], data[f"{case}/positions"], config,
                            num_heads=4, theta=10_000.0, scaling=scaling,
                            attend=dense_causal)
    want = data[f"{case}/out"]
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_the_latent_is_what_a_ring_would_pass_and_expands_to_the_same_keys():
    """576 values a token for DeepSeek-V3's shapes against 40,960 expanded; expanding a
    latent gives the keys and values the layer attends with."""
    v3 = mla.MLAConfig(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
                       qk_rope_head_dim=64, v_head_dim=128)
    assert v3.latent_width == 576 and 128 * (v3.qk_head_dim + v3.v_head_dim) == 40_960
    assert mla.softmax_scale(v3, RopeScaling()) == pytest.approx(192 ** -0.5)
    yarn = RopeScaling("yarn", factor=40.0, mscale=1.0, mscale_all_dim=1.0)
    assert mla.softmax_scale(v3, yarn) == pytest.approx(
        192 ** -0.5 * (0.1 * np.log(40.0) + 1) ** 2)
    small = mla.MLAConfig(**SHAPES, q_lora_rank=0)
    rng = np.random.default_rng(0)
    c, k_rope = rng.normal(size=(1, 5, 16)), rng.normal(size=(1, 5, 1, 4))
    kv_b = rng.normal(size=(16, 4 * 16))
    k, v = mla.expand(kv_b, c, k_rope, small, num_heads=4)
    per_head = (c @ kv_b).reshape(1, 5, 4, 16)
    tol = 1e-5 * np.abs(per_head).max()  # jnp's float32 against numpy's float64
    np.testing.assert_allclose(k[..., :8], per_head[..., :8], rtol=0, atol=tol)
    np.testing.assert_allclose(v, per_head[..., 8:], rtol=0, atol=tol)
    assert np.all(np.asarray(k[..., 8:]) == np.broadcast_to(k_rope, (1, 5, 4, 4)).astype(k.dtype))
