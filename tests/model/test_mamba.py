"""Mamba2 layers (model/mixers/mamba2.py, model/rules/ssd.py): the SSD rule against its recurrence token by token
in float64 numpy (chunk sizes, a start state, documents); the layer over the 'seq' devices in every
layout, with either linear strategy, against the same layer on one device (outputs and every
gradient); a Granite-shaped hybrid model against one device; and decoding with the recurrent cache
against transformers' Granite 4.0 hybrid fixture's full forward."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parallel
from model.config import MambaConfig, ModelConfig
from model.mixers.mamba2 import Weights, layer
from model.rules.ssd import ssd_rule
from tests.tiers import split
from tests.support.recurrent_cases import LAYOUTS, MESHES, assert_over_devices, on_one_device
from tests.support.model_cases import attention, loss_and_grads
from tests.support.recurrent_cases import GRANITE, MAMBA
from tests.support import FIXTURES

D = 16


def test_the_ssd_rule_is_its_recurrence():
    """Outputs and final states within 1e-5 of the float64 recurrence, chunks of 7, 8, 16 and
    64 over 40 tokens, from a given state, documents of 13, 17 and 10 tokens in row 0."""
    rng = np.random.default_rng(0)
    b, s, h, n, p = 2, 40, 3, 5, 4
    q, k = rng.normal(size=(2, b, s, h, n))
    v = rng.normal(size=(b, s, h, p))
    g, beta = -rng.uniform(0, 1, (b, s, h)), rng.uniform(0, 1, (b, s, h))
    seg = np.zeros((b, s), np.int32)
    seg[0, 13:], seg[0, 30:] = 1, 2
    start = rng.normal(size=(b, h, n, p))
    want, want_state = np.zeros((b, s, h, p)), np.zeros((b, h, n, p))
    for r in range(b):
        state = start[r].copy()
        for t in range(s):
            if t and seg[r, t] != seg[r, t - 1]:
                state = np.zeros_like(state)
            state = (np.exp(g[r, t])[:, None, None] * state
                     + np.einsum("hn,hp->hnp", k[r, t], beta[r, t][:, None] * v[r, t]))
            want[r, t] = np.einsum("hnp,hn->hp", state, q[r, t])
        want_state[r] = state
    for chunk in (7, 8, 16, 64):
        o, final = ssd_rule(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, g, beta)), chunk,
                            jnp.asarray(start, jnp.float32), jnp.asarray(seg))
        assert np.abs(o - want).max() / np.abs(want).max() < 1e-5, chunk
        assert np.abs(final - want_state).max() / np.abs(want_state).max() < 1e-5, chunk


def layer_config(layout: str, strategy: str = "state", piece: int = 0):
    """(the layer's ModelConfig, its attention choice); piece: model.linear_chunk
    (parallel/recurrent/pieces.py)."""
    return (ModelConfig(vocab_size=8, d_model=D, num_layers=1, num_heads=1, num_kv_heads=1,
                        head_dim=8, mlp_dim=8, layer_types=("mamba",), mamba=MAMBA,
                        linear_chunk=piece), attention(layout, linear_strategy=strategy))


def weights(seed=0) -> Weights:
    rng = np.random.default_rng(seed)
    c, h, inner = MAMBA.conv_channels, MAMBA.num_heads, MAMBA.inner
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.4, jnp.float32)  # noqa: E731
    return Weights(in_proj=normal(D, inner + c + h), conv=normal(4, c), conv_bias=normal(c),
                   dt_bias=normal(h), a_log=jnp.asarray(rng.uniform(-1, 1.5, h), jnp.float32),
                   d=normal(h), norm=1 + normal(inner), out=normal(inner, D))


@pytest.fixture(scope="module")
def one_device():
    return on_one_device(layer, layer_config("ring"), weights())


# 'state' on ring and striped a piece of 4 tokens at a time (model.linear_chunk)
@pytest.mark.parametrize("strategy,layout,mesh_shape,piece", split([  # fast: each layout, either strategy
    (strategy, layout, MESHES[(i + shift) % 3], 4 if strategy == "state" and i < 2 else 0)
    for strategy, shift in (("state", 2), ("heads", 0)) for i, layout in enumerate(LAYOUTS)]
    + [("state", "zigzag", (1, 2), 0)], fast=[0, 5, 2, 7]))  # zigzag's 4 halves passing their states in place
def test_the_layer_over_the_sequence_devices_is_the_one_device_layer(one_device, strategy,
                                                                      layout, mesh_shape, piece):
    """Outputs and the gradients of the input and of every weight (D, the convolution's bias
    among them) within 1e-5 relative, documents crossing device boundaries, whole or in
    pieces."""
    assert_over_devices(layer, layer_config(layout, strategy, piece), weights(), one_device,
                        layout, mesh_shape)


@pytest.fixture(scope="module")
def granite_one_device():
    return loss_and_grads("ring", 1, 1, **GRANITE)


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,data,seq,strategy", [("zigzag", 2, 4, "heads"),
                                                      ("balanced", 1, 8, "state")])
def test_a_granite_hybrid_is_the_one_device_model(granite_one_device, layout, data, seq,
                                                  strategy):
    """Granite 4.0's blocks (Mamba2 layers, a softmax layer without RoPE, experts beside a
    shared MLP, its multipliers) over the sequence devices with documents: loss and every
    gradient within 1e-5 relative of one device's."""
    want_loss, want_grads, _ = granite_one_device
    loss, grads, _ = loss_and_grads(layout, data, seq, linear_strategy=strategy, **GRANITE)
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    errors = jax.tree.map(lambda g, w: np.abs(g - w).max() / max(np.abs(w).max(), 1e-30),
                          grads, want_grads)
    assert max(jax.tree.leaves(errors)) < 1e-5, errors


