"""A new Hugging Face family is one file and one registry line: a toy one (Llama's block under
other tensor names and its own model_type), defined here as a file in model/hf/families/ would
define it and put first in FAMILIES, is written by hf.save with its names and read back by
hf.load to the same logits; without the line its directory is refused in one line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

import model
from model import hf
from model.hf.families import FAMILIES, llama
from model.hf.families.base import Family
from parallel.mesh import make_mesh

LAYER = {path: name.replace("self_attn.", "attn.").replace("_proj", "")
         for path, name in llama.LAYER.items()}  # attn.q.weight, mlp.gate.weight, ...
FAMILY = Family("toy_llama", "ToyLlamaForCausalLM", llama.read, llama.write, LAYER,
                models="none (a test's)", attention="full", block="-")
CFG = model.ModelConfig(vocab_size=64, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1,
                        head_dim=8, mlp_dim=32)


@pytest.fixture
def registered():
    before = dict(FAMILIES)
    FAMILIES.clear()  # the line, first in the tuple: family_of tries it before Llama
    FAMILIES.update({FAMILY.model_type: FAMILY, **before})
    yield FAMILY
    FAMILIES.clear()
    FAMILIES.update(before)


def _saved(tmp_path):
    mesh = make_mesh(1, 1, devices=jax.devices()[:1])
    net = model.create(CFG, mesh, 0)
    hf.save(net, str(tmp_path / "toy"))
    return net, mesh, tmp_path / "toy"


def test_it_writes_and_reads_its_own_files(registered, tmp_path):
    net, mesh, path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("toy_llama",
                                                                ["ToyLlamaForCausalLM"])
    names = set()
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "np") as f:
            names |= set(f.keys())
    assert "model.layers.1.attn.q.weight" in names and "model.layers.0.mlp.down.weight" in names
    assert not any("self_attn" in n or "_proj" in n for n in names)
    back = hf.load(str(path), mesh=mesh)
    tokens = jnp.arange(24).reshape(2, 12) % 64
    np.testing.assert_array_equal(np.asarray(back(tokens)), np.asarray(net(tokens)))


def test_without_the_line_its_files_are_refused(registered, tmp_path):
    _, mesh, path = _saved(tmp_path)
    FAMILIES.pop(FAMILY.model_type)
    with pytest.raises(hf.HFError, match="ToyLlamaForCausalLM .model_type 'toy_llama'. is not a "
                                         "family model.hf reads"):
        hf.load(str(path), mesh=mesh)
