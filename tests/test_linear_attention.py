"""Gated DeltaNet layers under context parallelism (model/linear_attention.py): the layer split
over the 'seq' devices in every layout (state passing, the convolution's halo, all-to-alls to
contiguous blocks) against the same layer on one device, outputs and gradients (of the input and
of every weight), with documents that cross device boundaries; and a hybrid model's loss and
gradients (Gated DeltaNet layers, a gated softmax layer, experts) against one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parallel
from model.config import LinearAttentionConfig, ModelConfig, MoEConfig
from model.linear_attention import Weights, layer
from tests.test_attention import layout_order, take
from tests.test_model import SIZES, attention, loss_and_grads

B, S, D = 2, 64, 16
LINEAR = LinearAttentionConfig(num_key_heads=2, num_value_heads=4, key_head_dim=8,
                               value_head_dim=6, conv_kernel=4, chunk_size=4)
LAYOUTS = ("ring", "striped", "zigzag", "balanced")
MESHES = ((1, 4), (2, 4), (1, 8))


def layer_config(layout: str) -> ModelConfig:
    return ModelConfig(vocab_size=8, d_model=D, num_layers=1, num_heads=1, num_kv_heads=1,
                       head_dim=8, mlp_dim=8, layer_types=("linear_attention",),
                       linear_attention=LINEAR, attention=attention(layout))


def weights(seed=0) -> Weights:
    rng = np.random.default_rng(seed)
    c, hv, dv = LINEAR.conv_channels, LINEAR.num_value_heads, LINEAR.value_head_dim
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.4, jnp.float32)  # noqa: E731
    return Weights(qkvz=normal(D, c + hv * dv), ba=normal(D, 2 * hv), conv=normal(4, c),
                   dt_bias=normal(hv), a_log=jnp.asarray(rng.uniform(-1, 1.5, hv), jnp.float32),
                   norm=1 + normal(dv), out=normal(hv * dv, D))


def natural():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(B, S, D)).astype(np.float32)
    dout = rng.normal(size=(B, S, D)).astype(np.float32)
    seg = np.zeros((B, S), np.int32)
    seg[0, 21:] = 1  # row 0: documents of 21, 30 and 13 tokens (starts inside blocks and
    seg[0, 51:] = 2  # inside the convolution's reach of a block's start); row 1: one
    seg[1, 17:] = 1  # row 1: a document starting one token past a block of 16
    return x, dout, seg


def value_and_grads(fn, w, x, dout):
    def loss(w, x):
        return jnp.sum(fn(w, x) * dout)
    return fn(w, x), jax.grad(loss, argnums=(0, 1))(w, x)


@pytest.fixture(scope="module")
def one_device():
    x, dout, seg = natural()
    cfg = layer_config("ring")
    return jax.jit(lambda w, x: value_and_grads(
        lambda w, x: layer(w, x, cfg, segment_ids=jnp.asarray(seg)), w, x, jnp.asarray(dout)))(
            weights(), jnp.asarray(x))


# every layout on every mesh
@pytest.mark.parametrize("layout,mesh_shape", [(layout, mesh) for layout in LAYOUTS
                                               for mesh in MESHES])
def test_the_layer_over_the_sequence_devices_is_the_one_device_layer(one_device, layout,
                                                                      mesh_shape):
    """Outputs and the gradients of the input and of every weight within 1e-5 relative (the
    convolution weight's and the decays' summed over devices)."""
    (want_out, (want_dw, want_dx)) = one_device
    x, dout, seg = natural()
    data, seq = mesh_shape
    mesh = parallel.make_mesh(data, seq, devices=jax.devices()[:data * seq])
    order = layout_order(layout, seg, B, S, seq, tile=4)
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    put = lambda a: jax.device_put(jnp.asarray(a), sharding)  # noqa: E731
    cfg = layer_config(layout)
    fn = lambda w, x: layer(w, x, cfg, segment_ids=put(take(seg, order)),  # noqa: E731
                            order=put(order), mesh=mesh)
    with jax.set_mesh(mesh):
        out, (dw, dx) = jax.jit(lambda w, x: value_and_grads(fn, w, x, put(take(dout, order))))(
            weights(), put(take(x, order)))
    close = lambda got, want: np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(  # noqa
        np.asarray(want)).max()
    assert close(out, take(np.asarray(want_out), order)) < 1e-5
    assert close(dx, take(np.asarray(want_dx), order)) < 1e-5
    for name, got, want in zip(Weights.__dataclass_fields__, jax.tree.leaves(dw),
                               jax.tree.leaves(want_dw)):
        assert close(got, want) < 1e-5, name


HYBRID = dict(SIZES, num_layers=3, layer_types=("linear_attention", "linear_attention",
                                                "full_attention"),
              linear_attention=LINEAR, attention_output_gate=True, qk_norm=True,
              partial_rotary_factor=0.5,
              moe=MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, num_shared_experts=1,
                            shared_expert_mlp_dim=16, shared_expert_gate=True))


@pytest.fixture(scope="module")
def hybrid_one_device():
    return loss_and_grads("ring", 1, 1, **HYBRID)


@pytest.mark.parametrize("layout,data,seq", [("ring", 1, 4), ("zigzag", 2, 4),
                                             ("balanced", 1, 8), ("striped", 2, 4)])
def test_a_hybrid_model_is_the_one_device_model(hybrid_one_device, layout, data, seq):
    """Qwen3-Next's block kinds (two Gated DeltaNet layers, a gated softmax layer with q/k norms
    and partial rotary, experts with a gated shared one) over the sequence devices, documents:
    loss and every gradient within 1e-5 relative of one device's."""
    want_loss, want_grads, _ = hybrid_one_device
    loss, grads, _ = loss_and_grads(layout, data, seq, **HYBRID)
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    errors = jax.tree.map(lambda g, w: np.abs(g - w).max() / max(np.abs(w).max(), 1e-30),
                          grads, want_grads)
    assert max(jax.tree.leaves(errors)) < 1e-5, errors
