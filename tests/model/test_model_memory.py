"""The memory-saving forms of the model compute what the plain one does: the loss (against
float64), chunked or not, the tiled MLP, the RMSNorm backward, blocks under one lax.scan, remat
policies; and the chunked loss really leaves the [B, S, V] logits out of the compiled program."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals  # what autodiff keeps for the backward

import model
import parallel
from model import decode
from model.layers import rms_norm
from tests.support.model_cases import SIZES, attention, loss_and_grads, natural_batch
from training import step as step_lib


def assert_same(got, want, rtol=1e-5):
    loss, grads = got
    want_loss, want_grads = want
    assert abs(loss - want_loss) <= rtol * abs(want_loss), (loss, want_loss)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=rtol * np.abs(w).max())


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,data,seq,overrides", [
    ("striped", 2, 2, dict(loss_chunk=4, remat=True, remat_policy="dots")),
    ("zigzag", 1, 4, dict(loss_chunk=2, mlp_chunk=4)),
    ("balanced", 2, 4, dict(loss_chunk=4, mlp_chunk=2, remat=True, remat_policy="attention")),
    # host memory: the same numbers
    ("ring", 1, 4, dict(loss_chunk=8, tie_embeddings=True, remat=True, remat_policy="offload")),
])
def test_chunked_loss_tiled_mlp_and_remat_policies_match_the_plain_model(layout, data, seq,
                                                                        overrides):
    plain = {k: v for k, v in overrides.items() if k == "tie_embeddings"}
    want = loss_and_grads(layout, data, seq, **plain)[:2]
    assert_same(loss_and_grads(layout, data, seq, **overrides)[:2], want)


def _models(mesh, choice=parallel.choice.UNPLANNED, **overrides):
    """A plain model and a scan_layers one from the same seed: the scanned one's parameters are
    the plain blocks' stacked on a leading layer axis (checked), so a run can switch."""
    cfg = model.ModelConfig(**{**SIZES, **overrides})
    plain = model.create(cfg, mesh, seed=0, choice=choice)
    scanned = model.create(dataclasses.replace(cfg, scan_layers=True), mesh, seed=0,
                           choice=choice)
    want = nnx.to_pure_dict(nnx.state(plain, nnx.Param))
    layers = [want["blocks"][i] for i in range(cfg.num_layers)]
    want["blocks"] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    got = nnx.to_pure_dict(nnx.state(scanned, nnx.Param))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)
    kernel = nnx.state(scanned, nnx.Param)["blocks"]["mlp"]["up"]["kernel"][...]
    spec = kernel.sharding.spec
    assert not spec or spec[0] is None  # the layer axis is not sharded; d_model is (FSDP)
    return plain, scanned


def _unstacked(grads, num_layers):
    pure = nnx.to_pure_dict(grads)
    pure["blocks"] = {i: jax.tree.map(lambda x, i=i: x[i], pure["blocks"])
                      for i in range(num_layers)}
    return pure


@pytest.mark.parametrize("overrides", [dict(remat=True, mlp_chunk=4, loss_chunk=4)])
@pytest.mark.sweeps
def test_scan_layers_matches_the_unrolled_blocks(overrides):
    mesh = parallel.make_mesh(1, 4, devices=jax.devices()[:4])
    plain, scanned = _models(mesh, choice=attention("zigzag"), **overrides)
    batch = {k: jnp.asarray(v) for k, v in natural_batch().items()}
    batch["order"] = jnp.broadcast_to(parallel.permutation("zigzag", 32, 4), (2, 32))
    batch = {k: v if k == "order" else jnp.take_along_axis(v, batch["order"], axis=1)
             for k, v in batch.items()}

    def loss_grads(net):
        graphdef, params = nnx.split(net, nnx.Param)

        @jax.jit
        def run(params):
            def loss(params):
                total, weight = step_lib.token_loss_sums(graphdef, params, batch, True)
                return total / weight
            return jax.value_and_grad(loss)(params)
        with jax.set_mesh(mesh):
            loss, grads = run(params)
        return float(loss), grads

    want_loss, want_grads = loss_grads(plain)
    loss, grads = loss_grads(scanned)
    assert jax.tree.leaves(grads)[0].ndim >= 2
    assert_same((loss, _unstacked(grads, SIZES["num_layers"])),
                (want_loss, nnx.to_pure_dict(want_grads)))


def test_scan_layers_decodes_as_the_unrolled_blocks():
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    plain, scanned = _models(mesh)
    prompt = jnp.asarray(natural_batch()["inputs"][:, :8])
    for net in (plain, scanned):
        assert len(list(net.layers())) == SIZES["num_layers"]
    with jax.set_mesh(mesh):
        logits = [decode.prefill(net, prompt, decode.init_cache(net.cfg, 2, 10))[0]
                  for net in (plain, scanned)]
        direct = plain(prompt, jnp.broadcast_to(jnp.arange(8), (2, 8)))
    np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)
    np.testing.assert_allclose(logits[0], direct, atol=1e-5)


