"""Orbax checkpoints of the train state plus a small JSON record, with fallback on damage.

Layout on disk (Orbax CheckpointManager):

    WORKDIR/checkpoints/<step>/state/...   params, optimizer state, step (sharded arrays)
    WORKDIR/checkpoints/<step>/meta/...    JSON: config, data position, wandb id, time, tokens

WORKDIR is a local directory or gs://BUCKET/PATH (Orbax writes it through tensorstore). Locally
Orbax writes each save into a temporary directory and renames it when complete; on Cloud Storage,
where a rename is a copy, it writes a commit marker last instead. Either way a save killed
halfway never looks like a checkpoint. Locally `cleanup_tmp_directories` removes such leftovers
when a trainer starts; in a bucket they are moved to WORKDIR/damaged_checkpoints/ with a line
(a record written before the first save, NATIVE_RECORD, tells them from steps written another
way, which are refused). Saves are asynchronous: `save` returns once the arrays are copied off
the devices, and training continues while files are written. A reader (sample.py) opens the
directory read-only: it never cleans, deletes or writes there, so it can read while a trainer
saves.

Restoring tells damage from trouble. A checkpoint with missing, truncated or undecodable files is
damaged: it is moved to WORKDIR/damaged_checkpoints/<step> (kept for a look, out of the way of the
step numbers the run will write again) and the previous one is tried. Anything else (the store
unreachable, out of memory on a smaller slice, no permission) is not the checkpoint's fault: a
transient error is retried, then every error is one line and nothing is moved. With several
processes, all take the decision of the one that fared worst.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.experimental import multihost_utils

import storage
from storage.run_dir import RunDir

# How a failed read is told apart: tensorstore's status codes begin its messages.
DAMAGE_MARKS = ("NOT_FOUND:", "DATA_LOSS:", "OUT_OF_RANGE:", "Error decoding", "checksum")
TRANSIENT_MARKS = ("UNAVAILABLE:", "DEADLINE_EXCEEDED:", "ABORTED:", "Connection", "timed out")
RETRIES, RETRY_WAIT_S = 3, 2.0
READ_OK, DAMAGED, FAILED = 0, 1, 2  # ordered: the worst outcome over processes wins
NATIVE_RECORD = "ringstripe_saves.json"  # in a bucket: its steps were saved by this program


class CheckpointError(ValueError):
    """A checkpoint problem the user must resolve (train.py prints one line and exits 2)."""


class Checkpointer:
    """Every process calls every method (Orbax coordinates the processes)."""

    def __init__(self, directory: str, *, keep: int | None = None, async_save: bool = True,
                 read_only: bool = False, log: Callable[[str], None] = print):
        self.directory = storage.absolute(directory)
        self._remote = storage.is_remote(self.directory)
        self._recorded = False
        if self._remote and not read_only:
            _sort_unmarked_steps(self.directory, log)
        if read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                                   save_interval_steps=0)
        else:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, cleanup_tmp_directories=True,
                enable_async_checkpointing=async_save)
        if read_only:  # Orbax warns that a read-only directory is one: what was asked for
            previous = absl_logging.get_verbosity()
            absl_logging.set_verbosity(absl_logging.ERROR)
        try:
            self._manager = ocp.CheckpointManager(self.directory, item_names=("state", "meta"),
                                                  options=options)
        finally:
            if read_only:
                absl_logging.set_verbosity(previous)

    def steps(self) -> list[int]:
        """Completed checkpoints, oldest first."""
        self._manager.reload()  # another process (or an earlier run) may have written some
        return sorted(self._manager.all_steps())

    def save(self, step: int, state, meta: dict) -> None:
        """Starts an asynchronous save of `state` (a pytree of arrays) and `meta` (JSON). A
        failed write (this one, or the previous save's, which ends here) is a CheckpointError."""
        with self._writing():
            if self._remote and not self._recorded:
                self._record_native_saves()
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

    def _record_native_saves(self) -> None:
        """NATIVE_RECORD before the first save: from now on, a step of this directory without
        the commit marker is one of ours cut short (_sort_unmarked_steps)."""
        record = storage.path(self.directory) / NATIVE_RECORD
        if jax.process_index() == 0 and not record.exists():
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({
                "written_by": "ringstripe train.py, directly into the bucket",
                "meaning": "a step here without commit_success.txt is a save cut short"}))
        self._recorded = True

    def read_meta(self, step: int) -> dict:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def restore(self, step: int, abstract_state):
        """The state saved at `step`, placed with the shardings of `abstract_state` (a pytree of
        jax.ShapeDtypeStruct): this is how a run moves to another mesh."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def restore_params(self, step: int, abstract_params):
        """Only the parameters saved at `step` (state['params']), placed with the shardings of
        `abstract_params`: the optimizer state is never read (sampling, evaluation). Orbax
        binds the 'state' item to the kind of restore it first sees: use a Checkpointer for
        this alone, not one that also restores whole states."""
        item = {"params": abstract_params}
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=True)))
        return restored["state"]["params"]

    def restore_latest(self, abstract_state, check_meta: Callable[[int, dict], None],
                       log: Callable[[str], None]):
        """(step, state, meta) of the newest checkpoint that reads back, or None if there is none.

        A damaged checkpoint is moved aside with a message and the previous one is tried.
        `check_meta(step, meta)` raises CheckpointError when a checkpoint belongs to an
        incompatible run; that stops the search (nothing is moved or overwritten). Any other
        failure raises CheckpointError (after retries, when it looks transient).
        """
        steps = self.steps()
        for step in reversed(steps):
            outcome, result, error = self._read(lambda: self.read_meta(step))
            if outcome == READ_OK:
                check_meta(step, result)
                outcome, result, error = self._read(lambda: self.restore(step, abstract_state))
            if outcome == READ_OK:
                return (step, *result)
            if outcome == FAILED:
                raise CheckpointError(
                    f"could not read checkpoint {step} in {self.directory} ({error}); it does "
                    f"not look damaged, so nothing was moved: fix the cause and start again")
            log(f"checkpoint {step} in {self.directory} is damaged ({error}); moved to "
                f"{self._move_aside(step)}, falling back to the previous one")
        if steps:
            raise CheckpointError(
                f"no readable checkpoint among steps {steps} in {self.directory} (each moved to "
                f"damaged_checkpoints/): restore them from a backup, or start afresh")
        return None

    def _read(self, read):
        """(outcome, result, short error) of `read`, retried while the error looks transient,
        the outcome agreed by every process (the worst one)."""
        outcome, result, error = FAILED, None, ""
        for attempt in range(RETRIES + 1):
            try:
                outcome, result, error = READ_OK, read(), ""
                break
            except Exception as e:  # noqa: BLE001  (sorted below: damage, transient, other)
                error = short_error(e)
                if _is_damage(e):
                    outcome = DAMAGED
                    break
                outcome = FAILED
                if not any(mark in str(e) for mark in TRANSIENT_MARKS) or attempt == RETRIES:
                    break
                time.sleep(RETRY_WAIT_S * 2 ** attempt)
        if jax.process_count() > 1:
            everyone = multihost_utils.process_allgather(np.int32(outcome))
            worst = int(np.max(everyone))
            if worst != outcome:
                outcome, error = worst, error or "another process could not read it"
        return outcome, result, error

    def _move_aside(self, step: int) -> str:
        """Moves a damaged step out of the checkpoints directory; returns where to."""
        target = _move_step(self.directory, step)
        self._manager.reload()
        return target

    def reached_preemption(self, step: int) -> bool:
        """True when the distributed runtime agreed that every process stops at `step`."""
        return jax.process_count() > 1 and self._manager.reached_preemption(step)

    def wait(self) -> None:
        with self._writing():
            self._manager.wait_until_finished()

    def close(self) -> None:
        with self._writing():
            self._manager.wait_until_finished()
        self._manager.close()

    @contextlib.contextmanager
    def _writing(self):
        """A full disk, a lost bucket, any failure to write: one line, and the checkpoints that
        were complete before stay as they are (an unfinished save is never made a step)."""
        try:
            yield
        except Exception as e:  # noqa: BLE001  (OSError, tensorstore's ValueError, ...)
            try:
                kept = self.steps()
            except Exception:  # noqa: BLE001
                kept = []
            raise CheckpointError(
                f"could not write a checkpoint in {self.directory} ({short_error(e)}): free space "
                f"or fix the storage, then start again; the last complete checkpoint "
                f"({kept[-1] if kept else 'none'}) is intact") from None


def abstract_like(tree):
    """ShapeDtypeStructs with the shardings of `tree`'s arrays (the restore target)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def _move_step(directory: str, step: int) -> str:
    """Moves step `step` to damaged_checkpoints/STEP-TIME beside `directory` (process 0; the
    others wait); returns the new place."""
    run = RunDir(directory.rstrip("/").rsplit("/", 1)[0])  # the checkpoints' run directory
    target = storage.join(run.damaged_checkpoints, f"{step}-{int(time.time())}")
    if jax.process_index() == 0:
        storage.move(storage.join(directory, str(step)), target)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"moved checkpoint {step}")
    return target


