"""Latent attention under context parallelism: parallel.latent_attention (the devices pass each
token's latent and RoPE key) against float64 dense attention over the expanded keys, and the MLA
model's loss and gradients with mla_exchange 'latent' and 'full' against the one-device model;
every layout and strategy, on 1x4, 2x4 and 1x8 meshes, with documents."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parallel
from tests.tiers import split
from tests.support import dense_reference
from tests.support.attention_cases import layout_order, take
from tests.support.model_cases import SIZES, assert_as_one_device, loss_and_grads
from tests.support.model_cases import MLA_MODEL

B, S, H, NOPE, ROPE, R, V = 2, 64, 8, 8, 4, 16, 6
LAYOUTS = ("ring", "striped", "zigzag", "balanced")
STRATEGIES = (("ring", None), ("allgather", None), ("ulysses", None), ("usp", 2))
MESHES = ((1, 4), (2, 4), (1, 8))


def inputs():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, S, H, NOPE + ROPE))
    c = rng.normal(size=(B, S, R))
    k_rope = rng.normal(size=(B, S, ROPE))
    kv_b = rng.normal(size=(R, H * (NOPE + V))) / 4
    dout = rng.normal(size=(B, S, H, V))
    seg = np.zeros((B, S), np.int32)
    seg[:, 21:] = 1  # documents of 21, 30 and 13 tokens
    seg[:, 51:] = 2
    return (q, c, k_rope, kv_b), dout, seg


def dense(q, c, k_rope, kv_b, seg, dout):
    """Causal attention within documents over the expanded keys and values (float64,
    tests/support/dense_reference.py, v padded to the keys' width), and the gradients of q, c, k_rope
    and kv_b by the chain rule through the expansion: (out, grads)."""
    kv = (c @ kv_b).reshape(B, S, H, NOPE + V)
    k = np.concatenate([kv[..., :NOPE], np.broadcast_to(k_rope[:, :, None], (B, S, H, ROPE))],
                       axis=-1)
    pad = np.zeros((B, S, H, NOPE + ROPE - V))
    out, (dq, dk, dv) = dense_reference.attention(
        q, k, np.concatenate([kv[..., NOPE:], pad], -1), seg,
        dout=np.concatenate([dout, pad], -1))
    d_kv = np.concatenate([dk[..., :NOPE], dv[..., :V]], axis=-1).reshape(B, S, -1)
    return out[..., :V], (dq, d_kv @ kv_b.T, dk[..., NOPE:].sum(axis=2),
                          np.einsum("bsr,bso->ro", c, d_kv))


@pytest.fixture(scope="module")
def reference():
    args, dout, seg = inputs()
    return dense(*args, seg, dout)


# every layout x strategy x exchange; the two exchanges of a pair on different meshes
CASES = [(layout, strategy, degree, MESHES[(i + j + (exchange == "full")) % 3], exchange)
         for i, layout in enumerate(LAYOUTS) for j, (strategy, degree) in enumerate(STRATEGIES)
         for exchange in ("latent", "full")]


def expanded(q, c, k_rope, kv_b):
    """'full': the keys and values every device would exchange, expanded where they are made
    (the model's own expand), for parallel.attention (values narrower than keys)."""
    kv = (c @ kv_b).reshape(*c.shape[:2], H, NOPE + V)
    k = jnp.concatenate([kv[..., :NOPE], jnp.broadcast_to(k_rope[:, :, None],
                                                          (*c.shape[:2], H, ROPE))], axis=-1)
    return q, k, kv[..., NOPE:]


# The fast tier: a case of every layout, strategy and exchange; the sweeps tier: the rest.
@pytest.mark.parametrize("layout,strategy,degree,mesh_shape,exchange", split(CASES, 0, 1, 4))
def test_latent_attention_is_exact_passing_latents_or_keys(reference, layout, strategy, degree,
                                                            mesh_shape, exchange):
    """Every layout x strategy x exchange, on one of the three meshes: output and the gradients
    of q, the latent, the RoPE key and kv_b, float32 against float64, within 1e-5 relative.
    'latent': parallel.latent_attention; 'full': parallel.attention on the expanded keys and
    values (narrower), whose gradients reach the latent through the expansion."""
    want_out, want_grads = reference
    args, dout, seg = inputs()
    data, seq = mesh_shape
    mesh = parallel.make_mesh(data, seq, devices=jax.devices()[:data * seq])
    order = layout_order(layout, seg, B, S, seq, tile=4)
    laid = [jnp.asarray(take(a, order), jnp.float32) for a in args[:3]]
    kv_b = jnp.asarray(args[3], jnp.float32)

    def run(q, c, k_rope, kv_b):
        options = dict(mesh=mesh, layout=layout, segment_ids=jnp.asarray(take(seg, order)),
                       order=jnp.asarray(order), strategy=strategy, ulysses_degree=degree,
                       kernel="xla", tile_q=4, tile_k=4)
        if exchange == "full":
            return parallel.attention(*expanded(q, c, k_rope, kv_b), **options)
        return parallel.latent_attention(q, c, k_rope, kv_b, **options)

    out = run(*laid, kv_b)
    # Jitted, as a train step takes it: JAX's eager gradient of a call whose values are of
    # another width, after one on another mesh of the same devices, compiles with that mesh
    grads = jax.jit(jax.grad(
        lambda *a: jnp.sum(run(*a) * jnp.asarray(take(dout, order), jnp.float32)),
        argnums=(0, 1, 2, 3)))(*laid, kv_b)
    relative = lambda got, want: np.abs(got - want).max() / np.abs(want).max()  # noqa: E731
    assert relative(np.asarray(out), take(want_out, order)) < 1e-5
    for i, (got, want) in enumerate(zip(grads, want_grads)):
        assert relative(np.asarray(got), want if i == 3 else take(want, order)) < 1e-5, i


@pytest.fixture(scope="module")
def one_device():
    return loss_and_grads("ring", 1, 1, **MLA_MODEL)


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,data,seq,strategy,exchange,scan", [
    ("striped", 1, 4, "ring", "latent", False), ("zigzag", 2, 4, "allgather", "latent", True),
    ("balanced", 1, 8, "ring", "latent", False), ("ring", 1, 4, "ulysses", "latent", False),
    ("zigzag", 1, 4, "ring", "full", True), ("balanced", 2, 4, "allgather", "full", False)])
