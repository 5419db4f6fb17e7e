"""One writer per output folder: a lock file naming its holder, taken over when the holder is gone.

Owns `folder_lock(folder, name, writer, fix)`. A folder that a run keeps writing into must not have
two writers: two `wmcheck train` in one RUNDIR would interleave checkpoints; two `wmcheck monitor`
in one folder would each read the same state, add their own looks and save, and the later save
would drop the other's. The lock is `FOLDER/<name>`, created exclusively, holding "PID host". A
second writer stops at once with an error that names the holder. A lock whose process has gone (a
kill, a crash) is stale and taken over, so a dead run never blocks the folder; a holder on another
host (a shared file system) is assumed alive. The lock file is removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from wmcheck.datasets.errors import UserError


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, name: str, writer: str, fix: str) -> Iterator[Path]:
    """Hold FOLDER/name for the body. The error says "FOLDER is in use by another <writer> (PID
    host)" and `fix`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / name
    me = f"{os.getpid()} {socket.gethostname()}"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = lock.read_text().strip() if lock.exists() else ""
            if _alive(holder):
                raise UserError(f"{folder} is in use by another {writer} ({holder or 'unknown'})", fix) from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        break
    else:
        raise UserError(f"cannot take the lock {lock}", f"remove {lock} if no wmcheck process uses {folder}")
    try:
        yield lock
    finally:
        if lock.exists() and lock.read_text().strip() == me:
            lock.unlink()


def _alive(holder: str) -> bool:
    """Whether the 'PID host' of a lock file is a running process (on another host: assume so)."""
    parts = holder.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return False
    if parts[1] != socket.gethostname():
        return True
    try:
        os.kill(int(parts[0]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
