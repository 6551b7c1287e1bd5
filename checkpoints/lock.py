"""One trainer per workdir: WORKDIR/LOCK names the process that trains there.

    lock = WorkdirLock(workdir); lock.acquire()   # WorkdirBusy: one line naming the holder
    ...                                           # a thread refreshes the heartbeat
    lock.release()

The lock is a small JSON file, {"host", "pid", "since", "heartbeat", "token"}, created only where
none exists (atomically, on a disk or in a bucket). A lock is stale, and taken over with a
message, when its holder is gone: on this host, its pid is not alive; from another host (a
preempted slice, a machine that died), its heartbeat is older than STALE_AFTER_S. Readers
(sample.py, evaluation) take no lock and write nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time

import storage
from storage.run_dir import RunDir
from checkpoints.manager import CheckpointError

HEARTBEAT_EVERY_S = 60.0
STALE_AFTER_S = 300.0  # five missed heartbeats


class WorkdirBusy(CheckpointError):
    """Another live process trains in this workdir."""


class WorkdirLock:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.location = RunDir(workdir).lock
        self.token = secrets.token_hex(8)
        self._record = {"host": socket.gethostname(), "pid": os.getpid(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "token": self.token}
        self._stop = threading.Event()
        self._thread = None

    def acquire(self, log=print) -> None:
        """Takes the lock, or raises WorkdirBusy naming the live holder."""
        for _ in range(3):  # a stale lock taken over by someone else between our steps: again
            if storage.create_exclusive(self.location, self._content()):
                if self._ours():  # the store may not have checked
                    self._start_heartbeat()
                    return
            holder = self._holder()
            if holder is None:
                continue  # released (or taken over and lost) since we looked
            why = _stale(holder)
            if why is None:
                raise WorkdirBusy(
                    f"workdir {self.workdir} is in use by pid {holder.get('pid')} on "
                    f"{holder.get('host')} since {holder.get('since')}{_elsewhere(holder)}: wait "
                    f"for that run to end or stop it, or use another --workdir")
            log(f"ringstripe: taking over the lock of {self.workdir}: {why}")
            storage.remove(self.location)
        raise WorkdirBusy(f"workdir {self.workdir}: could not take its lock (other processes "
                          f"keep taking it): make sure one trainer starts here")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self._ours():
                storage.remove(self.location)

    def _content(self) -> bytes:
        return json.dumps({**self._record, "heartbeat": time.time()}).encode()

    def _ours(self) -> bool:
        return (self._holder() or {}).get("token") == self.token

    def _holder(self) -> dict | None:
        """The lock's record; None when there is no lock; {} when it does not read as one (a
        file cut short by a full disk, or written by something else): a lock of nobody."""
        content = storage.read_bytes(self.location)
        if content is None:
            return None
        try:
            record = json.loads(content)
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            try:
                if not self._ours():
                    print(f"warning: the lock of {self.workdir} was taken by another process",
                          flush=True)
                    return
                storage.replace(self.location, self._content())
            except OSError:  # a storage hiccup: the next beat tries again
                continue


def _elsewhere(holder: dict) -> str:
    """For a holder on another host (whose pid cannot be checked from here): when its lock
    will count as abandoned (a slice that was killed outright, without releasing it)."""
    if holder.get("host") == socket.gethostname():
        return ""
    age = time.time() - float(holder.get("heartbeat") or 0.0)
    return (f" (last heartbeat {age:.0f} s ago; taken over once it is {STALE_AFTER_S:.0f} s "
            f"old, if that host is gone)")


def _stale(holder: dict) -> str | None:
    """Why the holder is gone, or None while it may be alive."""
    if not holder:
        return "the lock file names no holder"
    age = time.time() - float(holder.get("heartbeat") or 0.0)
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if not storage.process_running(holder["pid"]):
            return f"its holder, pid {holder['pid']} on this host, is not running"
        return None
    if age > STALE_AFTER_S:
        return (f"its holder, pid {holder.get('pid')} on {holder.get('host')}, has not "
                f"refreshed it for {age:.0f} s")
    return None
