"""A full disk or a file-size limit (`ulimit -f`, issue 18 item 9): a clean exit 2 that says there
was no room, nothing partial under a final name, no temporary left behind, no traceback. The
limits are real (RLIMIT_FSIZE set in the child process), the writers are the real ones (HDF5 for
logs, PyTorch for checkpoints)."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from wmcheck.datasets.errors import out_of_space

WMCHECK = str(Path(sys.executable).parent / "wmcheck")


def _limited(args: list[str], limit_bytes: int, cwd: Path) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = dict(os.environ, OMP_NUM_THREADS="1", WMCHECK_THREADS="1")
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, preexec_fn=limit, timeout=600)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp")) + sorted(p.name for p in folder.rglob(".*.h5"))


def test_a_log_that_does_not_fit_is_refused_before_hdf5_fails(tmp_path):
    """100 Pendulum episodes (about 0.6 MiB raw) under a 300 KiB limit: refused at the episode that
    would not fit. Without the check HDF5 floods thousands of tracebacks and crashes (SIGSEGV)."""
    out = tmp_path / "x.h5"
    done = _limited([WMCHECK, "record", "Pendulum-v1", "--episodes", "100", "--out", str(out)], 300 * 1024, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no room to write" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 3
    assert not out.exists() and not _leftovers(tmp_path)


def test_a_checkpoint_that_does_not_fit_stops_training_cleanly(tmp_path):
    """A 400 KiB limit lets the log and the run's small files through, not the first checkpoint (best
    or last):
    PyTorch's writer says only "iostream error"; the atomic writer knows there was no room."""
    log = tmp_path / "real.h5"
    made = subprocess.run(
        [WMCHECK, "record", "Pendulum-v1", "--episodes", "12", "--out", str(log)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    run = tmp_path / "run"
    done = _limited([WMCHECK, "train", str(log), "--out", str(run), "--max-steps", "30"], 400 * 1024, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    # A 30-step run validates at its end (val_check_interval is capped at max_steps), so the first
    # checkpoint it writes is best.ckpt, then last.ckpt: the message names the one that did not fit.
    assert "no room left" in done.stderr and ("best.ckpt" in done.stderr or "last.ckpt" in done.stderr)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert not (run / "model.pt").exists()
    assert not (run / "checkpoints" / "last.ckpt").exists() and not (run / "checkpoints" / "best.ckpt").exists()
    assert not _leftovers(run)


@pytest.mark.parametrize(
    "exc, want",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EFBIG, "File too large"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (RuntimeError("Can't write data (file write failed: errno = 28, error message = 'No space left')"), True),
        (OSError(errno.ENOENT, "No such file or directory"), False),
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("could not broadcast"), False),
    ],
)
def test_out_of_space_names_only_refused_writes(exc, want):
    assert out_of_space(exc) is want


def test_out_of_space_follows_the_cause():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert out_of_space(outer)
