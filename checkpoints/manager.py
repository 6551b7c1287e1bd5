"""Orbax checkpoints of the train state plus a small JSON record, with fallback on damage.

Layout on disk (Orbax CheckpointManager):

    WORKDIR/checkpoints/<step>/state/...   params, optimizer state, step (sharded arrays)
    WORKDIR/checkpoints/<step>/meta/...    JSON: config, data position, wandb id, time, tokens

Orbax writes each save into a temporary directory and renames it when complete, so a save that is
killed halfway never looks like a checkpoint; `cleanup_tmp_directories` removes such leftovers
when the manager starts. Saves are asynchronous: `save` returns once the arrays are copied off the
devices, and training continues while files are written.
"""

from __future__ import annotations

import os
from typing import Callable

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """A checkpoint problem the user must resolve (train.py prints one line and exits 2)."""


class Checkpointer:
    """Every process calls every method (Orbax coordinates the processes)."""

    def __init__(self, directory: str, *, keep: int, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, item_names=("state", "meta"),
                                              options=options)

    def steps(self) -> list[int]:
        """Completed checkpoints, oldest first."""
        self._manager.reload()  # another process (or an earlier run) may have written some
        return sorted(self._manager.all_steps())

    def save(self, step: int, state, meta: dict) -> None:
        """Starts an asynchronous save of `state` (a pytree of arrays) and `meta` (JSON)."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

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

        A damaged checkpoint (truncated, corrupt) is skipped with a message and the previous one
        is tried. `check_meta(step, meta)` raises CheckpointError when a checkpoint belongs to an
        incompatible run; that stops the search (nothing is overwritten).
        """
        steps = self.steps()
        for step in reversed(steps):
            try:
                meta = self.read_meta(step)
            except Exception as e:  # noqa: BLE001  (any read failure means: damaged)
                log(f"checkpoint {step} in {self.directory} is damaged ({_short(e)}); "
                    f"falling back to the previous one")
                continue
            check_meta(step, meta)
            try:
                state, meta = self.restore(step, abstract_state)
            except Exception as e:  # noqa: BLE001
                log(f"checkpoint {step} in {self.directory} is damaged ({_short(e)}); "
                    f"falling back to the previous one")
                continue
            return step, state, meta
        if steps:
            raise CheckpointError(
                f"no readable checkpoint among steps {steps} in {self.directory}: move the "
                f"directory away to start fresh, or restore it from a backup")
        return None

    def reached_preemption(self, step: int) -> bool:
        """True when the distributed runtime agreed that every process stops at `step`."""
        return jax.process_count() > 1 and self._manager.reached_preemption(step)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_like(tree):
    """ShapeDtypeStructs with the shardings of `tree`'s arrays (the restore target)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def _short(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text[:200]