@pytest.mark.sweeps
def test_decoding_granite_carries_the_state_and_equals_the_full_forward():
    """transformers' Granite 4.0 hybrid fixture: a prompt of 7 tokens then 3 and 2 more, each
    piece's logits within 1e-5 of the training forward's; greedy decoding with the cache equals
    greedy decoding by recomputing the whole sequence."""
    from flax import nnx

    from model import decode, hf
    net = hf.load(os.path.join(FIXTURES, "hf",
                               "granite_hybrid_mamba2"))
    graphdef, params = nnx.split(net, nnx.Param)
    forward = jax.jit(lambda params, tokens: nnx.merge(graphdef, params)(tokens))
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])

    def full_logits(tokens):
        with jax.set_mesh(mesh):
            return np.asarray(forward(params, jnp.asarray(tokens)))

    tokens = np.random.default_rng(2).integers(0, 128, (2, 12)).astype(np.int32)
    cache, pieces = decode.init_cache(net.cfg, 2, 16), []
    for start, stop in ((0, 7), (7, 10), (10, 12)):
        logits, cache = decode.extend(net, jnp.asarray(tokens[:, start:stop]), cache, start)
        pieces.append(logits)
    want = full_logits(tokens)
    got = np.asarray(jnp.concatenate(pieces, axis=1))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert cache[0].state.shape == (2, 6, 16, 16) and cache[0].conv.shape == (2, 3, 160)

    prompt = tokens[:, :5]
    with_cache = decode.generate(graphdef, params, prompt, 8, temperature=0.0)
    recomputed = np.zeros((2, 13), np.int32)
    recomputed[:, :5] = prompt
    for t in range(5, 13):  # causal: the zeros after t change nothing at t
        recomputed[:, t] = full_logits(recomputed)[:, t - 1].argmax(-1)
    np.testing.assert_array_equal(with_cache, recomputed)


def test_the_planner_counts_granites_parameters_and_prices_its_mamba_layers():
    """planner.memory.param_counts against the real model (Mamba2 layers' matrices and vectors,
    experts beside a shared MLP); 'heads' needs the 'seq' devices to divide the groups."""
    import model
    from planner import linear_strategy, memory
    from planner.devices import device_for_kind
    cfg = ModelConfig(**GRANITE)
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    assert memory.param_counts(cfg)["total"] == model.count_params(model.create(cfg, mesh, 0))
    device = device_for_kind("TPU v5p")
    assert linear_strategy.price(cfg, "ring", 4096, 8, device)["heads"] is not None
    four_groups = ModelConfig(**dict(GRANITE, mamba=MambaConfig(
        num_heads=16, head_dim=3, state_size=4, num_groups=4)))
    assert linear_strategy.price(four_groups, "ring", 4096, 8, device)["heads"] is None
