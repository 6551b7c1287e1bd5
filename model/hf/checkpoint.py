"""Hugging Face checkpoints in and out: `config.json` + safetensors (one file or sharded), for the
families of model/hf/families/ (FAMILIES; the README's models table lists them, from it): the
tensors, read and written through each family's names. config.json's translation is
model/hf/config_json.py's.

    from model import hf
    m = hf.load("/models/Llama-3.2-1B")      # our Transformer, on one device, no mesh to set up
    logits = m(tokens)                        # [B, S] int -> [B, S, vocab] float32
    hf.save(m, "/tmp/out")                    # a directory transformers loads (its family's)

What maps to what in a Llama (our NNX parameter: Hugging Face tensor; kernels are stored
transposed, as torch's Linear keeps [out, in]; the rotate-half RoPE pairing is the same in both;
the other families add and rename norms: model/hf/families/):

    embed.embedding                   model.embed_tokens.weight
    blocks[i].attention_norm.scale    model.layers.i.input_layernorm.weight
    blocks[i].attention.{q,k,v,o}     model.layers.i.self_attn.{q,k,v,o}_proj.weight
    blocks[i].mlp_norm.scale          model.layers.i.post_attention_layernorm.weight
    blocks[i].mlp.{gate,up,down}      model.layers.i.mlp.{gate,up,down}_proj.weight
    an expert layer's router          model.layers.i.mlp.gate.weight (Qwen3-MoE)
    its gate[e], up[e], down[e]       model.layers.i.mlp.experts.e.{gate,up,down}_proj.weight
    final_norm.scale                  model.norm.weight
    lm_head.kernel                    lm_head.weight (absent when tie_word_embeddings)

Loading is tensor by tensor onto the target shardings (`load_params`): each device's shard is
read from the memory-mapped files, so no host ever holds the whole model, and a training run
(`--config.init_from=hf:PATH`) loads straight onto its mesh, layers stacked or not. Everything a
checkpoint says is checked before a byte is loaded: HFError, one line, for a missing directory, an
architecture outside the families, options the model here does not have (biases, another
activation, a multi-token prediction head), and tensors whose names or shapes contradict
config.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

import parallel
from model.config import ModelConfig
from model.hf.config_json import DTYPES, HFError, config_json, family_for, read_config
from model.hf.families.base import Stored, stored
from model.hf.safetensors_dir import SafetensorsDir, write
from model.rope import RopeScaling
from parallel.choice import UNPLANNED, AttentionChoice
from model.transformer import Transformer, scan_period

_TOP = {("embed", "embedding"): "model.embed_tokens.weight",
        ("final_norm", "scale"): "model.norm.weight",
        ("lm_head", "kernel"): "lm_head.weight"}
# Tensors some checkpoints carry that the model computes instead (older Llama files).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _source(path: tuple, cfg: ModelConfig) -> tuple[np.ndarray, Stored]:
    """Our parameter's path -> (the Hugging Face tensor names it is read from, an array shaped
    like its leading axes: [layers] when stacked, [experts] where each expert is its own tensor
    ({e} in the name), both or neither; how they are stored)."""
    if path[0] not in ("blocks", "first_blocks"):
        return np.asarray(_TOP[path]), stored(path, _TOP[path])
    inner = path[2:] if isinstance(path[1], int) else path[1:]
    how = stored(inner, family_for(cfg).layer[inner])
    experts = range(cfg.moe.num_experts) if "{e}" in how.name else None
    per_layer = lambda i: (f"model.layers.{i}.{how.name}" if experts is None  # noqa: E731
                           else [f"model.layers.{i}.{how.name.format(e=e)}" for e in experts])
    period = scan_period(cfg) if cfg.scan_layers else 1
    if period > 1 and path[0] == "blocks":  # a hybrid's stack at position path[1] of a period
        return np.asarray([per_layer(i) for i in range(cfg.first_stacked + path[1],
                                                       cfg.num_layers, period)]), how
    if isinstance(path[1], int):  # blocks[i]..., or first_blocks[i] (dense, before a stack)
        return np.asarray(per_layer(path[1])), how
    stacked = range(cfg.first_stacked if cfg.scan_layers else 0, cfg.num_layers)
    return np.asarray([per_layer(i) for i in stacked]), how


def _stored_shape(shape: tuple, how: Stored) -> tuple:
    """The file's tensor shape for our parameter's shape (less its leading axes)."""
    if how.depthwise:
        return (shape[1], 1, shape[0])
    shape = (*shape[:-2], shape[-1], shape[-2]) if how.transposed else shape
    if how.halves:
        return (*shape[:-2], shape[-2] * how.parts, shape[-1])
    return (*shape[:-1], shape[-1] * how.parts) if shape else shape


def _offset(path: tuple, cfg: ModelConfig) -> float:
    """What the family stores a parameter less by: Gemma's norm scales are kept as scale - 1."""
    return family_for(cfg).norm_offset if path[-1] == "scale" else 0.0


