"""Ticker: lines that show a long step without a count of its own is still running (training a
tokenizer: sentencepiece reports nothing until it returns), as train.py's progress does: on a
terminal one line redrawn every second, in a log a line every `every_s` seconds, and a last line
with the time taken.

    with Ticker("data: training the tokenizer", "data: tokenizer trained"):
        train(...)
    # log:      data: training the tokenizer, 10 s so far
    #           data: tokenizer trained in 13 s
"""

from __future__ import annotations

import sys
import threading
import time


class Ticker:
    def __init__(self, running: str, finished: str, every_s: float = 10.0, stream=None):
        self.running, self.finished = running, finished
        self._stream = stream or sys.stdout
        self._tty = self._stream.isatty()
        self._period = 1.0 if self._tty else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._start = 0.0

    def __enter__(self):
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type, *_):
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self._write(f"{self.finished} in {self._elapsed():.0f} s", "\n")
        elif self._tty:  # the redrawn line ends before the error's
            self._write("", "\n")
        return False

    def _tick(self) -> None:
        while not self._stop.wait(self._period):
            self._write(f"{self.running}, {self._elapsed():.0f} s so far",
                        "\r" if self._tty else "\n")

    def _elapsed(self) -> float:
        return time.monotonic() - self._start

    def _write(self, text: str, end: str) -> None:
        self._stream.write(("\r\033[K" if self._tty else "") + text + end)
        self._stream.flush()
