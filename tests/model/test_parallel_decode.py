"""Sequence-parallel prefill and decoding against a sharded KV cache (model/decode.py,
model/mixers/cache.py): the same greedy tokens whatever the layout and the number of devices, the
same as the single-device cached decoder, and the training forward's logits."""

import jax
import numpy as np
import pytest
from flax import nnx

import model
import parallel
from model import decode
from tests.support.model_cases import attention

SIZES = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)
LAYOUTS = ["ring", "striped", "zigzag", "balanced"]


def build(layout: str, shards: int, linear_strategy: str = "state", **options):
    mesh = parallel.make_mesh(1, shards, devices=jax.devices()[:shards])
    cfg = model.ModelConfig(**{**SIZES, **options})
    choice = attention(layout, tile=0, linear_strategy=linear_strategy)
    return mesh, *nnx.split(model.create(cfg, mesh, seed=5, choice=choice), nnx.Param)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [list(rng.integers(0, 64, n)) for n in (37, 21, 1)]  # ragged, one of a token


@pytest.fixture(scope="module")
def single_device(prompts):
    """One device: the cached decoder's greedy tokens (tests/model/test_sample.py checks it against
    recomputation) and the training forward's logits, one row at a time."""
    mesh, graphdef, params = build("ring", 1)
    forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
    with jax.set_mesh(mesh):
        logits = [np.asarray(forward(params, np.array([p]))[0]) for p in prompts]
    return {"tokens": [list(decode.generate(graphdef, params, np.array([p]), 8)[0, len(p):])
                       for p in prompts], "logits": logits}


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,shards", [("ring", 1), ("striped", 2), ("ring", 4),
                                           ("striped", 4), ("zigzag", 4), ("balanced", 4)])
def test_same_tokens_and_logits_whatever_the_layout_and_devices(layout, shards, prompts,
                                                                single_device):
    """Greedy tokens as the single-device decoder's; and the prefill's logits, put back in
    natural order, as the single-device training forward's for every real token of every
    (ragged) row."""
    mesh, graphdef, params = build(layout, shards)
    rows = decode.generate_sharded(graphdef, params, prompts, 8, mesh)
    for prompt, row, expected in zip(prompts, rows, single_device["tokens"]):
        assert list(row[:len(prompt)]) == prompt
        assert list(row[len(prompt):]) == expected
    fields = decode.lay_out_prompts(prompts, layout, shards)
    lengths = fields.pop("lengths")
    with jax.set_mesh(mesh):
        net = nnx.merge(graphdef, params)
        hidden, caches = jax.jit(lambda f: net.prefill(f["inputs"], f["positions"],
                                                       f["segment_ids"], f["order"]))(fields)
        laid = np.asarray(net.logits(hidden))
    assert caches[0].k.shape[:2] == fields["inputs"].shape
    natural = np.take_along_axis(laid, np.argsort(fields["order"], axis=1)[..., None], axis=1)
    for row, reference in enumerate(single_device["logits"]):
        np.testing.assert_allclose(natural[row, :lengths[row]], reference, atol=1e-5, rtol=1e-5)


def test_a_prompt_longer_than_a_device_holds_is_sharded(prompts):
    """A 1,001-token prompt over 4 devices: each holds a quarter of the prompt's keys and values
    (plus the small tail of decoded tokens), and decoding goes on as on one device."""
    mesh, graphdef, params = build("zigzag", 4)
    prompt = list(np.random.default_rng(1).integers(0, 64, 1001))
    sizes = []
    rows = decode.generate_sharded(graphdef, params, [prompt], 3, mesh,
                                   report=lambda c: sizes.append(decode.cache_bytes_per_device(c)))
    (held, total), = sizes
    assert held / total < 0.26
    single = build("ring", 1)
    assert list(rows[0][1001:]) == list(decode.generate(single[1], single[2], np.array([prompt]),
                                                        3)[0, 1001:])
    assert len(rows[0]) == 1004


def _options(name):
    from tests.support.recurrent_cases import HYBRID
    from tests.support.recurrent_cases import GRANITE
    from tests.support.model_cases import MLA_MODEL
    from tests.support.model_cases import MIXED
    return {"mixed": MIXED, "latent": MLA_MODEL, "hybrid": HYBRID,
            "granite": dict(GRANITE, linear_strategy="heads")}[name]


@pytest.mark.sweeps
@pytest.mark.parametrize("options,layout,new", [("mixed", "zigzag", 8), ("latent", "striped", 6),
                                                ("hybrid", "balanced", 6),
                                                ("granite", "zigzag", 4)])
def test_model_options_decode_as_they_train(prompts, options, layout, new):
    """mixed: sliding-window and global layers with sinks, caps, q/k norms (tests/model/test_model.py's
    MIXED, window 6); latent: latent attention with a query latent (keys 8 + 4, values 6 wide)
    and DeepSeek-V3's experts (tests/parallel/test_mla_parallel.py's MLA_MODEL); hybrid: Gated DeltaNet
    layers whose prefill passes states (tests/model/test_linear_attention.py's HYBRID); granite:
    Mamba2 layers beside a softmax one without RoPE, prefilled by whole rows of a quarter of
    the groups (parallel.linear_strategy 'heads'; tests/model/test_mamba.py's GRANITE). Each greedy
    token,
    prefilled over 4 devices (the prompt's keys made where they sit) or on one with the cache,
    is the training forward's argmax on the finished row (and windows shorter than the prompts
    bite)."""
    one = build("ring", 1, **dict(_options(options), linear_strategy="state"))
    forward = jax.jit(lambda p, t: nnx.merge(one[1], p)(t))
    mesh, graphdef, params = build(layout, 4, **_options(options))
    rows = decode.generate_sharded(graphdef, params, prompts, new, mesh)
    for prompt, row in zip(prompts, rows):
        cached = decode.generate(one[1], one[2], np.array([prompt]), new)[0]
        assert list(row) == list(cached)
        with jax.set_mesh(one[0]):
            logits = np.asarray(forward(one[2], np.array([row[:-1]]))[0])
        assert list(logits[len(prompt) - 1:].argmax(-1)) == list(row[len(prompt):])
