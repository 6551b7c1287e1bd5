"""Where a run's first weights come from: `config.init_from`.

    ''                       random weights, drawn from config.seed
    'hf:PATH'                a Hugging Face directory, local or gs:// (model/hf/config_json.py,
                             checkpoint.py; the families: model/hf/families/): config.json
                             fills the run's config.model, its tokenizer (tokenizer.json, or
                             tokenizer.model) becomes the run's
    'run:WORKDIR[@STEP]'     another run's checkpoint (its latest, or STEP): the weights only, the
                             optimizer starts fresh. A new stage: how seq_len, the RoPE settings,
                             the mesh or the batch change on purpose

    config, source = resolve(config, workdir, explicit={"model.rope_theta"})  # a filled copy
    params = initial_params(source, model_cfg, abstract_params, mesh)

Only a start reads it: once the run's own workdir has a checkpoint, a resume restores that.
The model's shape (SHAPE_FIELDS) always comes from the source; a shape field set on the command
line to another value is a contradiction (ConfigError, one line). The RoPE settings and norm_eps
come from the source unless set explicitly (on the command line, or by a length stage): a
context extension changes exactly those.
"""

from __future__ import annotations

import dataclasses

import jax

import data
import model
import run_config
import storage
from checkpoints import Checkpointer
from model import hf
from model.config import (AUTO, FUNCTION, SHAPE, TRAINING, ModelConfig, MoEConfig,
                          weight_fields)
from model.rope import RopeScaling
from run_config import ConfigError
from storage.run_dir import RunDir
from training.resume import saved_config, saved_tokenizer_file
from training.saved_run import RunError, saved_meta, saved_steps

# What the source's weights fix (their shapes, and what they were trained to compute:
# model/config.py marks them); scan_layers is how a run stacked them, not the model (resolve).
SHAPE_FIELDS = tuple(name for name in weight_fields(ModelConfig, SHAPE, FUNCTION)
                     if name != "scan_layers")
# The source's unless set explicitly: what a context extension changes.
CHOSEN_FIELDS = ("rope_theta", "rope_scaling", "norm_eps", "rope_local_theta", "sliding_window")
# A source from before a field existed was made with its default (run_config/schema.py's).
_DEFAULTS = {name: getattr(run_config.build({}).model, name)
             for name in SHAPE_FIELDS + CHOSEN_FIELDS}


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # 'hf' | 'run'
    path: str  # the model directory, or the run's workdir
    step: int | None = None  # run: the checkpoint (None: the latest when resolved)
    meta: dict | None = dataclasses.field(default=None, compare=False, repr=False)  # run: its
    # checkpoint's record (a next stage continues its progress counters and wandb run)

    def __str__(self):
        return f"{self.kind}:{self.path}" + (f"@{self.step}" if self.step is not None else "")


def parse(spec: str) -> Source | None:
    """'hf:PATH' | 'run:WORKDIR[@STEP]' | '' -> Source or None; ConfigError otherwise."""
    if not spec:
        return None
    kind, _, rest = spec.partition(":")
    if kind == "hf" and rest:
        return Source("hf", rest)
    if kind == "run" and rest:
        path, at, step = rest.rpartition("@") if "@" in rest else (rest, "", "")
        if at and not step.isdigit():
            raise ConfigError(f"init_from={spec!r}: the step after '@' must be a number "
                              f"(run:WORKDIR@STEP)")
        return Source("run", path, int(step) if at else None)
    raise ConfigError(f"init_from={spec!r}: use 'hf:PATH' (a Hugging Face model directory) or "
                      f"'run:WORKDIR[@STEP]' (another run's checkpoint), or '' for random weights")


def resolve(config, workdir: str, explicit=()) -> tuple[object, Source | None]:
    """(the run's config, its source): `config` (a RunConfig) with the source's model settings
    and tokenizer read in (model section, and data.tokenizer_path unless set), its files
    checked; `config` itself without init_from. Writes nothing. `explicit`: the config fields
    given explicitly ('model.rope_theta', ...), which win over the source's.

    A run that already has checkpoints of its own takes those settings from its latest one
    instead: a resume needs neither the source's files nor their being unchanged."""
    source = parse(config.init_from)
    if source is None:
        return config, None
    updates = {}
    if saved_steps(workdir):
        _, fields, tokenizer = _from_run(Source("run", workdir))
    elif source.kind == "hf":
        fields, tokenizer = _from_hf(source.path)
    else:
        source, fields, tokenizer = _from_run(source)
        ours = config.model.scan_layers
        if ours == AUTO:  # the weights come stacked as the source stacked them
            updates["model.scan_layers"] = fields["scan_layers"]
        elif fields["scan_layers"] != ours:
            raise ConfigError(f"init_from={source}: that run's layers are "
                              f"{'' if fields['scan_layers'] else 'not '}stacked: set "
                              f"--config.model.scan_layers={fields['scan_layers']}")
    explicit = set(explicit)
    fields = {**_DEFAULTS, **fields}  # a source from before a field existed: its default
    for name in SHAPE_FIELDS:
        ours = getattr(config.model, name)
        if f"model.{name}" in explicit and _same(ours) != _same(fields[name]):
            raise ConfigError(f"model.{name}={ours} contradicts {source} ({name} "
                              f"{fields[name]}): drop --config.model.{name}, whose value the "
                              f"checkpoint fixes")
        updates[f"model.{name}"] = _same(fields[name])
    for name in CHOSEN_FIELDS:
        if f"model.{name}" in explicit:
            continue
        value = fields[name]
        if name == "rope_scaling":  # the source's rule; parameters set one by one amend it
            given = [e.split(".")[2] for e in explicit if e.startswith("model.rope_scaling.")]
            value = RopeScaling.from_config(
                {**dict(value), **{k: getattr(config.model.rope_scaling, k) for k in given}})
        updates[f"model.{name}"] = value
    updates.update(_expert_fields(config, fields.get("moe"), explicit, source))
    if not config.data.tokenizer_path and tokenizer:
        updates["data.tokenizer_path"] = tokenizer
    config = run_config.replace(config, updates)
    if source.kind == "hf" and not saved_steps(workdir):
        _check_hf_files(source.path, config)
    return config, source


