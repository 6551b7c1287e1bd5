"""Stop requests: SIGTERM in a single process, the distributed runtime's agreed step otherwise.

With several processes, JAX's preemption sync manager (started by jax.distributed.initialize)
receives the SIGTERM and makes every process agree on one step to stop at; Orbax's
`reached_preemption(step)` reports it. A single process has no such service, so a SIGTERM handler
sets a flag that the loop reads between steps.
"""

from __future__ import annotations

import signal

import jax


class StopRequest:
    def __init__(self, checkpointer):
        self._checkpointer = checkpointer
        self._signalled = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        del signum, frame
        self._signalled = True

    def should_stop(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self._signalled
        return self._checkpointer.reached_preemption(step)

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
