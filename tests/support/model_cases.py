"""The model tests' cases: small sizes, the attention a model built by hand runs, a batch with
two documents, the loss and gradients on a mesh, and the comparison with one device."""

import jax
import numpy as np
from flax import nnx

import model
import parallel
from model.config import MLAConfig, MoEConfig
from tests.support.attention_cases import layout_order, take
from training import step as step_lib


SIZES = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)


S, B = 32, 2


def attention(layout: str, strategy: str = "ring", tile: int = 4, mla_exchange: str = "full",
              linear_strategy: str = "state") -> parallel.AttentionChoice:
    """The attention a model built by hand runs (a run's comes from planner.resolve_run); a
    tile of 0: the kernel's default for each call's length."""
    return parallel.AttentionChoice(layout=layout, strategy=strategy, ulysses_degree=1,
                                    kernel="xla", tile_q=tile, tile_k=tile,
                                    mla_exchange=mla_exchange,
                                    linear_strategy=linear_strategy)


def natural_batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SIZES["vocab_size"], (B, S + 1)).astype(np.int32)
    segment_ids = np.zeros((B, S), np.int32)
    segment_ids[:, 20:] = 1  # a second document starts at token 20
    positions = np.where(np.arange(S) < 20, np.arange(S), np.arange(S) - 20)[None].repeat(B, 0)
    weights = rng.uniform(0.5, 1.0, (B, S)).astype(np.float32)
    return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], positions=positions.astype(np.int32),
                segment_ids=segment_ids, weights=weights)


def loss_and_grads(layout, data, seq, strategy="ring", mla_exchange="full",
                   linear_strategy="state", **overrides):
    mesh = parallel.make_mesh(data, seq, devices=jax.devices()[: data * seq])
    cfg = model.ModelConfig(**{**SIZES, **overrides})
    net = model.create(cfg, mesh, seed=0, choice=attention(
        layout, strategy, mla_exchange=mla_exchange, linear_strategy=linear_strategy))
    graphdef, params = nnx.split(net, nnx.Param)
    fields = natural_batch()
    order = layout_order(layout, fields["segment_ids"], B, S, seq, tile=4)
    sharding = jax.NamedSharding(mesh, jax.P("data", "seq"))
    batch = {k: jax.device_put(take(v, order), sharding) for k, v in fields.items()}
    batch["order"] = jax.device_put(order, sharding)

    @jax.jit
    def loss_grads(params, batch):
        def loss(params):  # as the train step weighs it: the router losses of experts too
            total, weight, moe = step_lib.loss_sums(graphdef, params, batch, True)
            return (total + (0.0 if moe is None else moe["penalty"] * weight)) / weight
        return jax.value_and_grad(loss)(params)

    with jax.set_mesh(mesh):
        loss, grads = loss_grads(params, batch)
    return float(loss), jax.tree.map(np.asarray, grads), params


# Gemma 2/3, Mistral, Qwen3, GPT-OSS options at once: local (window 6, its own RoPE base) and
# global layers, norms of q and k, caps on scores and logits, sinks, Gemma's query scale, GeGLU,
# sandwich norms, the embedding scale and biases on the attention's projections.
MIXED = dict(layer_types=("sliding_attention", "full_attention"), sliding_window=6,
             rope_local_theta=1000.0, qk_norm=True, attn_logit_soft_cap=3.0,
             final_logit_soft_cap=5.0, attention_sinks=True, query_scale=12.0,
             mlp_activation="gelu_tanh", sandwich_norms=True, embed_scale=True,
             attention_bias=True)


def assert_as_one_device(loss, grads, single_device, stacked: bool = False, period: int = 1,
                         tolerance: float = 1e-4):
    """The loss within 1e-5 and every gradient within `tolerance` (relative to its largest
    entry) of the one-device run's; stacked: this run's blocks are scanned, compared layer by
    layer (period > 1: a hybrid's, one stack per position of the period)."""
    want_loss, want_grads, _ = single_device
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    grads, want_grads = nnx.to_pure_dict(grads), nnx.to_pure_dict(want_grads)
    if stacked:  # dense first blocks (first_blocks) one by one, then the stack
        first = grads.pop("first_blocks", {})
        stacks = grads["blocks"] if period > 1 else {0: grads["blocks"]}
        size = len(jax.tree.leaves(stacks[0])[0])
        grads["blocks"] = {**first, **{
            len(first) + j * period + p: jax.tree.map(lambda a, j=j: a[j], stacks[p])
            for j in range(size) for p in range(period)}}
    errors = jax.tree.map(lambda g, w: np.abs(g - w).max() / max(np.abs(w).max(), 1e-30),
                          grads, want_grads)
    assert max(jax.tree.leaves(errors)) < tolerance, errors


# A DeepSeek-shaped model: latent attention with a query latent, a dense first block, then
# experts routed by sigmoid with a correction bias among groups, scaled, with a shared expert.
MLA_MODEL = dict(mla=MLAConfig(kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8,
                               qk_rope_head_dim=4, v_head_dim=6),
                 moe=MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, router="sigmoid_topk",
                               n_group=2, topk_group=1, routed_scaling_factor=2.0,
                               num_shared_experts=1, first_dense_layers=1))
