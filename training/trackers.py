"""Where metrics go: metrics.jsonl always, wandb optionally, and the console.

Every tracker is a `Tracker`: `log(step, metrics)`, `event(step, message, fields)`, `persist()`
(with each checkpoint) and `close()`. Only process 0 writes; other processes get the no-op
tracker. A new destination is one subclass and one line in make_trackers.
"""

from __future__ import annotations

import abc
import json
import math
import os
import sys
import time

import jax

import run_config
import storage
from parallel import get_strategy
from storage.run_dir import RunDir


def say(message: str) -> None:
    """A line of the run's own on the console, from process 0 only (the others would repeat it)."""
    if jax.process_index() == 0:
        print(message, flush=True)


class Tracker(abc.ABC):
    """A destination of the run's metrics (step: the run's step, one time axis)."""

    @abc.abstractmethod
    def log(self, step: int, metrics: dict) -> None:
        """A logged step's metrics (numbers; a list is a curve, eval/loss_by_position)."""

    def event(self, step: int, message: str, fields: dict) -> None:
        """Something that happened at `step` (resumed, stopped on request)."""

    def profile(self, step: int, summary: dict, directory: str) -> None:
        """config.profile's trace ended at `step`: where its time went (training/analysis/profile.py's
        summary) and the local directory of the trace."""

    def persist(self) -> None:
        """Called with each checkpoint: what was logged so far is made durable."""

    def close(self) -> None:
        """The run's end (or its failure): flush and let go."""


class NullTracker(Tracker):
    def log(self, step: int, metrics: dict) -> None:
        pass


