"""Checkpoints: Orbax save/restore with fallback, and preemption.

Public API:
  Checkpointer(directory, keep=, async_save=)   save / restore / restore_latest / steps /
                                                restore_params (the parameters alone)
  abstract_like(tree)                           restore target with the current shardings
  StopRequest(checkpointer)                     SIGTERM, Ctrl-C, or the agreed preemption step
  Preempted, PREEMPTED_EXIT_CODE                a run stopped on request (saved): exit 75
  CheckpointError                               user-facing checkpoint problems
  WorkdirLock(workdir), WorkdirBusy             one trainer per workdir (lock.py)
"""

from checkpoints.manager import Checkpointer, CheckpointError, abstract_like
from checkpoints.lock import WorkdirBusy, WorkdirLock
from checkpoints.preemption import PREEMPTED_EXIT_CODE, Preempted, StopRequest

__all__ = ["CheckpointError", "Checkpointer", "PREEMPTED_EXIT_CODE", "Preempted", "StopRequest", "WorkdirBusy", "WorkdirLock",
           "abstract_like"]
