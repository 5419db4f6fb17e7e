"""A log handed to wmcheck never makes it read outside the file (issue: hardening, security item 1).

Each case crafts a real HDF5 file with h5py: a valid wmcheck log in which one episode's
observations are replaced by an object that points elsewhere (another file's bytes, another
file's dataset, another episode, nothing). Every reader (open_log, validate, import, train) must
refuse it with exit 2 naming the object, and never return the outside bytes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log, write_log

SECRET = b"root:x:0:0:root:/root:/bin/bash\n" * 8


def _log(path: Path) -> Path:
    rng = np.random.default_rng(0)
    eps = [
        Episode(rng.normal(size=(21, 2)).astype(np.float32), rng.normal(size=(20, 1)).astype(np.float32), id=i)
        for i in range(2)
    ]
    write_log(path, eps, LogMeta(source="real", dt=0.1))
    return path


def _external_storage(f, tmp):
    secret = tmp / "secret.txt"
    secret.write_bytes(SECRET)
    shape = f["episode_1/observations"].shape
    del f["episode_1/observations"]
    f.create_dataset("episode_1/observations", shape, np.float32, external=[(str(secret), 0, len(SECRET))])
    return "stored in external file"


def _external_link(f, tmp):
    other = tmp / "other.h5"
    with h5py.File(other, "w") as g:
        g["x"] = np.zeros((21, 2), np.float32)
    del f["episode_1/observations"]
    f["episode_1/observations"] = h5py.ExternalLink(str(other), "/x")
    return "external link"


def _virtual(f, tmp):
    other = tmp / "source.h5"
    with h5py.File(other, "w") as g:
        g["x"] = np.ones((21, 2), np.float32)
    layout = h5py.VirtualLayout(shape=(21, 2), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(other), "x", shape=(21, 2))
    del f["episode_1/observations"]
    f.create_virtual_dataset("episode_1/observations", layout)
    return "virtual dataset"


def _soft_to_other_episode(f, tmp):
    del f["episode_1/observations"]
    f["episode_1/observations"] = h5py.SoftLink("/episode_0/observations")
    return "outside its episode"


def _dangling(f, tmp):
    del f["episode_1/observations"]
    f["episode_1/observations"] = h5py.SoftLink("/nowhere")
    return "dangles"


def _soft_loop(f, tmp):
    f["episode_1/a"] = h5py.SoftLink("/episode_1/b")
    f["episode_1/b"] = h5py.SoftLink("/episode_1/a")
    return "chains to another link"


CASES = {
    "external storage": _external_storage,
    "external link": _external_link,
    "virtual dataset": _virtual,
    "soft link to another episode": _soft_to_other_episode,
    "dangling soft link": _dangling,
    "soft link loop": _soft_loop,
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_log_that_points_outside_itself_is_refused(case, tmp_path):
    path = _log(tmp_path / "log.h5")
    with h5py.File(path, "a") as f:
        words = CASES[case](f, tmp_path)
    with pytest.raises(UserError) as err:
        with open_log(path) as log:
            list(log)
    assert words in str(err.value) and "episode_1" in str(err.value), err.value
    assert SECRET.decode()[:20] not in str(err.value)
    exe = str(Path(sys.executable).parent / "wmcheck")
    for args in (["validate", str(path)], ["import", str(path), "--out", str(tmp_path / "copy.h5")]):
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "copy.h5").exists()


def test_a_self_contained_log_opens(tmp_path):
    path = _log(tmp_path / "log.h5")
    with open_log(path) as log:
        assert len(list(log)) == 2


def test_a_size_read_from_the_file_is_bounded_before_anything_is_allocated(tmp_path):
    """`num_action_classes = 10**15` would build that many one-hot channels: refused, named."""
    path = tmp_path / "discrete.h5"
    rng = np.random.default_rng(0)
    eps = [Episode(rng.normal(size=(11, 2)).astype(np.float32), np.zeros((10, 1), np.float32), id=0)]
    write_log(path, eps, LogMeta(source="real", dt=0.1))
    with h5py.File(path, "a") as f:
        del f["episode_0/actions"]
        f["episode_0/actions"] = np.arange(10, dtype=np.int64) % 3
        f.attrs["num_action_classes"] = 10**15
    with pytest.raises(UserError, match="1000000000000000 classes"):
        with open_log(path) as log:
            _ = log.meta
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "wmcheck"), "validate", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "1000000000000000 classes" in proc.stdout + proc.stderr, proc