def _key_path(path) -> tuple:
    return tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Each Hugging Face tensor name of a model with this config, with its shape: our
    parameters' shapes less their leading (layer, expert) axes, transposed where stored so."""
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    one = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_devices=1))
    _, abstract, _ = abstract_model(one, mesh)  # the shapes: on one device, wherever it runs
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        names, how = _source(_key_path(path), cfg)
        for name in names.reshape(-1):
            out[str(name)] = _stored_shape(leaf.shape[names.ndim:], how)
    return out


def open_weights(path: str, cfg: ModelConfig) -> SafetensorsDir:
    """The checkpoint's tensors, checked against the model config: every tensor present with
    its shape, none the model would ignore. HFError otherwise."""
    try:
        weights = SafetensorsDir(path)
    except FileNotFoundError as e:
        raise HFError(f"{e}: is {path!r} a Hugging Face model directory?") from None
    except Exception as e:  # noqa: BLE001 - a damaged header or index
        raise HFError(f"{path}: cannot read its safetensors files ({e})") from None
    expected, names = expected_tensors(cfg), set(weights.names())
    for name, shape in expected.items():
        if name not in names:
            raise HFError(f"{path}: tensor {name} is missing (config.json describes "
                          f"{cfg.num_layers} layers{', untied' if not cfg.tie_embeddings else ''})")
        if weights.shape(name) != shape:
            raise HFError(f"{path}: tensor {name} has shape {list(weights.shape(name))} but "
                          f"config.json implies {list(shape)}: the files and config.json are "
                          f"from different models")
    ignored = {"lm_head.weight"} if cfg.tie_embeddings else set()  # a tied copy, if stored
    extra = sorted(n for n in names - set(expected) - ignored
                   if not n.endswith(_IGNORED_SUFFIXES))
    beyond = [n for n in extra if n.startswith("model.layers.")
              and n.split(".")[2].isdigit() and int(n.split(".")[2]) >= cfg.num_layers]
    if beyond:  # DeepSeek-V3's and GLM-4.5's files keep their MTP modules as extra layers
        raise HFError(f"{path}: tensor {beyond[0]} is a multi-token prediction head's (a layer "
                      f"past num_hidden_layers={cfg.num_layers}), which this model does not "
                      f"train or load: give a copy without model.layers.{cfg.num_layers}.*")
    if extra:
        raise HFError(f"{path}: tensor {extra[0]} has no place in a "
                      f"{family_for(cfg).architecture} model ({len(extra)} such tensors): not a "
                      f"checkpoint this loader reads")
    return weights


def load_params(weights: SafetensorsDir, cfg: ModelConfig, abstract, mesh):
    """The parameters `abstract` describes (an nnx.State of ShapeDtypeStructs whose shardings'
    specs are the targets), read shard by shard: each device's part of each tensor comes
    from the memory-mapped files, so a host reads only what its devices hold."""

    def place(path, leaf):
        names, how = _source(_key_path(path), cfg)
        offset = _offset(_key_path(path), cfg)

        def read(index):
            lead, inner = index[:names.ndim], index[names.ndim:]
            chosen = names[lead] if names.ndim else names
            parts = [_read_part(weights, str(name), inner, how) for name in chosen.reshape(-1)]
            out = np.stack(parts)
            out = out.reshape(chosen.shape + out.shape[1:])
            if offset:
                out = out.astype(np.float32) + offset
            return out.astype(leaf.dtype)

        sharding = jax.NamedSharding(mesh, leaf.sharding.spec)
        return jax.make_array_from_callback(leaf.shape, sharding, read)

    return jax.tree_util.tree_map_with_path(place, abstract)


def _read_part(weights: SafetensorsDir, name: str, index: tuple, how: Stored) -> np.ndarray:
    """Our slice `index` of the parameter stored as `how` in tensor `name`."""
    if how.depthwise:  # ours [K, C] <- [C, 1, K]
        taps, channels = (tuple(index) + (slice(None),) * 2)[:2]
        return weights.read(name, (channels, slice(None), taps))[:, 0].T
    if how.transposed:  # ours [.., in, out] <- the file's [.., out, in]
        index = tuple(index) + (slice(None),) * (len(weights.shape(name)) - len(index))
        *lead, rows, cols = index
        if how.halves:  # our part of the out axis: the whole part read, then our slice
            part = np.swapaxes(weights.read(name, (*lead, slice(None), rows)), -1, -2)
            width = part.shape[-1] // how.parts
            return part[..., how.part * width:(how.part + 1) * width][..., cols]
        return np.swapaxes(weights.read(name, (*lead, cols, rows)), -1, -2)
    if how.parts == 1 or not index:
        return weights.read(name, index)
    last, n = index[-1], how.parts
    span = slice(None if last.start is None else last.start * n,
                 None if last.stop is None else last.stop * n)
    return weights.read(name, (*index[:-1], span))[..., how.part::n]


def abstract_model(cfg: ModelConfig, mesh, choice: AttentionChoice = UNPLANNED):
    """(graphdef, parameters as ShapeDtypeStructs with their shardings, the other state)."""
    with jax.set_mesh(mesh):
        net = nnx.eval_shape(lambda: Transformer(cfg, mesh, nnx.Rngs(0), choice))
    return nnx.split(net, nnx.Param, ...)


def model_config(path: str, **overrides) -> ModelConfig:
    """ModelConfig from PATH/config.json; `overrides` set fields config.json does not hold
    (dtype, remat, scan_layers, ...) or replace those it does."""
    fields, stored = read_config(path)
    fields.update(param_dtype=stored, dtype=stored)
    fields.update(overrides)
    fields["rope_scaling"] = RopeScaling.from_config(fields["rope_scaling"])
    return ModelConfig(**fields)


def load(path: str, *, mesh=None, choice: AttentionChoice = UNPLANNED,
         **overrides) -> Transformer:
    """A Transformer with the checkpoint's weights, on `mesh` (default: one device, so that
    `m(tokens)` just works), attending as `choice` says (parallel.AttentionChoice; default:
    striped, by ring, the backend's kernel). Parameters and compute keep the stored dtype unless
    `param_dtype=` / `dtype=` say otherwise; other ModelConfig fields may be given too."""
    if "param_dtype" in overrides and "dtype" not in overrides:
        overrides["dtype"] = overrides["param_dtype"]
    cfg = model_config(path, **overrides)
    if mesh is None:
        mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    graphdef, abstract, rest = abstract_model(cfg, mesh, choice)
    params = load_params(open_weights(path, cfg), cfg, abstract, mesh)
    return nnx.merge(graphdef, params, rest)


def hf_tensors(params, cfg: ModelConfig, dtype: str):
    """(Hugging Face name, host array in `dtype`) for each tensor of the parameters, one at a
    time (a sharded array is gathered to the host one tensor at a time)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    pending = {}  # tensor name -> {part: array}: an interleaved tensor waits for its parts
    for path, leaf in flat:
        names, how = _source(_key_path(path), cfg)
        offset = _offset(_key_path(path), cfg)
        if jax.process_count() > 1:
            host = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        else:
            host = np.asarray(jax.device_get(leaf))
        parts = host.reshape(names.size, *host.shape[names.ndim:])
        for name, part in zip(names.reshape(-1), parts):
            if offset:
                part = part.astype(np.float32) - offset
            if how.depthwise:
                part = part.T[:, None, :]
            part = np.swapaxes(part, -1, -2) if how.transposed else part
            part = part.astype(jax.numpy.dtype(dtype))
            if how.parts == 1:
                yield str(name), part
                continue
            got = pending.setdefault(str(name), {})
            got[how.part] = part
            if len(got) == how.parts:  # all there: one after the other, or interleaved
                ordered = [got[i] for i in range(how.parts)]
                if how.halves:
                    yield str(name), np.concatenate(ordered, axis=-2)
                else:
                    whole = np.stack(ordered, axis=-1)
                    yield str(name), whole.reshape(*part.shape[:-1], -1)
                del pending[str(name)]


def save(m: Transformer, path: str, *, dtype: str | None = None,
         max_shard_bytes: int = 5 << 30, max_position_embeddings: int = 0,
         eos_token_id: int | None = None) -> list[str]:
    """Writes the model as a Hugging Face directory of its family (config.json and safetensors,
    sharded past max_shard_bytes) into PATH, in `dtype` (default: the parameters' own); the context
    length it was trained for and its tokenizer's end-of-sequence id go into config.json when
    given. The files are
    written into PATH.tmp and PATH replaced only once they are complete; with several
    processes, process 0 writes. Returns the files written.

    transformers 4.57 and 5.x both load what it writes, with the same logits (config.json holds
    both versions' RoPE keys, Granite's layer names are the published ones), except where 4.57's
    own model computes otherwise: GPT-OSS's SwiGLU limit is fixed at 7.0 there, whatever
    config.json says, and its Mamba2 layers with more than one group differ from 5.x's (the
    published GPT-OSS and Granite 4.0 files have 7.0 and one group)."""
    cfg = m.cfg
    dtype = dtype or cfg.param_dtype
    if dtype not in DTYPES:
        raise HFError(f"hf.save: dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    config = config_json(cfg, dtype, max_position_embeddings, eos_token_id)  # HFError first
    tensors = hf_tensors(nnx.state(m, nnx.Param), cfg, dtype)
    if jax.process_index() != 0:  # the other processes take part in each tensor's gather
        for _ in tensors:
            pass
        return []
    tmp = f"{path.rstrip('/')}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    files = write(tmp, tensors, max_shard_bytes)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    _replace_dir(tmp, path)
    return files + ["config.json"]


def _replace_dir(tmp: str, path: str) -> None:
    """PATH becomes TMP's contents; an old PATH is moved aside first and removed last."""
    old = f"{path.rstrip('/')}.old"
    if os.path.exists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
