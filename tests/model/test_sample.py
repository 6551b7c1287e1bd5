"""Sampling: the KV-cache decoder equals full recomputation; a trained model continues its corpus."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model
import parallel
from model import decode
from tests.support.model_cases import attention
from tests.support.train_runs import ROOT, clean_env, run_train
from training.evaluation import probes as probes_module

SIZES = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)


@pytest.fixture(scope="module")
def tiny_model():
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    cfg = model.ModelConfig(**SIZES)
    graphdef, params = nnx.split(model.create(cfg, mesh, seed=3, choice=attention("ring", tile=0)),
                                 nnx.Param)
    return mesh, graphdef, params


def full_logits(mesh, graphdef, params, tokens):
    @jax.jit
    def forward(params, tokens):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return nnx.merge(graphdef, params)(tokens, positions)

    with jax.set_mesh(mesh):
        return forward(params, jnp.asarray(tokens))


def test_prefill_logits_equal_the_training_forward(tiny_model):
    mesh, graphdef, params = tiny_model
    prompt = np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32)
    net = nnx.merge(graphdef, params)
    cached, _ = decode.prefill(net, jnp.asarray(prompt), decode.init_cache(net.cfg, 2, 20))
    np.testing.assert_allclose(cached, full_logits(mesh, graphdef, params, prompt), atol=1e-5)


def test_greedy_with_cache_equals_greedy_by_recomputation(tiny_model):
    mesh, graphdef, params = tiny_model
    prompt = np.random.default_rng(1).integers(0, 64, (2, 5)).astype(np.int32)
    with_cache = decode.generate(graphdef, params, prompt, 10, temperature=0.0)
    # Recompute the whole sequence for every new token. Causal: what follows position t (zeros
    # here) changes nothing at t, so one padded shape serves every step.
    tokens = np.zeros((2, 15), np.int32)
    tokens[:, :5] = prompt
    for t in range(5, 15):
        logits = full_logits(mesh, graphdef, params, tokens)
        tokens[:, t] = np.asarray(logits[:, t - 1].argmax(-1))
    np.testing.assert_array_equal(with_cache, tokens)


def test_top_k_and_temperature():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    draws = jax.vmap(lambda k: decode.sample_token(logits, k, 1.0, 2))(
        jax.random.split(jax.random.key(0), 2000))[:, 0]
    counts = np.bincount(np.asarray(draws), minlength=4) / 2000
    assert counts[2] == counts[3] == 0  # outside the top 2
    assert abs(counts[0] - 0.5 / 0.8) < 0.05
    assert int(decode.sample_token(logits, jax.random.key(0), 0.0, 0)[0]) == 0


@pytest.mark.programs
def test_model_trained_on_a_repeating_corpus_continues_it(tmp_path):
    line = "one two three four five six seven eight nine ten eleven twelve\n"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(line * 3000)
    result = run_train(tmp_path / "run", f"--config.data.source={corpus}",
                       "--config.model.vocab_size=320", "--config.num_train_steps=60",
                       "--config.data.mask_documents=False", "--config.data.eval_fraction=0.05")
    assert result.returncode == 0, result.stderr[-3000:]
    cmd = [sys.executable, "sample.py", "--workdir", str(tmp_path / "run"), "--prompt",
           "three four", "--max_new_tokens", "30", "--temperature", "0"]
    sample = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert sample.returncode == 0, sample.stderr[-3000:]
    text = sample.stdout.split("-" * 40)[0]
    assert text.startswith("three four five six seven eight nine ten eleven twelve\none two "
                           "three four"), text
    # The same prompt prefilled over 4 devices in another layout, beside a longer one (a ragged
    # batch): the same greedy text, and the cache's size per device reported.
    longer = "eleven twelve\n" + line * 3 + "one two"
    sharded = subprocess.run(cmd + ["--seq_shards", "4", "--layout", "zigzag", "--prompt",
                                    longer], cwd=ROOT, env=clean_env(), capture_output=True,
                             text=True, timeout=300)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    first, second = sharded.stdout.split("-" * 40)[:2]
    assert first == text and second.strip().startswith(longer + " three four five")
    assert "over 4 devices (zigzag); KV cache" in sharded.stderr
    # The retrieval probes on the same checkpoint: the table and the heatmap beside it, and the
    # prompts as text files.
    table = tmp_path / "probes.json"
    probes = subprocess.run([sys.executable, "scripts/eval_long.py", "--workdir",
                             str(tmp_path / "run"), "--lengths", "320", "--depths", "0",
                             "1", "--samples", "2", "--seq_shards", "2", "--json", str(table),
                             "--probes", "passkey", "--write_prompts",
                             str(tmp_path / "prompts"), "--dynamic_rope"],
                            cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert probes.returncode == 0, probes.stderr[-3000:]
    result = json.loads(table.read_text())
    assert result["lengths"] == [320] and result["trained_seq_len"] == 128
    assert result["dynamic_rope"]
    cells = [v for row in result["accuracy"]["passkey"].values() for v in row.values()]
    assert len(cells) == 2 and all(v in (0.0, 0.5, 1.0) for v in cells)
    assert (tmp_path / "probes.png").stat().st_size > 10_000
    assert "passkey: 2/2 cells" in probes.stderr  # progress, as lines in a piped log
    # A written prompt given to scripts/sample.py over 4 devices: the probe's prompt (320
    # tokens) and its reply, whatever the model says, both read with the RoPE stretched 2.5x.
    keys = json.loads((tmp_path / "prompts" / "keys.json").read_text())
    reply = result["replies"]["passkey"]["320"]["1.0"]
    assert keys["passkey-320-1-1.txt"] == reply["keys"][1]
    again = subprocess.run([sys.executable, "scripts/sample.py", "--workdir", str(tmp_path / "run"),
                            "--prompt_file", str(tmp_path / "prompts" / "passkey-320-1-1.txt"),
                            "--seq_shards", "4", "--temperature", "0", "--max_new_tokens", "8",
                            "--dynamic_rope"],
                           cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "320 tokens over 4 devices" in again.stderr
    assert "dynamic RoPE: 320 tokens read as the trained 128 (stretched 2.5x)" in again.stderr
    prompt = (tmp_path / "prompts" / "passkey-320-1-1.txt").read_text()
    continuation = again.stdout.split("-" * 40)[0][len(prompt):]
    assert probes_module.reply(continuation) == reply["replies"][1]


def test_sample_without_checkpoints_is_a_clear_error(tmp_path):
    cmd = [sys.executable, "sample.py", "--workdir", str(tmp_path)]
    result = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert "no checkpoints" in result.stderr and "Traceback" not in result.stderr


def test_prefill_then_extend_in_pieces_equals_the_training_forward(tiny_model):
    """The attention layer's cache path: 7 prompt tokens, then 3 and 2 more at once, written at
    their positions; each piece's logits equal the training forward's at those positions."""
    mesh, graphdef, params = tiny_model
    tokens = np.random.default_rng(2).integers(0, 64, (2, 12)).astype(np.int32)
    net = nnx.merge(graphdef, params)
    cache = decode.init_cache(net.cfg, 2, 16)
    pieces = []
    for start, stop in ((0, 7), (7, 10), (10, 12)):
        logits, cache = decode.extend(net, jnp.asarray(tokens[:, start:stop]), cache, start)
        pieces.append(logits)
    want = full_logits(mesh, graphdef, params, tokens)
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), want, atol=1e-5)
    assert cache[0].k.shape == (2, 16, 2, 8) and not np.asarray(cache[0].k[:, 12:]).any()


def test_decode_uses_the_models_own_modules():
    """decode.py calls the model; it no longer reaches into the blocks' submodules."""
    import inspect

    source = inspect.getsource(decode)
    for inner in (".attention(", ".attention.", ".mlp", "attention_norm", "mlp_norm", ".q(", ".k(",
                  ".v(", ".o("):
        assert inner not in source, inner
