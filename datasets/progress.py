"""Progress of the long loops (recording episodes, scoring blocks, policy rollouts in the model).

Owns how progress is shown, never what is computed. On a terminal it is one line redrawn in place
(`label [#####.....] k/N 12 s`); in a log (stderr not a TTY) it is a sparse line: the first after
`LOG_FIRST_S` seconds, then at most one every `LOG_EVERY_S` seconds, and one at the end, so CI
logs are not flooded. Loops that finish within `SHOW_AFTER_S` seconds show nothing at all (the
scoring loop runs many times inside a check). `WMCHECK_PROGRESS=0` turns it off; everything goes
to stderr, so stdout stays the command's result.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
SHOW_AFTER_S = 2.0  # a terminal bar appears once a loop has run this long
LOG_FIRST_S = 10.0  # a log line appears once a loop has run this long ...
LOG_EVERY_S = 30.0  # ... then at most once per this many seconds
BAR_WIDTH = 24


def enabled() -> bool:
    return os.environ.get("WMCHECK_PROGRESS", "1") != "0"


class Progress:
    """Counts work done out of `total` and shows it (module docstring). Use as a context manager or
    call `close()`; `clock` is injectable for tests."""

    def __init__(self, total: int, label: str, stream=None, clock=time.monotonic):
        self.total, self.label, self.done = max(int(total), 0), label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.clock, self.t0 = clock, clock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown, self.last = False, -float("inf")
        self.on = enabled()

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.on:
            return
        now = self.clock()
        elapsed = now - self.t0
        if self.tty:
            if elapsed >= SHOW_AFTER_S and now - self.last >= 0.1:
                self._write("\r" + self._line(elapsed))
                self.last, self.shown = now, True
        elif elapsed >= LOG_FIRST_S and now - self.last >= LOG_EVERY_S:
            self._write(self._line(elapsed) + "\n")
            self.last, self.shown = now, True

    def close(self) -> None:
        if self.on and self.shown:  # a loop that showed anything also shows its end
            self._write(("\r" if self.tty else "") + self._line(self.clock() - self.t0) + "\n")
        self.on = False

    def _line(self, elapsed: float) -> str:
        if self.total:
            filled = int(BAR_WIDTH * min(self.done, self.total) / self.total)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:.0f} s"
        return f"{self.label}: {self.done} {elapsed:.0f} s"

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream never stops the work
            self.on = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable[T], total: int, label: str, stream=None) -> Iterator[T]:
    """`items`, counted one by one on a `Progress` that is closed when the loop ends or breaks."""
    with Progress(total, label, stream) as p:
        for item in items:
            yield item
            p.update()