def _reference_norm(x, scale, eps):
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_backward_matches_autodiff_and_keeps_only_x_and_its_rms(dtype):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 16)) * 3, dtype)
    scale = jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((3, 5, 16)), jnp.float32)
    ours = jax.vjp(lambda x, s: rms_norm(x, s, 1e-5, jnp.dtype(dtype)), x, scale)
    ref = jax.vjp(lambda x, s: _reference_norm(x, s, 1e-5).astype(dtype), x, scale)
    np.testing.assert_allclose(np.float32(ours[0]), np.float32(ref[0]), rtol=1e-6)
    tol = 1e-5 if dtype == "float32" else 1e-2
    for got, want in zip(ours[1](dy.astype(dtype)), ref[1](dy.astype(dtype))):
        np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tol, atol=tol)

    def saved_bytes(fn):
        return sum(aval.size * aval.dtype.itemsize for aval, _ in
                   saved_residuals(fn, x, scale))
    per_token = x.dtype.itemsize * 16 + 4  # x itself and one float32 1/rms
    assert saved_bytes(lambda x, s: rms_norm(x, s, 1e-5, jnp.dtype(dtype))) == (
        15 * per_token + scale.nbytes)
    assert saved_bytes(lambda x, s: _reference_norm(x, s, 1e-5)) > 15 * per_token * 2


@pytest.mark.parametrize("chunk,soft_cap", [(0, 0.0), (4, 5.0)])
def test_the_loss_and_its_gradient_match_float64(chunk, soft_cap):
    """nll_sum over a data 2 x seq 2 mesh against the cross-entropy and its gradient written
    out in float64 numpy: dz = weight (softmax(z) - onehot) (x the soft cap's slope),
    dx = dz W^T, dW = x^T dz."""
    from model import loss as loss_lib
    rng = np.random.default_rng(3)
    b, s, d, v = 2, 16, 8, 24
    x, w = rng.standard_normal((b, s, d)), rng.standard_normal((d, v))
    targets, weights = rng.integers(0, v, (b, s)), rng.uniform(0, 2, (b, s))
    raw = x @ w
    z = soft_cap * np.tanh(raw / soft_cap) if soft_cap else raw
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    picked = np.take_along_axis(z, targets[..., None], -1)[..., 0]
    want = np.sum(weights * (lse - picked))
    dz = weights[..., None] * (np.exp(z - lse[..., None]) - np.eye(v)[targets])
    if soft_cap:
        dz = dz * (1 - np.tanh(raw / soft_cap) ** 2)
    mesh = parallel.make_mesh(2, 2, devices=jax.devices()[:4])
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    fn = jax.jit(jax.value_and_grad(lambda x, w: loss_lib.nll_sum(
        x, w, jnp.asarray(targets), f32(weights), mesh=mesh, chunk=chunk, soft_cap=soft_cap),
        argnums=(0, 1)))
    with jax.set_mesh(mesh):
        got, (dx, dw) = fn(jax.device_put(f32(x), jax.NamedSharding(mesh, jax.P("data", "seq"))),
                           f32(w))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(dx, dz @ w.T, atol=1e-5 * np.abs(dz @ w.T).max())
    want_dw = np.einsum("bsd,bsv->dv", x, dz)
    np.testing.assert_allclose(dw, want_dw, atol=1e-5 * np.abs(want_dw).max())


def test_chunked_loss_leaves_the_logits_out_of_the_compiled_step():
    """Vocabulary 4,096 x 2,048 tokens: the logits alone are 32 MB; chunks of 128 tokens make
    2 MB at a time. XLA's temporaries for loss + gradients drop by more than the logits."""
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    sizes = dict(SIZES, vocab_size=4096, num_layers=1)
    batch = {"inputs": jnp.zeros((1, 2048), jnp.int32), "targets": jnp.ones((1, 2048), jnp.int32),
             "positions": jnp.arange(2048)[None], "weights": jnp.ones((1, 2048), jnp.float32)}

    def temporaries(loss_chunk):
        net = model.create(model.ModelConfig(**sizes, loss_chunk=loss_chunk), mesh, seed=0,
                           choice=attention("striped", tile=64))
        graphdef, params = nnx.split(net, nnx.Param)
        fn = jax.jit(jax.grad(lambda p: step_lib.token_loss_sums(graphdef, p, batch, False)[0]))
        with jax.set_mesh(mesh):
            return fn.lower(params).compile().memory_analysis().temp_size_in_bytes
    logits_bytes = 2048 * 4096 * 4
    assert temporaries(128) < temporaries(0) - logits_bytes


def test_weight_decay_skips_the_stacked_norm_scales():
    """Stacked RMSNorm scales are [num_layers, d_model]: two-dimensional, yet not decayed."""
    from training.optim import _matrices
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    net = model.create(model.ModelConfig(**SIZES, scan_layers=True), mesh, seed=0)
    mask = nnx.to_pure_dict(_matrices(nnx.state(net, nnx.Param)))
    assert not mask["blocks"]["mlp_norm"]["scale"] and not mask["final_norm"]["scale"]
    assert mask["blocks"]["mlp"]["up"]["kernel"] and mask["embed"]["embedding"]
    # Gated DeltaNet layers (stacked: [layers, heads] decays): the conv and projections decay,
    # the decay rates, the time-step bias and the gated norm's scale do not
    from model.config import LinearAttentionConfig
    linear = model.ModelConfig(**{**SIZES, "layer_types": ("linear_attention",) * 2},
                               scan_layers=True, linear_attention=LinearAttentionConfig(2, 4, 8, 8))
    mask = nnx.to_pure_dict(_matrices(nnx.state(model.create(linear, mesh, 0), nnx.Param)))
    gdn = mask["blocks"]["attention"]
    assert gdn["conv"] and gdn["qkvz"]["kernel"] and gdn["out"]["kernel"]
    assert not (gdn["a_log"] or gdn["dt_bias"] or gdn["norm"])