def _sort_unmarked_steps(directory: str, log: Callable[[str], None]) -> None:
    """On Cloud Storage a step without Orbax's commit marker is either a save this program
    began and did not finish (killed during it, the first save included) or a step written
    another way (renamed into place through a gcsfuse mount), which Orbax would take for an
    unfinished save and delete. NATIVE_RECORD, written before a run's first save into a bucket,
    tells them apart: its unmarked steps are moved aside with one line; without it,
    a directory whose steps all lack the marker is refused and nothing is touched."""
    root = storage.path(directory)
    if not root.exists():
        return
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
    unmarked = [s for s in steps if not (root / str(s) / "commit_success.txt").exists()]
    if not unmarked:
        return
    if not (root / NATIVE_RECORD).exists():
        if len(unmarked) == len(steps):
            raise CheckpointError(
                f"the checkpoints {steps} in {directory} have no commit marker (written through "
                f"a mounted bucket?), and would be deleted as unfinished: mark each complete one "
                f"(gcloud storage cp /dev/null {directory}/STEP/commit_success.txt) or move "
                f"them away")
        return  # an earlier version's run: Orbax removes its unfinished save, as it did then
    places = [_move_step(directory, step) for step in unmarked]
    finished = [s for s in steps if s not in unmarked]
    log(f"ringstripe: checkpoint{'s' * (len(unmarked) > 1)} {', '.join(map(str, unmarked))} in "
        f"{directory} never finished (a save cut short): moved to "
        f"{places[0].rsplit('/', 1)[0]}/; "
        + (f"resuming from checkpoint {finished[-1]}" if finished else "starting from step 0"))


def _is_damage(error: Exception) -> bool:
    """Files missing, cut short or not decodable (as opposed to a store, memory or permission
    problem, which leaves the checkpoint as it is)."""
    return (isinstance(error, (FileNotFoundError, json.JSONDecodeError))
            or any(mark in str(error) for mark in DAMAGE_MARKS))


def short_error(error: Exception) -> str:
    """An error as one line of at most 200 characters, its type first (for one-line errors);
    a longer one keeps its beginning and its end, where storage libraries put the cause
    ("... Failed to write 105355 bytes to file 6: No space left on device")."""
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text if len(text) <= 200 else f"{text[:110]} ... {text[-85:]}"
