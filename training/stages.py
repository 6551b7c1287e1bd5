"""Length stages: one config, one workdir, several trainings in a row, each from the weights the
one before ended with: how a model's context is extended (1k -> 8k -> 32k, the RoPE base or
scaling raised with it).

    config.stages = (
        dict(name="1k", steps=150),                                   # the config as it is
        dict(name="8k", steps=50, seq_len=8192, global_batch_size=1,
             model=dict(rope_theta=80_000.0), optim=dict(warmup_steps=5)),
    )

A stage sets `steps` (its optimizer steps) and any config fields besides, nested as in the config
(`model=dict(rope_scaling=dict(rope_type="yarn", factor=8.0, ...))`, `mesh=dict(seq=8)`); what it
does not set is the config's. Stage k trains in WORKDIR/stageK, a run of its own (checkpoints,
lock, resume), started with init_from=run:WORKDIR/stage{K-1}@LAST: the weights, a fresh optimizer
and learning-rate schedule, and data drawn with seed + k (the first stage starts from
config.init_from). A stopped or preempted run resumes inside the stage it was in; finished stages
are skipped. Metrics go to WORKDIR/metrics.jsonl and one wandb run on one time axis: step =
the steps of the stages before + the step in the stage, and `progress/stage` = K.

From the command line (training/cli.py reads it: apply_stage_flags): --config.FIELD changes
the config, so every stage that does not set FIELD; --config.num_train_steps=N makes every
stage N steps; --config.stages.K.FIELD=VALUE sets stage K's FIELD.
"""

from __future__ import annotations

import dataclasses

import jax

import run_config
from run_config import ConfigError, moved_field_error
from storage.run_dir import RunDir
from training import init_from
from training.saved_run import saved_steps
from training.trackers import say
from training.validate import validate_config

NOT_STAGED = ("stages", "init_from", "num_train_steps")  # what a stage sets otherwise, or never


@dataclasses.dataclass(frozen=True)
class Stage:
    """Where a stage sits in the run: what its trackers and its start need."""

    index: int  # 1-based
    count: int
    name: str  # the entry's name, or "stage K"
    workdir: str  # WORKDIR/stageK
    top: str  # WORKDIR: metrics.jsonl and wandb's files, for every stage
    offset: int  # the steps of the stages before
    total: int  # the steps of all stages
    explicit: tuple[str, ...]  # the fields this stage sets ('seq_len', 'model.rope_theta', ...)


def _flatten(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in dict(values).items():
        name = f"{prefix}{key}"
        if hasattr(value, "items") and name != "model.rope_scaling":
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def plan(config, workdir: str) -> list[tuple[Stage, run_config.RunConfig]]:
    """(Stage, its config) for each entry of config.stages (config: a RunConfig);
    ConfigError, one line, for a stage without steps or naming a field the config does not
    have."""
    entries = [dict(entry) for entry in config.stages]
    total = 0
    for i, entry in enumerate(entries, 1):
        steps = entry.get("steps", 0)  # a stage entry, not a config field: 0 = none given
        if not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"stage {i}: steps={steps!r}: each stage needs steps >= 1 "
                              f"(its optimizer steps)")
        total += steps
    out, offset = [], 0
    for i, entry in enumerate(entries, 1):
        fields = _flatten({k: v for k, v in entry.items() if k not in ("steps", "name")})
        for name in fields:
            _check_stageable(name, i)
        own = {"stages": (), "num_train_steps": entry["steps"], "seed": config.seed + i - 1}
        if i > 1:
            own["init_from"] = ""  # set once the stage before has finished
        if not config.data.cache_dir:  # one tokenizer and token cache for every stage
            own["data.cache_dir"] = RunDir(workdir).cache
        if config.stop_at_step:  # one time axis: stop_at_step counts the steps of all stages
            stop = config.stop_at_step - offset
            own["stop_at_step"] = stop if 0 < stop <= entry["steps"] else 0
        try:
            stage_config = run_config.replace(config, {**own, **fields})
        except ConfigError as e:
            raise ConfigError(f"stage {i}: {e}") from None
        out.append((Stage(i, len(entries), str(entry.get("name") or f"stage {i}"),
                          RunDir(workdir).stage(i).root, workdir, offset, total,
                          tuple(fields)), stage_config))
        offset += entry["steps"]
    return out


def _check_stageable(name: str, index: int) -> None:
    if moved_field_error(name):
        raise ConfigError(f"stage {index}: {moved_field_error(name)}")
    if not run_config.has_field(name) or name.split(".")[0] in NOT_STAGED:
        raise ConfigError(f"stage {index} sets {name!r}, which is not a config field a "
                          f"stage can set: use the names of the config file (seq_len, "
                          f"model.rope_theta, mesh.seq, optim.learning_rate, ...)")


def last_step(stage: Stage) -> int | None:
    """The newest checkpoint step of a stage, None when it has none."""
    steps = saved_steps(stage.workdir)
    return steps[-1] if steps else None


def train_stages(config, workdir: str, explicit, train) -> dict:
    """Runs the stages in order with `train(stage_config, stage_workdir, explicit, stage)`
    (training.loop's), skipping finished ones; returns the last stage's metrics. Every stage's
    config is checked before the first trains."""
    stages = plan(config, workdir)
    _check(stages, explicit)
    last, previous = {}, None
    for stage, stage_config in stages:
        steps = stage_config.num_train_steps
        if last_step(stage) == steps:
            say(f"ringstripe: stage {stage.index}/{stage.count} ({stage.name}) finished "
                f"earlier, {steps} steps: skipped")
            previous = (stage, steps)
            continue
        say(f"ringstripe: stage {stage.index}/{stage.count} ({stage.name}): "
            f"{stage_config.seq_len:,} tokens a sequence, {steps} steps, in {stage.workdir}")
        if previous is not None and stage_config.init_from == "":
            stage_config = run_config.replace(
                stage_config, {"init_from": f"run:{previous[0].workdir}@{previous[1]}"})
        last = train(stage_config, stage.workdir, tuple(explicit) + stage.explicit, stage)
        if last_step(stage) != steps:  # stopped (stop_at_step, preemption): resume later
            return last
        if config.stop_at_step and config.stop_at_step <= stage.offset + steps:
            return last  # asked to stop at this stage's last step: the next one waits
        previous = (stage, steps)
    return last


def _check(stages, explicit) -> None:
    """Every stage's config validated before the first trains: the first stage's model (from
    its init_from source, if any) is every stage's, since each continues its weights."""
    first_stage, first = stages[0]
    first, _ = init_from.resolve(first, first_stage.workdir,
                                 tuple(explicit) + first_stage.explicit)
    shapes = {f"model.{name}": getattr(first.model, name) for name in init_from.SHAPE_FIELDS}
    for stage, config in stages:  # the stage trains from its own config, as planned
        validate_config(run_config.replace(config, shapes), jax.device_count(),
                        jax.process_count(), jax.default_backend())
