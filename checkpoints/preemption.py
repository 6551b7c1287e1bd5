"""Stop requests: SIGTERM or Ctrl-C in a single process, the distributed runtime's agreed step
otherwise.

With several processes, JAX's preemption sync manager (started by jax.distributed.initialize)
receives the SIGTERM and makes every process agree on one step to stop at; Orbax's
`reached_preemption(step)` reports it. A single process has no such service, so a SIGTERM handler
sets a flag that the loop reads between steps.

Ctrl-C (SIGINT) asks for the same stop, so that the first key a person presses saves the work:
in one process it sets the flag; with several it is passed on as a SIGTERM to this process, for
the sync manager to hear. A second Ctrl-C stops at once, without saving (a save or a step that
hangs), exit 130 as an interrupted program's; the checkpoints already complete stay as they are.

Every engine gets the same rule (scripts/launch.py): a stop on request saves at the step the
notice arrived, then the run raises Preempted and train.py exits PREEMPTED_EXIT_CODE, never 0,
so that the engine (SLURM's batch script, the TPU watcher, a JobSet) tells "stopped, start me
again" from "finished": a SLURM job that exits 0 in its grace time counts as COMPLETED and is
not requeued.
"""

from __future__ import annotations

import os
import signal
import sys

import jax

ABORT_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C
# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry": the same
# command resumes from the checkpoint just written.
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
    """The run stopped on request (SIGTERM, the distributed runtime's preemption notice,
    Ctrl-C) after saving `step`: running the same command again resumes there."""

    def __init__(self, step: int):
        super().__init__(f"stopped on request at step {step}, saved; the same command resumes "
                         f"there")
        self.step = step


class StopRequest:
    def __init__(self, checkpointer):
        self._checkpointer = checkpointer
        self._signalled = self._interrupted = False
        self._previous = {}
        if jax.process_count() == 1:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigterm(self, signum, frame):
        del signum, frame
        self._signalled = True

    def _on_sigint(self, signum, frame):
        del signum, frame
        if self._interrupted:
            print("ringstripe: a second Ctrl-C: stopped at once, without saving; the same "
                  "command resumes from the last complete checkpoint", file=sys.stderr,
                  flush=True)
            os._exit(ABORT_EXIT_CODE)  # no cleanup, no listing: whatever hung would hang again
        self._interrupted = True
        if jax.process_index() == 0:  # (on a new line when a progress bar is drawn)
            print("\n" * sys.stdout.isatty() + "ringstripe: Ctrl-C: finishing this step and "
                  "saving a checkpoint, then stopping (Ctrl-C again stops at once, without "
                  "saving)", file=sys.stderr, flush=True)
        if jax.process_count() == 1:
            self._signalled = True
        else:  # the sync manager listens for SIGTERM; it makes the processes agree on a step
            os.kill(os.getpid(), signal.SIGTERM)

    def should_stop(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self._signalled
        return self._checkpointer.reached_preemption(step)

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
