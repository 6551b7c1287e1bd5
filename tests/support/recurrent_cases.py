"""The recurrent layers' cases (Gated DeltaNet, Mamba2): a layer's config and weights, rows with
documents, the comparison over the sequence devices with one device, and the hybrid models
(Qwen3-Next's and Granite's blocks) the model tests build."""

import jax
import jax.numpy as jnp
import numpy as np

import parallel
from model.config import LinearAttentionConfig, MambaConfig, ModelConfig, MoEConfig
from model.mixers.gated_deltanet import Weights
from tests.support.attention_cases import layout_order, take
from tests.support.model_cases import SIZES, attention


B, S, D = 2, 64, 16


# 8 key heads: the 'heads' strategy splits them over 8 devices; two value heads each
LINEAR = LinearAttentionConfig(num_key_heads=8, num_value_heads=16, key_head_dim=4,
                               value_head_dim=3, conv_kernel=4, chunk_size=4)


LAYOUTS = ("ring", "striped", "zigzag", "balanced")


MESHES = ((1, 4), (2, 4), (1, 8))


def layer_config(layout: str, strategy: str = "state", piece: int = 0):
    """(the layer's ModelConfig, the attention choice it runs under): layer(w, x, *case, ...);
    piece: model.linear_chunk (parallel/recurrent/pieces.py)."""
    return (ModelConfig(vocab_size=8, d_model=D, num_layers=1, num_heads=1, num_kv_heads=1,
                        head_dim=8, mlp_dim=8, layer_types=("linear_attention",),
                        linear_attention=LINEAR, linear_chunk=piece),
            attention(layout, linear_strategy=strategy))


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


def assert_over_devices(layer, case, w, one_device, layout: str, mesh_shape):
    """layer(w, x, *case, segment_ids=, order=, mesh=) (case: layer_config's) on natural()'s
    rows laid out by `layout` over a (data, seq) mesh: its outputs and the gradients of its input and of every weight
    (a registered dataclass of arrays) within 1e-5 relative of `one_device`'s (value_and_grads
    of the same layer unsplit)."""
    (want_out, (want_dw, want_dx)) = one_device
    x, dout, seg = natural()
    data, seq = mesh_shape
    mesh = parallel.make_mesh(data, seq, devices=jax.devices()[:data * seq])
    order = layout_order(layout, seg, x.shape[0], x.shape[1], seq, tile=4)
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    put = lambda a: jax.device_put(jnp.asarray(a), sharding)  # noqa: E731
    fn = lambda w, x: layer(w, x, *case, segment_ids=put(take(seg, order)),  # noqa: E731
                            order=put(order), mesh=mesh)
    with jax.set_mesh(mesh):
        out, (dw, dx) = jax.jit(lambda w, x: value_and_grads(fn, w, x, put(take(dout, order))))(
            w, put(take(x, order)))
    close = lambda got, want: np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(  # noqa
        np.asarray(want)).max()
    assert close(out, take(np.asarray(want_out), order)) < 1e-5
    assert close(dx, take(np.asarray(want_dx), order)) < 1e-5
    for name, got, want in zip(type(w).__dataclass_fields__, jax.tree.leaves(dw),
                               jax.tree.leaves(want_dw)):
        assert close(got, want) < 1e-5, name


def on_one_device(layer, case, w):
    """value_and_grads of layer(w, x, *case, segment_ids=) on natural()'s rows, unsplit: what
    assert_over_devices compares with."""
    x, dout, seg = natural()
    return jax.jit(lambda w, x: value_and_grads(
        lambda w, x: layer(w, x, *case, segment_ids=jnp.asarray(seg)), w, x, jnp.asarray(dout)))(
            w, jnp.asarray(x))


HYBRID = dict(SIZES, num_layers=3, layer_types=("linear_attention", "linear_attention",
                                                "full_attention"),
              linear_attention=LINEAR, attention_output_gate=True, qk_norm=True,
              partial_rotary_factor=0.5,
              moe=MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, num_shared_experts=1,
                            shared_expert_mlp_dim=16, shared_expert_gate=True))


# 8 groups of 2 heads: 'heads' splits the groups over 8 devices
MAMBA = MambaConfig(num_heads=16, head_dim=3, state_size=4, num_groups=8, conv_kernel=4,
                    chunk_size=4)


GRANITE = dict(SIZES, num_layers=3, layer_types=("mamba", "full_attention", "mamba"),
               mamba=MAMBA, partial_rotary_factor=0.0, query_scale=20.0,
               embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
               moe=MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, norm_topk_prob=True,
                             num_shared_experts=1, shared_expert_mlp_dim=16))
