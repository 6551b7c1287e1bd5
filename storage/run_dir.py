"""A run directory's layout, in one place: what train.py writes under --workdir and what
sample.py, scripts/hf/export.py, the planner and the launchers read there.

    WORKDIR/
      LOCK                    the trainer that holds the directory (checkpoints/lock.py)
      checkpoints/STEP/       Orbax's steps (checkpoints/manager.py)
      damaged_checkpoints/    steps that did not read, moved out of the way, never deleted
      cache/                  tokenizer and token cache (unless data.cache_dir says elsewhere)
      metrics.jsonl           one JSON object a logged step (training/trackers.py)
      wandb/                  wandb's files (a bucket run's are written in its local mirror;
                              offline, copied here with each checkpoint and at the end)
      errors.log              background threads' tracebacks, when a run ends with any
      profile/                jax.profiler traces (config.profile)
      launch/                 an engine's files: SLURM's batch script and job logs
                              (scripts/launch.py)
      stage1/, stage2/, ...   a staged run: each stage a run directory of its own
                              (training/stages.py); metrics.jsonl and wandb stay at the top

    run = RunDir("gs://b/runs/x")
    run.checkpoints            -> "gs://b/runs/x/checkpoints"
    run.stage(2).checkpoints   -> "gs://b/runs/x/stage2/checkpoints"
    run.local                  -> this machine's mirror of it (a local run: itself)

Paths only: nothing here reads or writes the directory but `stage_indices`, which lists it.
"""

from __future__ import annotations

import dataclasses
import json
import os

import storage

STAGE_PREFIX = "stage"  # stage K (1-based) trains in WORKDIR/stageK


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The files of the run whose --workdir is `root` (a local path or gs://BUCKET/PATH)."""

    root: str

    def __post_init__(self):
        object.__setattr__(self, "root", str(self.root))

    def __str__(self):
        return self.root

    def _join(self, *names: str) -> str:
        return storage.join(self.root, *names)

    @property
    def checkpoints(self) -> str:
        return self._join("checkpoints")

    @property
    def damaged_checkpoints(self) -> str:
        return self._join("damaged_checkpoints")

    @property
    def launch(self) -> str:
        return self._join("launch")

    @property
    def lock(self) -> str:
        return self._join("LOCK")

    @property
    def cache(self) -> str:
        """The default tokenizer and token cache directory (data.cache_dir '' means this)."""
        return self._join("cache")

    @property
    def metrics(self) -> str:
        return self._join("metrics.jsonl")

    @property
    def profile(self) -> str:
        return self._join("profile")

    @property
    def local(self) -> str:
        """A local directory for files that are written as they come (wandb's, the error log):
        the run directory itself, or for a bucket run its mirror on this machine."""
        return storage.mirror(self.root) if storage.is_remote(self.root) else self.root

    @property
    def errors_log(self) -> str:
        return storage.join(self.local, "errors.log")

    def stage(self, index: int) -> "RunDir":
        """Stage `index`'s (1-based) run directory, WORKDIR/stageK."""
        return RunDir(self._join(f"{STAGE_PREFIX}{index}"))

    def stage_indices(self) -> list[int]:
        """The K of every WORKDIR/stageK that exists, in order ([] for an unstaged run)."""
        top = storage.path(self.root)
        names = (p.name for p in top.iterdir()) if top.is_dir() else ()
        return sorted(i for i in map(stage_index, names) if i is not None)


def stage_index(name: str) -> int | None:
    """K for a directory named stageK, else None."""
    number = name[len(STAGE_PREFIX):]
    return int(number) if name.startswith(STAGE_PREFIX) and number.isdigit() else None


def read_metrics(workdir: str, keys) -> dict[int, dict[str, float]]:
    """{step: {key: value}} for `keys` from the run's metrics.jsonl (train.py's); a resumed
    run's later line for a step wins. FileNotFoundError, one line, for a run without one."""
    path = RunDir(workdir).metrics
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {path}: pass the --workdir of a train.py run")
    steps: dict[int, dict[str, float]] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            found = {k: row[k] for k in keys if k in row}
            if found:
                steps.setdefault(int(row["step"]), {}).update(found)
    return steps
