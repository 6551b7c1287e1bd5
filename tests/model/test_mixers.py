"""The registry of token mixers (model/mixers): the planner's parameter counts are the built
model's for every config in configs/, and a new kind of mixer is one file and one entry."""

from __future__ import annotations

import glob
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model
import run_config
from model import mixers
from model.mixers.base import Mixer
from parallel.mesh import make_mesh
from planner import memory
from tests.support import ROOT

CONFIGS = sorted(os.path.relpath(path, os.path.join(ROOT, "configs"))[:-3].replace(os.sep, ".")
                 for path in glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)
                 if not path.endswith("__init__.py"))


def abstract_params(cfg) -> int:
    """The built model's parameter count, its shapes only (no memory for an 80B model)."""
    mesh = make_mesh(1, 1, devices=jax.devices()[:1])
    with jax.set_mesh(mesh):
        abstract = nnx.eval_shape(lambda: model.Transformer(cfg, mesh, nnx.Rngs(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize("name", CONFIGS)
def test_planner_counts_the_built_models_parameters(name):
    config = run_config.build(importlib.import_module(f"configs.{name}").get_config())
    cfg = model.ModelConfig.from_config(config.model, switches=model.MemorySwitches())
    assert memory.param_counts(cfg)["total"] == abstract_params(cfg)


class Doubled(Mixer):
    """A test's own kind: y = x W1 W2 per token, layer type 'doubled'."""

    name, layer_types = "doubled", ("doubled",)

    class Module(nnx.Module):
        def __init__(self, cfg, mesh, rngs, choice):
            self.w1 = nnx.Param(jax.random.normal(rngs.params(), (cfg.d_model, cfg.d_model)) * 0.1)
            self.w2 = nnx.Param(jax.random.normal(rngs.params(), (cfg.d_model, cfg.d_model)) * 0.1)

        def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                     collect=False, kind="doubled"):
            return x @ self.w1[...] @ self.w2[...]

    module = Module

    def matrix_params(self, m) -> int:
        return 2 * m.d_model * m.d_model


def test_a_new_kind_of_mixer_is_one_file_and_one_entry(monkeypatch):
    monkeypatch.setitem(mixers.MIXERS, "doubled", Doubled())
    cfg = model.ModelConfig(vocab_size=64, d_model=16, num_layers=2, num_heads=2,
                            num_kv_heads=2, head_dim=8, mlp_dim=32,
                            layer_types=("doubled", "full_attention"))
    net = model.create(cfg, make_mesh(1, 1, devices=jax.devices()[:1]), 0)
    assert isinstance(net.blocks[0].attention, Doubled.Module)
    assert memory.param_counts(cfg)["total"] == model.count_params(net)
    tokens = jnp.arange(12).reshape(2, 6) % 64
    logits = net(tokens)
    # block 0 by hand against the module: its mixer is the registered kind's
    block = net.blocks[0]
    x = net._embed(tokens)
    h = block.attention_norm(x) @ block.attention.w1[...] @ block.attention.w2[...]
    assert np.allclose(block(x, jnp.broadcast_to(jnp.arange(6), (2, 6))),
                       (x + h) + block.mlp(block.mlp_norm(x + h)), atol=1e-5)
    assert logits.shape == (2, 6, 64) and bool(jnp.isfinite(logits).all())


def test_a_layer_type_no_kind_runs_is_one_line():
    cfg = model.ModelConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2,
                            num_kv_heads=2, head_dim=8, mlp_dim=32, layer_types=("nope",))
    with pytest.raises(ValueError, match="'nope' is not a layer type: use 'full_attention'"):
        model.create(cfg, make_mesh(1, 1, devices=jax.devices()[:1]), 0)
