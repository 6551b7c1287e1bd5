"""Checkpoints: Orbax save/restore with fallback, and preemption.

Public API:
  Checkpointer(directory, keep=, async_save=)   save / restore / restore_latest / steps /
                                                restore_params (the parameters alone)
  abstract_like(tree)                           restore target with the current shardings
  StopRequest(checkpointer)                     SIGTERM, Ctrl-C, or the agreed preemption step
  CheckpointError                               user-facing checkpoint problems
  WorkdirLock(workdir), WorkdirBusy             one trainer per workdir (lock.py)
"""

from checkpoints.manager import Checkpointer, CheckpointError, abstract_like
from checkpoints.lock import WorkdirBusy, WorkdirLock
from checkpoints.preemption import StopRequest

__all__ = ["CheckpointError", "Checkpointer", "StopRequest", "WorkdirBusy", "WorkdirLock",
           "abstract_like"]
