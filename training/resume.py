"""What a checkpoint carries besides arrays, and the checks made before a run writes anything.

The JSON record saved with every checkpoint:

    {"config": {...}, "data": {"seed": 0, "step": 120}, "tokenizer_path": "cache/tokenizer-…model",
     "run": {"tokenizer": "5be0c1d2a3f4e5d6", "data": "0a1b2c3d4e5f6a7b"}, "wandb_run_id": "3f9a1c2b",
     "train_time_s": 812.4, "train_tokens": 983040, "code_version": "ringstripe 0.1.0 (git 1a2b3c4)",
     "mesh": [1, 4], "attention": {"layout": "striped", "strategy": "ring", "ulysses_degree": 1,
     "kernel": "xla", "tile_q": 32, "tile_k": 32}}

"attention" is what the run resolved (strategy 'auto' and kernel 'auto' replaced by what ran);
"config" keeps what was asked. Checkpoints written before the layout field was renamed hold
"attention": "<layout>" and a config with parallel.attention; `saved_config` gives such a config
the new field name (nothing reads the record's "attention").

The data position is only (seed, step): batches are a pure function of them, so a run resumes on
any mesh, process count or attention layout and sees the same tokens in the same order. That
holds while what defines the run stays: the tokenizer (its fingerprint, "run.tokenizer"), the
corpus (the fingerprint of its files, "run.data"), seq_len, global_batch_size, seed and the eval
split. A resume compares them (check_same_run) and refuses a change, unless config.resume_accepts
names it. Paths are stored relative to the workdir, so a copied run resumes and samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import tempfile
from importlib import metadata

import data
import storage
from storage.run_dir import RunDir
from checkpoints import CheckpointError
from checkpoints.manager import short_error
import run_config
from model.config import AUTO, MemorySwitches, parameter_fields
from run_config import RENAMED_FIELDS, ConfigError
from training.state import TrainState

# What defines a run besides the model's shapes: name -> (where the checkpoint has it, the
# config field a user sets to match it, or None for a fingerprint).
RUN_FIELDS = {
    "tokenizer": (("run", "tokenizer"), None),
    "data": (("run", "data"), None),
    "seq_len": (("config", "seq_len"), "seq_len"),
    "global_batch_size": (("config", "global_batch_size"), "global_batch_size"),
    "seed": (("config", "seed"), "seed"),
    "eval_fraction": (("config", "data", "eval_fraction"), "data.eval_fraction"),
}


def data_fingerprint(config) -> str:
    """Changes when the corpus's files (or TFDS split), the byte budget or the share of
    passkey examples change."""
    description = data.describe_source(config.data.source, data.source_options(config.data))
    passkeys = config.data.passkey_fraction
    # Fields at their defaults stay out of it: older runs keep their fingerprint.
    default = run_config.defaults()["data"]
    examples = {name: getattr(config.data, name) for name in
                ("passkey_min_len", "passkey_weight", "passkey_repeats")
                if getattr(config.data, name) != default[name]}
    key = json.dumps([description, config.data.max_bytes]
                     + ([passkeys] if passkeys else []) + ([examples] if examples else []))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def run_identity(config) -> dict:
    """This run's values of RUN_FIELDS but the tokenizer's, which exists only once the data is
    prepared (the train loop adds it: {"tokenizer": tokenizer.fingerprint})."""
    return {"data": data_fingerprint(config), "seq_len": config.seq_len,
            "global_batch_size": config.global_batch_size, "seed": config.seed,
            "eval_fraction": config.data.eval_fraction}


def check_same_run(config, directory: str, step: int, meta: dict, identity: dict) -> None:
    """Raises CheckpointError naming the first field of RUN_FIELDS whose value differs from the
    checkpoint's, unless config.resume_accepts lists it. Fields a checkpoint lacks (written
    before they were recorded) are not compared."""
    accepted = config.resume_accepted
    for name, (where, field) in RUN_FIELDS.items():
        saved = meta
        for key in where:
            saved = saved.get(key, {}) if isinstance(saved, dict) else {}
        if name not in identity or saved == {} or saved == identity[name] or name in accepted:
            continue
        how = (f"set --config.{field}={saved} to continue that run, or "
               if field else "restore the corpus and tokenizer it was trained on, or ")
        what = (f"{field}={saved} but this run has {field}={identity[name]}" if field else
                f"{name} fingerprint {saved} but this run's is {identity[name]} (the "
                + ("corpus changed: files added, removed or edited, as a Python upgrade does to "
                   "stdlib, or data.max_bytes)" if name == "data" else "tokenizer changed)"))
        raise CheckpointError(
            f"the checkpoint at step {step} in {directory} was trained with {what}: {how}"
            f"--config.resume_accepts={name} to continue its weights with the change on "
            f"purpose, or use another --workdir")


def tokenizer_location(config, workdir: str, tokenizer) -> str:
    """Where the run's tokenizer file is, as the checkpoint records it: inside the workdir,
    relative to it (a copied or moved run still finds it; a bucket run names the bucket's copy,
    not this host's mirror)."""
    if config.data.tokenizer_path:
        return storage.relative_to(config.data.tokenizer_path, workdir)
    cache_dir = data.cache_location(config, workdir)
    return storage.relative_to(storage.join(cache_dir, os.path.basename(tokenizer.path)),
                               workdir)


def saved_tokenizer_file(meta: dict, config, workdir: str) -> str:
    """The tokenizer a checkpoint names, as a local file: relative to the workdir (an older
    checkpoint names an absolute path: if that is gone, the file of that name in the run's
    cache); a bucket's file is copied to this host's mirror first. DataError when missing."""
    recorded = meta.get("tokenizer_path") or config.data.tokenizer_path
    if not recorded:
        raise data.DataError(f"the checkpoint in {workdir} names no tokenizer: train it again "
                             f"with this version, or set data.tokenizer_path when training")
    candidates = [storage.resolve(recorded, workdir)]
    if os.path.isabs(recorded):  # written before paths were relative: the run may have moved
        candidates.append(storage.join(RunDir(workdir).cache, os.path.basename(recorded)))
    for location in candidates:
        if storage.is_remote(location):
            local = storage.mirror(location)
            folder, name = location.rsplit("/", 1)
            storage.pull(folder, os.path.dirname(local), [name])
            location = local
        if os.path.isfile(location):
            return location
    raise data.DataError(f"the run's tokenizer {candidates[0]} is missing: copy the run with "
                         f"its cache/ directory")


def checkpoint_meta(config, state: TrainState, mesh_shape, tokenizer_path: str = "",
                    resolved=None, identity: dict | None = None) -> dict:
    """The record saved with `state`'s arrays (training.state.TrainState: its step and seed,
    the data position; its progress counters); tokenizer_path: tokenizer_location's answer;
    resolved: the run's planner.ResolvedRun (what 'auto' resolved to: strategy, degree,
    kernel, tiles, memory switches); identity: run_identity's fingerprints."""
    identity, progress = identity or {}, state.progress
    return {"config": run_config.to_dict(config),
            "data": {"seed": state.seed, "step": int(state.step)},
            "tokenizer_path": tokenizer_path,
            "run": {k: identity[k] for k in ("tokenizer", "data") if k in identity},
            "wandb_run_id": progress.wandb_run_id, "train_time_s": progress.train_time_s,
            "train_tokens": progress.train_tokens, "code_version": code_version(),
            "mesh": list(mesh_shape),
            **(resolved.sections() if resolved is not None else
               {"attention": config.parallel.layout, "memory_switches": {}})}


def saved_config(meta: dict) -> run_config.RunConfig:
    """The run config a checkpoint was written with, its renamed and moved fields under their
    new names (a checkpoint from before a rename still samples and resumes; model.tile_q and
    tile_k make parallel.tile), fields it predates at their defaults, and its memory switches
    and layout as the run resolved them where it left them 'auto' (scan_layers decides how its
    weights are stacked; the layout, how a reader lays out its prompts)."""
    values = run_config.plain(meta["config"])
    model, parallel = dict(values.get("model", {})), dict(values.get("parallel", {}))
    for old, new in RENAMED_FIELDS.items():
        (section, field), (_, field_now) = old.split("."), new.split(".")
        named = {"model": model, "parallel": parallel}.get(section, {})
        if field in named:
            named[field_now] = named.pop(field)
    if "tile_q" in model:  # moved into parallel.tile: the tiles the run ran with, or 0
        tiles = (model.pop("tile_q"), model.pop("tile_k", 0))
        parallel["tile"] = tuple(tiles) if any(tiles) else 0
    recorded = meta.get("attention")
    if parallel.get("layout") == AUTO and isinstance(recorded, dict):
        parallel["layout"] = recorded["layout"]  # what the run resolved 'auto' to
    ran = {**MemorySwitches().record(), **meta.get("memory_switches", {})}
    switches = {k: v for k, v in ran.items() if model.get(k, AUTO) == AUTO}
    return run_config.build({**values, "model": {**model, **switches}, "parallel": parallel},
                            strict=False)


def check_compatible(directory: str, step: int, meta: dict, model_cfg) -> None:
    """Raises CheckpointError when the checkpoint's parameters were made with another value of
    a field that shapes them (model.parameter_fields: qk_norm, moe.num_experts, scan_layers,
    ...) than this run's resolved model.ModelConfig `model_cfg` has. A field the record lacks
    (saved before it existed) counts as its default (run_config/schema.py's), which that model
    was built with."""
    # The defaults where the record lacks a field, 'auto' as the run resolved it
    saved = saved_config(meta).model
    for name in parameter_fields():
        theirs = run_config.field_value(saved, name)
        ours = run_config.field_value(model_cfg, name)
        if theirs != ours:
            raise CheckpointError(
                f"the checkpoint at step {step} in {directory} has model.{name}={theirs} "
                f"but this run has model.{name}={ours}: use another --workdir, "
                f"or set --config.model.{name}={theirs} to continue that run")


def check_inputs(config, workdir: str) -> None:
    """User errors that need no devices: data source, tokenizer file, workdir. Writes nothing."""
    path = config.data.tokenizer_path
    if path and not (storage.exists(path) if storage.is_remote(path) else os.path.isfile(path)):
        raise ConfigError(f"data.tokenizer_path {path!r} does not exist: point it at a "
                          f"sentencepiece .model or a tokenizer.json file, or set it to '' to "
                          f"train one")
    options = data.source_options(config.data)
    data.describe_source(config.data.source, options)  # DataError when missing or empty
    if next(iter(data.iter_documents(config.data.source, options)), None) is None:  # one doc
        raise data.DataError(f"data.source {config.data.source!r} holds no document: point it "
                             f"at text files")
    _check_writable(workdir)


def _check_writable(workdir: str) -> None:
    if storage.is_remote(workdir):
        return _check_bucket_writable(workdir)
    path = os.path.abspath(workdir)
    while not os.path.exists(path):  # the nearest existing ancestor must accept new entries
        path = os.path.dirname(path)
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"workdir {workdir!r} is not writable ({path} is not a writable "
                          f"directory): choose another --workdir")
    # Permission bits do not tell everything (root may "write" to /proc, a read-only mount):
    # create and remove an empty directory there, so that nothing is left either way.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ringstripe-probe-", dir=path))
    except OSError as e:
        raise ConfigError(f"workdir {workdir!r} cannot be created ({path}: "
                          f"{e.strerror or e}): choose another --workdir") from None


def _check_bucket_writable(workdir: str) -> None:
    """Writes and removes a probe object: a missing bucket, missing credentials or a read-only
    role show here, before anything is built."""
    probe = storage.join(workdir, f".ringstripe-probe-{secrets.token_hex(4)}")
    try:
        storage.replace(probe, b"")
        storage.remove(probe)
    except Exception as e:  # noqa: BLE001  (the store's errors have many types)
        raise ConfigError(f"workdir {workdir!r} cannot be written ({short_error(e)}): check the bucket's "
                          f"name and your credentials (gcloud auth application-default login), "
                          f"or choose another --workdir") from None


def code_version() -> str:
    try:
        version = metadata.version("ringstripe")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"ringstripe {version}" + (f" (git {commit})" if commit else "")
