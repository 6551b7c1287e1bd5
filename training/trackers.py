"""Where metrics go: metrics.jsonl always, wandb optionally, and the console.

Every tracker has `log(step, metrics)` and `close()`. Only process 0 writes; other processes get
the no-op tracker.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time


class NullTracker:
    def log(self, step: int, metrics: dict) -> None:
        pass

    def event(self, step: int, message: str, fields: dict) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlTracker:
    """Appends one JSON object per logged step to WORKDIR/metrics.jsonl."""

    def __init__(self, path: str):
        self.path = path
        _drop_torn_last_line(path)
        self._file = open(path, "a", buffering=1)

    def log(self, step, metrics):
        row = {"step": int(step), "time": time.time()}
        row.update({k: _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")

    def event(self, step, message, fields):
        self.log(step, {"event": message, **fields})

    def close(self):
        self._file.close()


def wandb_names(config, mesh_shape, choice) -> tuple[str, str, list[str]]:
    """(group, run name, tags). A group is one comparison: runs of one length, strategy, kernel,
    mesh and document masking, so that the layouts sit side by side in it, each run named by its
    layout (config.wandb_group, if set, names the group instead). Strategy and kernel are the
    resolved ones (choice: parallel.AttentionChoice), never 'auto'; usp carries its degree.

    e.g. striped at 16,384 on a 1x2 mesh: ('S16384-ring-xla-1x2-docs',
    'striped-S16384-ring-xla-1x2-docs', ['striped', 'strategy-ring', ...])."""
    layout, seq_len, kernel = choice.layout, config.seq_len, choice.kernel
    strategy = choice.strategy + (str(choice.ulysses_degree) if choice.strategy == "usp" else "")
    mesh = f"{mesh_shape[0]}x{mesh_shape[1]}"
    docs = "docs" if config.data.get("mask_documents", True) else "nodocs"
    group = config.get("wandb_group") or f"S{seq_len}-{strategy}-{kernel}-{mesh}-{docs}"
    tags = [layout, f"strategy-{strategy}", f"kernel-{kernel}", f"seq{seq_len}", f"mesh{mesh}",
            docs]
    return group, f"{layout}-{group}", tags


class WandbTracker:
    """wandb on process 0: offline unless WANDB_MODE (or config.wandb_mode) says online."""

    def __init__(self, config, workdir: str, mesh_shape, choice, run_id: str):
        import wandb  # imported here: it is slow to import and optional for other trackers

        group, name, tags = wandb_names(config, mesh_shape, choice)
        self._run = wandb.init(
            project=config.wandb_project, group=group, name=name,
            config={**config.to_dict(), "attention": choice.record()}, dir=workdir, id=run_id, resume="allow",
            mode=os.environ.get("WANDB_MODE", config.wandb_mode),
            tags=tags)

    def log(self, step, metrics):
        # Numbers only: the resolved attention's names are in the run's config (attention.*).
        self._run.log({k: _plain(v) for k, v in metrics.items() if not isinstance(v, str)},
                      step=int(step))

    def event(self, step, message, fields):
        pass  # wandb marks resumed runs itself

    def close(self):
        self._run.finish()


class Console:
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

    def close(self):
        pass


class Trackers:
    """Fans out to several trackers."""

    def __init__(self, trackers):
        self.trackers = list(trackers)

    def log(self, step, metrics):
        for t in self.trackers:
            t.log(step, metrics)

    def event(self, step, message, fields):
        for t in self.trackers:
            t.event(step, message, fields)

    def close(self):
        for t in self.trackers:
            t.close()


def make_trackers(config, workdir: str, mesh_shape, choice, is_main: bool,
                  run_id: str) -> Trackers:
    if not is_main:
        return Trackers([NullTracker()])
    trackers = [Console(config.num_train_steps)]
    if config.tracker in ("jsonl", "wandb"):
        trackers.append(JsonlTracker(os.path.join(workdir, "metrics.jsonl")))
    if config.tracker == "wandb":
        trackers.append(WandbTracker(config, workdir, mesh_shape, choice, run_id))
    return Trackers(trackers)


def _drop_torn_last_line(path: str) -> None:
    """A process killed mid-write can leave half a line at the end; cut it so that every line of
    the file stays one JSON object. Complete lines are never touched."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        content = f.read()
        if content and not content.endswith(b"\n"):
            f.truncate(content.rfind(b"\n") + 1)


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
