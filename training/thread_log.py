"""What a run's background threads report goes to a file, not the terminal.

Orbax writes a checkpoint in threads of its own, and tensorstore calls back into Python from its
own threads. When storage fails under them (a full disk, a lost bucket) each of those threads
logs the same error with its whole traceback (Orbax at ERROR level, tensorstore's callbacks
straight to stderr): about 200 lines for one `No space left on device`, while the main thread
turns the failure into one line (checkpoints/manager.py) anyway. ThreadLog keeps those reports,
and a run that ends in an error writes them to a file that the error's line names:

    background = ThreadLog().install()
    try:
        train(...)
    except SomeError as e:
        where = background.save(workdir)      # WORKDIR/errors.log, or None: nothing kept
        print(f"error: {e}" + (f" (tracebacks in {where})" if where else ""))

Kept: records of the Orbax, tensorstore and asyncio loggers at ERROR and above (from any thread:
asyncio reports an Orbax save task's failure when the task is collected, on whichever thread), and
whatever a thread other than the main one writes to sys.stderr. The main thread's own output, the
progress lines and the one-line errors, reaches the terminal as before. Installed, it stays to
the end of the process: Orbax's threads can outlive the run by a moment (a failed save ends while
the process exits), and what they write then is appended to the same file at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
import threading
import time

from storage.run_dir import RunDir

# whose threads' reports are kept; asyncio's: an Orbax save task that failed while the process was
# ending is reported by asyncio ("Task exception was never retrieved") when it is collected
LIBRARIES = ("orbax", "tensorstore", "asyncio")
LIMIT = 1 << 20  # characters kept at most (one failure repeats itself; the first are enough)


class ThreadLog:
    def __init__(self):
        self._parts: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        self._saved_to: str | None = None

    def install(self) -> ThreadLog:
        """Filters the root logger's handlers and sys.stderr from now to the process's end."""
        for handler in logging.getLogger().handlers:
            handler.addFilter(_KeepLibraryErrors(self.keep))
        sys.stderr = _ThreadStream(sys.stderr, self.keep)
        atexit.register(self._append_late)
        return self

    def keep(self, text: str) -> None:
        with self._lock:
            if self._size < LIMIT:
                self._parts.append(text)
                self._size += len(text)

    def save(self, workdir: str) -> str | None:
        """Writes what was kept to WORKDIR/errors.log (a bucket workdir's: its local mirror),
        where the disk is full: the system's temporary directory; returns the file's path, or
        None when nothing was kept. What is kept later is appended there at exit."""
        text = self._take()
        if not text:
            return None
        header = f"# background errors of a ringstripe run, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        fallback = f"ringstripe-{os.getpid()}-{os.path.basename(RunDir(workdir).errors_log)}"
        for path in (RunDir(workdir).errors_log, os.path.join(tempfile.gettempdir(), fallback)):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as f:
                    f.write(header + text)
                self._saved_to = path
                return path
            except OSError:
                continue
        return None

    def _take(self) -> str:
        with self._lock:
            text, self._parts = "".join(self._parts), []
        return text

    def _append_late(self) -> None:
        text = self._take()
        if text and self._saved_to:
            try:
                with open(self._saved_to, "a") as f:
                    f.write(text)
            except OSError:
                pass


class _KeepLibraryErrors(logging.Filter):
    """Drops (and keeps) the records of LIBRARIES at ERROR and above: absl's handler then does
    not print them."""

    def __init__(self, keep):
        super().__init__()
        self._keep = keep
        self._format = logging.Formatter(
            "%(levelname)s %(asctime)s %(threadName)s %(pathname)s:%(lineno)d] %(message)s")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not _from_libraries(record.pathname):
            return True
        self._keep(self._format.format(record) + "\n")
        return False


def _from_libraries(pathname: str) -> bool:
    parts = pathname.replace("\\", "/").split("/")
    return any(name in parts for name in LIBRARIES)


class _ThreadStream:
    """sys.stderr for the main thread; a thread other than it writes into the log instead."""

    def __init__(self, stream, keep):
        self._stream, self._keep = stream, keep

    def write(self, text):
        if threading.current_thread() is threading.main_thread():
            return self._stream.write(text)
        self._keep(text)
        return len(text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)
