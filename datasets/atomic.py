"""Atomic output: write to a temporary name beside the target, fsync, rename on success.

Nothing half-written is ever left at the final path: on any exception the temporary file is
removed and the target (if it existed) is untouched; after a kill, at worst a stale
`.<name>.*.tmp` file is left beside it (`remove_stale_temporaries`). The temporary file is in the
target's own folder, so the rename never becomes a copy across filesystems. A target that exists
and is not a regular file (a device such as /dev/null, a folder, a pipe) is refused: replacing
it would destroy it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from wmcheck.datasets.errors import UserError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto `target` on success."""
    target = Path(target)
    if target.exists() and not target.is_file():
        raise UserError(
            f"{target} exists and is not a regular file (a device, a folder or a pipe)",
            "write to a new path or to a regular file",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix or ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~current_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield tmp_path
        if tmp_path.is_file():
            with open(tmp_path, "rb+") as f:
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp_path, target)
        fsync_dir(target.parent)
    except BaseException as exc:
        room = write_room(tmp_path)  # before the unlink: the partial file counts against a size limit
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if isinstance(exc, Exception) and room < NEARLY_FULL and not isinstance(exc, UserError):
            # PyTorch's and HDF5's writers do not say why a write failed ("iostream error"):
            # with no room left where the file was being written, that is why.
            raise UserError(
                f"could not write {target}: no room left (the disk is full, or the file-size limit "
                f"`ulimit -f` is reached; the writer said {type(exc).__name__}: {str(exc).strip()[:120]})",
                "free disk space (or raise the limit) and run the command again; nothing partial was "
                "left under that name",
            ) from exc
        raise


NEARLY_FULL = 1024 * 1024  # bytes: a write that fails with less room than this ran out of room


def write_room(path: str | os.PathLike) -> float:
    """Bytes the file at `path` (or a new file there) can still grow by: the disk's free space
    for unprivileged writers, and the process's file-size limit (`ulimit -f`) less the file's
    current size; inf when neither can be read."""
    path = Path(path)
    room = float("inf")
    try:
        st = os.statvfs(path.parent)
        room = float(st.f_bavail * st.f_frsize)
    except (OSError, AttributeError):  # AttributeError: no statvfs on this platform
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            room = min(room, float(soft - (path.stat().st_size if path.exists() else 0)))
    except (ImportError, OSError, ValueError):
        pass
    return room


def write_text_atomic(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def current_umask() -> int:
    """The process's umask (reading it means setting it, so it is set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | os.PathLike, name: str) -> list[Path]:
    """Delete the temporaries a killed `atomic_path(folder / name)` left; returns them."""
    stale = sorted(Path(folder).glob(f".{name}.*.tmp"))
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return stale
