"""model/rules/gated_delta.py against the gated delta rule written out token by token in float64 numpy
(the recurrence of Qwen3-Next's layers): outputs and final states over several chunk sizes
(padding included), from a given state, with documents resetting the state; gradients against
the same recurrence differentiated by JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.rules.gated_delta import gated_delta_rule
from tests.support import FIXTURES

B, S, H, DK, DV = 2, 40, 3, 8, 6


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, S, H, DK)) / np.sqrt(DK)
    k = rng.normal(size=(B, S, H, DK))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # l2-normalised, as the layer feeds them
    v = rng.normal(size=(B, S, H, DV))
    g = -rng.uniform(0.0, 1.0, size=(B, S, H))  # log decays
    beta = rng.uniform(0.0, 1.0, size=(B, S, H))
    state = rng.normal(size=(B, H, DK, DV))
    seg = np.zeros((B, S), np.int32)
    seg[0, 13:] = 1  # row 0: documents of 13, 17 and 10 tokens; row 1: one
    seg[0, 30:] = 2
    return q, k, v, g, beta, state, seg


def recurrence(q, k, v, g, beta, state=None, seg=None):
    """The rule one token at a time in float64, the state zeroed at each document's start
    (the given state belongs to token 0's document)."""
    out = np.zeros(v.shape)
    final = np.zeros((B, H, DK, DV))
    for r in range(B):
        s = np.zeros((H, DK, DV)) if state is None else np.array(state[r], np.float64)
        for t in range(S):
            if seg is not None and t and seg[r, t] != seg[r, t - 1]:
                s = np.zeros((H, DK, DV))
            s = s * np.exp(g[r, t])[:, None, None]
            u = beta[r, t][:, None] * (v[r, t] - np.einsum("hkv,hk->hv", s, k[r, t]))
            s = s + k[r, t][:, :, None] * u[:, None, :]
            out[r, t] = np.einsum("hkv,hk->hv", s, q[r, t])
        final[r] = s
    return out, final


@pytest.mark.parametrize("chunk,with_state,documents", [
    (8, False, False), (16, True, False), (64, True, True), (7, True, True)])
def test_chunks_are_the_recurrence(chunk, with_state, documents):
    q, k, v, g, beta, state, seg = inputs()
    want_out, want_state = recurrence(q, k, v, g, beta, state if with_state else None,
                                      seg if documents else None)
    out, final = gated_delta_rule(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta)),
                                  chunk=chunk,
                                  initial_state=jnp.asarray(state, jnp.float32) if with_state
                                  else None, segment_ids=jnp.asarray(seg) if documents else None)
    scale = lambda x: np.abs(x).max()  # noqa: E731
    assert np.abs(np.asarray(out) - want_out).max() / scale(want_out) < 1e-5
    assert np.abs(np.asarray(final) - want_state).max() / scale(want_state) < 1e-5


def test_gradients_are_the_recurrence_s():
    """d(out . w + final . w2) for every input: the chunked rule against lax.scan over tokens."""
    q, k, v, g, beta, state, seg = (jnp.asarray(x, jnp.float32) if x.dtype != np.int32
                                    else jnp.asarray(x) for x in inputs(1))
    rng = np.random.default_rng(2)
    w_out = jnp.asarray(rng.normal(size=(B, S, H, DV)), jnp.float32)
    w_state = jnp.asarray(rng.normal(size=(B, H, DK, DV)), jnp.float32)

    def tokenwise(q, k, v, g, beta, state):
        def step(s, x):
            qt, kt, vt, gt, bt, reset = x
            s = jnp.where(reset[:, None, None, None], 0.0, s) * jnp.exp(gt)[..., None, None]
            u = bt[..., None] * (vt - jnp.einsum("bhkv,bhk->bhv", s, kt))
            s = s + kt[..., None] * u[..., None, :]
            return s, jnp.einsum("bhkv,bhk->bhv", s, qt)
        resets = jnp.concatenate([jnp.zeros((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
        xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, resets))
        final, out = jax.lax.scan(step, state, xs)
        return jnp.moveaxis(out, 0, 1), final

    def chunked(q, k, v, g, beta, state):
        return gated_delta_rule(q, k, v, g, beta, chunk=16, initial_state=state, segment_ids=seg)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a)[0] * w_out) + jnp.sum(fn(*a)[1] * w_state)

    want = jax.grad(loss(tokenwise), argnums=range(6))(q, k, v, g, beta, state)
    got = jax.grad(loss(chunked), argnums=range(6))(q, k, v, g, beta, state)
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max() < 1e-4, i


def test_the_layer_is_transformers_qwen3_next_gated_deltanet():
    """model.linear_attention.layer against transformers' Qwen3NextGatedDeltaNet alone
    (tests/fixtures/hf/gated_deltanet.npz, hf/make_fixtures.py --gated-deltanet: 2 key heads of
    8 for 4 value heads of 8, a convolution of 4, 96 tokens), 1e-5 relative."""
    import os

    from model.config import LinearAttentionConfig, ModelConfig
    from model.mixers.gated_deltanet import Weights, layer
    data = np.load(os.path.join(FIXTURES, "hf",
                                "gated_deltanet.npz"))
    w = Weights(qkvz=data["in_proj_qkvz.weight"].T, ba=data["in_proj_ba.weight"].T,
                conv=data["conv1d.weight"][:, 0].T, dt_bias=data["dt_bias"],
                a_log=data["A_log"], norm=data["norm.weight"], out=data["out_proj.weight"].T)
    cfg = ModelConfig(vocab_size=8, d_model=48, num_layers=1, num_heads=1, num_kv_heads=1,
                      head_dim=8, mlp_dim=8, norm_eps=1e-5, layer_types=("linear_attention",),
                      linear_attention=LinearAttentionConfig(2, 4, 8, 8, 4, chunk_size=16))
    out = layer(jax.tree.map(jnp.asarray, w), jnp.asarray(data["x"]), cfg)
    want = data["out"]
    assert np.abs(np.asarray(out) - want).max() / np.abs(want).max() < 1e-5