def _expert_fields(config, moe, explicit: set, source) -> dict:
    """The model.moe.* updates from the source's experts (a MoEConfig from config.json, a
    run's dict; None: a model without experts, whose default is no experts): its
    architecture as the shape, its training settings (TRAINING) unless set explicitly."""
    moe = dataclasses.asdict(moe) if dataclasses.is_dataclass(moe) else dict(moe or {})
    moe = moe if moe.get("num_experts") else {"num_experts": 0}  # a dense source: no experts
    architecture = weight_fields(MoEConfig, SHAPE, FUNCTION)
    updates = {}
    for name in architecture + weight_fields(MoEConfig, TRAINING):
        if name not in moe:
            continue
        if f"model.moe.{name}" in explicit:
            ours = getattr(config.model.moe, name)
            if name in architecture and _same(ours) != _same(moe[name]):
                raise ConfigError(f"model.moe.{name}={ours} contradicts {source} ({name} "
                                  f"{moe[name]}): drop --config.model.moe.{name}, whose value "
                                  f"the checkpoint fixes")
            continue
        updates[f"model.moe.{name}"] = _same(moe[name])
    return updates


def _same(value):
    """A config value as it compares: a list (JSON) as the tuple it stands for."""
    return tuple(value) if isinstance(value, list) else value


def _from_hf(path: str) -> tuple[dict, str]:
    try:
        fields, _ = hf.read_config(path)
    except hf.HFError as e:
        raise ConfigError(f"init_from: {e}") from None
    tokenizer = next((storage.join(path, name) for name in ("tokenizer.json", "tokenizer.model")
                      if storage.exists(storage.join(path, name))), "")
    return fields, tokenizer


def _check_hf_files(path: str, config) -> None:
    """The tensors against the (resolved) model config, and the tokenizer's vocabulary against
    the embedding: before a lock, a cache or a model is made."""
    cfg = model.ModelConfig.from_config(config.model, switches=model.MemorySwitches())  # shapes
    try:
        hf.open_weights(path, cfg)
    except hf.HFError as e:
        raise ConfigError(f"init_from: {e}") from None
    if not config.data.tokenizer_path:
        raise ConfigError(f"init_from: {path} has neither tokenizer.json nor tokenizer.model: "
                          f"set data.tokenizer_path to the model's tokenizer")
    tok = data.load_tokenizer(config.data.tokenizer_path)  # DataError: one line
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(f"init_from: tokenizer {tok.path} has {tok.vocab_size} pieces but the "
                          f"model {path} has {cfg.vocab_size} embedding rows: use the model's "
                          f"own tokenizer")


def _from_run(source: Source) -> tuple[Source, dict, str]:
    """(the source with its step, its model fields, its tokenizer file) from the run's
    checkpoint record; nothing in that run is written."""
    try:
        step, meta = saved_meta(source.path, source.step)
    except RunError as e:
        raise ConfigError(f"init_from={source}: {e}") from None
    saved = saved_config(meta)
    fields = {name: getattr(saved.model, name) for name in SHAPE_FIELDS + CHOSEN_FIELDS}
    fields["rope_scaling"] = dataclasses.asdict(saved.model.rope_scaling)
    fields["scan_layers"] = saved.model.scan_layers
    fields["moe"] = saved.model.moe
    tokenizer = saved_tokenizer_file(meta, saved, source.path)
    return Source("run", source.path, step, meta), fields, tokenizer


def initial_params(source: Source, cfg, abstract_params, mesh):
    """The source's weights as the run's parameters, each placed with the sharding of
    `abstract_params` (ShapeDtypeStructs): tensor by tensor for a Hugging Face directory, a
    partial restore (parameters only) for a run."""
    if source.kind == "hf":
        return hf.load_params(hf.open_weights(source.path, cfg), cfg, abstract_params, mesh)
    placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=jax.NamedSharding(mesh, x.sharding.spec)), abstract_params)
    checkpointer = Checkpointer(RunDir(source.path).checkpoints, read_only=True)
    try:
        return checkpointer.restore_params(source.step, placed)
    finally:
        checkpointer.close()