class JsonlTracker(Tracker):
    """One JSON object per logged step in WORKDIR/metrics.jsonl.

    On a resume from step N the rows after N (logged before a kill, and about to be logged
    again) are dropped, so the file keeps one row per step. In an object store, where a file
    cannot be appended to, rows go to a local copy that is uploaded whole at most every
    UPLOAD_EVERY_S seconds, with each checkpoint and at close."""

    UPLOAD_EVERY_S = 30.0

    def __init__(self, location: str, resumed_step: int = 0):
        self.location, self._remote = location, storage.is_remote(location)
        self.path = storage.mirror(location) if self._remote else location
        if self._remote:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            remote = storage.path(location)
            if remote.exists():
                remote.copy(self.path, overwrite=True)
            elif os.path.exists(self.path):
                os.remove(self.path)  # a copy of some earlier run's file
        _keep_rows_through(self.path, resumed_step)
        self._file = open(self.path, "a", buffering=1)
        self._uploaded = time.monotonic()

    def log(self, step, metrics):
        row = {"step": int(step), "time": time.time()}
        row.update({k: _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        if self._remote and time.monotonic() - self._uploaded > self.UPLOAD_EVERY_S:
            self._upload()

    def event(self, step, message, fields):
        self.log(step, {"event": message, **fields})

    def profile(self, step, summary, directory):
        self.event(step, "profiled", {f"profile/{k}": v for k, v in summary.items()})

    def persist(self):
        self._upload() if self._remote else self._file.flush()

    def close(self):
        self._file.close()
        if self._remote:
            self._upload()

    def _upload(self):
        if not self._file.closed:
            self._file.flush()
        storage.path(self.path).copy(self.location, overwrite=True)
        self._uploaded = time.monotonic()


def wandb_names(config, mesh_shape, choice) -> tuple[str, str, list[str]]:
    """(group, run name, tags). A group is one comparison: runs of one length, strategy, kernel,
    mesh and document masking, so that the layouts sit side by side in it, each run named by its
    layout (config.wandb_group, if set, names the group instead). Strategy and kernel are the
    resolved ones (choice: parallel.AttentionChoice), never 'auto'; usp carries its degree.

    e.g. striped at 16,384 on a 1x2 mesh: ('S16384-ring-xla-1x2-docs',
    'striped-S16384-ring-xla-1x2-docs', ['striped', 'strategy-ring', ...])."""
    layout, seq_len, kernel = choice.layout, config.seq_len, choice.kernel
    strategy = get_strategy(choice.strategy).label(choice.ulysses_degree).replace(" ", "")
    mesh = f"{mesh_shape[0]}x{mesh_shape[1]}"
    docs = "docs" if config.data.mask_documents else "nodocs"
    group = config.wandb_group or f"S{seq_len}-{strategy}-{kernel}-{mesh}-{docs}"
    tags = [layout, f"strategy-{strategy}", f"kernel-{kernel}", f"seq{seq_len}", f"mesh{mesh}",
            docs]
    return group, f"{layout}-{group}", tags


class WandbTracker(Tracker):
    """wandb on process 0: offline unless WANDB_MODE (or config.wandb_mode) says online.

    A resume continues the same wandb run. wandb drops points at steps below the last one it
    has, so the steps logged between the checkpoint and a kill would hide the ones logged again:
    online, the run is rewound to the checkpoint's step (resume_from), so the dashboard keeps
    one curve, from the checkpoint on as this start logs it. Offline runs cannot be rewound (the
    server does it): they resume and keep the first copy of those steps when synced."""

    def __init__(self, config, workdir: str, mesh_shape, resolved, run_id: str,
                 resumed_step: int = 0):
        """resolved: the run's planner.ResolvedRun (its attention names the group)."""
        import wandb  # imported here: it is slow to import and optional for other trackers

        group, name, tags = wandb_names(config, mesh_shape, resolved.attention)
        mode = os.environ.get("WANDB_MODE", config.wandb_mode)
        where = (dict(resume_from=f"{run_id}?_step={resumed_step}")
                 if resumed_step and mode == "online" else dict(id=run_id, resume="allow"))
        # wandb writes its files as they come, so a bucket run's are written on this machine
        # (in the workdir's mirror) and, offline, copied to WORKDIR/wandb/ in the bucket with
        # each checkpoint and at the end: a preempted VM takes its disk with it, and `wandb
        # sync` of the bucket's copy is then the only record of the run's curves.
        run_dir = RunDir(workdir)
        directory = run_dir.local
        os.makedirs(directory, exist_ok=True)
        self._copy_to = (storage.join(run_dir.root, "wandb")
                         if storage.is_remote(run_dir.root) and mode == "offline" else None)
        self._files, self._sent = os.path.join(directory, "wandb"), {}
        self._run = wandb.init(
            project=config.wandb_project, group=group, name=name,
            config={**run_config.to_dict(config), **resolved.sections()}, dir=directory,
            mode=mode, tags=tags, **where)

    def log(self, step, metrics):
        # Numbers only: the resolved attention's names are in the run's config (attention.*).
        # A list (eval/loss_by_position; moe/layerI/shares at evaluations) is a curve: drawn
        # against its index (a position range, an expert), one per step.
        import wandb  # (see __init__)
        row = {k: _plain(v) for k, v in metrics.items() if not isinstance(v, (str, list))}
        for key, values in metrics.items():
            if isinstance(values, list):
                row[key] = wandb.plot.line_series(
                    xs=list(range(len(values))), ys=[values], keys=[f"step {step}"],
                    title=f"{key} at step {step}",
                    xname="expert" if key.endswith("/shares") else "position range")
        self._run.log(row, step=int(step))

    def profile(self, step, summary, directory):
        """The shares as metrics (profile/*), and the trace's files uploaded with the run."""
        self._run.log({f"profile/{k}": v for k, v in summary.items()
                       if isinstance(v, (int, float))}, step=int(step))
        self._run.save(os.path.join(directory, "plugins", "profile", "*", "*"),
                       base_path=directory, policy="now")

    def persist(self):
        if self._copy_to:
            storage.push_changed(self._files, self._copy_to, self._sent)

    def close(self):  # (no events: wandb marks resumed runs itself; it keeps its own files)
        self._run.finish()
        self.persist()


class Console(Tracker):
    """A one-line progress bar on a terminal; plain log lines otherwise."""

    def __init__(self, total_steps: int, stream=None):
        self.total, self.stream = total_steps, stream or sys.stdout
        self.tty = self.stream.isatty()

    def log(self, step, metrics):
        loss = metrics.get("train/loss", float("nan"))
        text = f"step {step}/{self.total}  loss {loss:.4f}"
        if "throughput/tokens_per_sec" in metrics:
            step_time = metrics["throughput/step_time_s"]
            text += (f"  tokens/s {metrics['throughput/tokens_per_sec']:,.0f}  "
                     f"eta {_hms((self.total - step) * step_time)}")
        else:  # the first step of a start or resume: it compiled, so it is not timed
            text += "  (compiled)"
        if "moe/share_max" in metrics:  # the busiest expert's share of the routed tokens
            text += (f"  experts: max share {metrics['moe/share_max']:.3f} balance "
                     f"{metrics['moe/balance_loss']:.3f}")
            if metrics.get("moe/dropped"):
                text += f" dropped {metrics['moe/dropped']:.1%}"
        if "memory/host_peak_rss_gb" in metrics:
            text += f"  peak RSS {metrics['memory/host_peak_rss_gb']:.2f} GB"
        if "memory/device_peak_gb" in metrics:
            text += f"  device peak {metrics['memory/device_peak_gb']:.2f} GB"
        if "eval/loss" in metrics:
            text += f"  eval {metrics['eval/loss']:.4f} (ppl {metrics['eval/perplexity']:.1f})"
        if self.tty:
            done = int(30 * step / max(self.total, 1))
            self.stream.write(f"\r[{'#' * done}{'.' * (30 - done)}] {text}\033[K")
            if step >= self.total or "eval/loss" in metrics:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def event(self, step, message, fields):
        details = ", ".join(f"{k} {v}" for k, v in fields.items())
        self.stream.write(("\n" if self.tty else "") + f"{message} at step {step}: {details}\n")
        self.stream.flush()


class Trackers(Tracker):
    """Fans out to several trackers. With length stages (training/stages.py), a stage's steps
    go out on the run's one time axis: `offset` (the steps of the stages before) is added, and
    every row says its stage."""

    def __init__(self, trackers, offset: int = 0, stage: int = 0):
        self.trackers, self.offset = list(trackers), offset
        self.extra = {"progress/stage": stage} if stage else {}

    def log(self, step, metrics):
        for t in self.trackers:
            t.log(step + self.offset, {**metrics, **self.extra})

    def event(self, step, message, fields):
        for t in self.trackers:
            t.event(step + self.offset, message, fields)

    def profile(self, step, summary, directory):
        for t in self.trackers:
            t.profile(step + self.offset, summary, directory)

    def persist(self):
        for t in self.trackers:
            t.persist()

    def close(self):
        for t in self.trackers:
            t.close()


def make_trackers(config, workdir: str, mesh_shape, resolved, is_main: bool,
                  run_id: str, resumed_step: int = 0, stage=None) -> Trackers:
    """stage: a training.stages.Stage, whose metrics go to the staged run's WORKDIR and
    time axis (stage.top, stage.offset); None for a run of one stage."""
    if not is_main:
        return Trackers([NullTracker()])
    offset = stage.offset if stage else 0
    workdir = stage.top if stage else workdir
    trackers = [Console(stage.total if stage else config.num_train_steps)]
    if config.tracker in ("jsonl", "wandb"):
        trackers.append(JsonlTracker(RunDir(workdir).metrics,
                                     resumed_step + offset))
    if config.tracker == "wandb":
        trackers.append(WandbTracker(config, workdir, mesh_shape, resolved, run_id,
                                     resumed_step + offset))
    return Trackers(trackers, offset, stage.index if stage else 0)


def _keep_rows_through(path: str, last_step: int) -> None:
    """Cuts what a killed process left past `last_step` (the checkpoint a run resumes from; 0 for
    a start with no checkpoint, whose earlier rows are all logged again): its rows after that
    step, and half a line at the end.
    The file is rewritten aside and renamed, so a kill now loses nothing."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        content = f.read()
    lines = content.split(b"\n")
    complete = [line for line in lines[:-1]  # the last piece is '' or a torn row
                if json.loads(line)["step"] <= last_step]
    kept = b"".join(line + b"\n" for line in complete)
    if kept != content:
        with open(path + ".tmp", "wb") as f:
            f.write(kept)
        os.replace(path + ".tmp", path)


def _plain(value):
    if isinstance(value, int):  # a count (tiles, a degree) stays an integer in the JSON
        return value
    value = float(value) if hasattr(value, "__float__") else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