def test_the_mla_model_is_the_one_device_model(one_device, layout, data, seq, strategy,
                                               exchange, scan):
    """scan: the dense first block runs before the stack of the sparse ones (one lax.scan)."""
    loss, grads, _ = loss_and_grads(layout, data, seq, strategy, mla_exchange=exchange,
                                    scan_layers=scan, **MLA_MODEL)
    assert_as_one_device(loss, grads, one_device, stacked=scan)
    assert SIZES["num_heads"] == 4  # ulysses on 4 devices: a head each


def test_the_compiled_ring_moves_the_latent_not_the_keys():
    """DeepSeek-V2-Lite's attention (16 heads, qk 128 + 64, v 128, kv_lora_rank 512) in one
    layer on a ring of 4: the collective-permute bytes of the compiled train step with 'latent'
    are at most 1/6 of those with 'full' (ideal 576 / (2 x 16 x 192): the kernels tile K and V
    one width)."""
    import planner
    import run_config
    from configs import mla_tiny
    from planner.run import make_run
    from training.analysis.aot import compile_train_step

    moved = {}
    for exchange in ("latent", "full"):
        config = run_config.replace(run_config.build(mla_tiny.get_config()), {
            "seq_len": 512, "global_batch_size": 1, "parallel.layout": "ring",
            "parallel.strategy": "ring", "parallel.kernel": "xla", "parallel.tile": 128,
            "parallel.mla_exchange": exchange, "model.num_layers": 1, "model.d_model": 128,
            "model.num_heads": 16, "model.moe.num_experts": 0, "model.remat": False,
            "model.scan_layers": False, "model.loss_chunk": 0, "model.mlp_chunk": 0,
            "model.mla": {"q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                          "qk_rope_head_dim": 64, "v_head_dim": 128}})
        resolved = planner.resolve_run(config, (1, 4), "cpu", jax.devices()[0].device_kind)
        assert resolved.attention.mla_exchange == exchange
        figures, _ = compile_train_step(config, make_run(config, 4, (1, 4)), resolved)
        moved[exchange] = figures["collective_bytes"]["collective-permute"]
    assert moved["latent"] <= moved["full"] / 6
    assert moved["latent"] / moved["full"] < 1.01 * 576 / (2 * 16 * 192)
