"""One writer per output folder: an advisory lock that the operating system drops with its process.

Owns `folder_lock(folder, what)`, a context manager around `flock` on `FOLDER/.wmcheck.lock`. A
folder whose state grows run after run (the monitor's periods) must not have two writers: each
would read the same state, add its own looks and save, and the last save would silently drop the
other's. The lock is taken without waiting: a second writer stops at once with an error that names
the holder's process id. The kernel releases it when the holder exits, killed or not, so a crash
never leaves the folder locked; the lock file itself stays and is harmless.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from wmcheck.datasets.errors import UserError

LOCK_NAME = ".wmcheck.lock"


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "wmcheck") -> Iterator[Path]:
    """Hold the folder's lock for the body; UserError when another process holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise UserError(
                f"{folder} is in use by another {what} (process {holder})",
                "wait for it to finish, or give this run its own output folder",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock
