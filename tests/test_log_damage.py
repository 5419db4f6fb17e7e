"""Damaged episodes (issue: hardening, item 10): the reader and `validate` agree, and both answer
with the episode and the dataset named, never a traceback. Each case edits a real log with h5py."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.validate import validate_log


def _log(path: Path, episodes: int = 3) -> Path:
    rng = np.random.default_rng(0)
    eps = [
        Episode(rng.normal(size=(21, 2)).astype(np.float32), rng.normal(size=(20, 1)).astype(np.float32), id=i)
        for i in range(episodes)
    ]
    write_log(path, eps, LogMeta(source="real", dt=0.1))
    return path


def _scalar(f, name):
    del f[f"episode_1/{name}"]
    f[f"episode_1/{name}"] = np.float32(1.0) if name != "terminations" else np.bool_(False)


@pytest.mark.parametrize("name", ["actions", "rewards", "terminations", "timestamps"])
def test_a_scalar_per_step_dataset_is_an_error_in_validate_and_the_reader(tmp_path, name):
    log = _log(tmp_path / "log.h5")
    with h5py.File(log, "a") as f:
        if name == "timestamps" and "timestamps" not in f["episode_1"]:
            f["episode_1/timestamps"] = np.arange(21, dtype=np.float64)
        _scalar(f, name)
    report = validate_log(log)
    assert not report.ok
    assert any(x.code == "scalar_dataset" and x.episode == 1 for x in report.findings), report.format_text()
    with open_log(log) as lg, pytest.raises(UserError, match=f"episode 1 .*{name}.*scalar"):
        list(lg)


def test_a_header_that_disagrees_with_the_data_is_refused_by_the_reader_too(tmp_path):
    log = _log(tmp_path / "log.h5")
    with h5py.File(log, "a") as f:
        f["episode_2"].attrs["total_steps"] = 7
    assert any(x.code == "total_steps_mismatch" for x in validate_log(log).findings)
    with open_log(log) as lg, pytest.raises(UserError, match="episode 2 .*total_steps=7"):
        list(lg)


def test_a_zero_step_episode_reads_as_an_empty_episode(tmp_path):
    log = _log(tmp_path / "log.h5")
    with h5py.File(log, "a") as f:
        g = f["episode_1"]
        for k in list(g.keys()):
            data = g[k][()]
            del g[k]
            g[k] = data[:1] if k == "observations" else data[:0]
        g.attrs["total_steps"] = 0
    report = validate_log(log)
    assert report.ok and any(x.code == "zero_steps" for x in report.findings)
    with open_log(log) as lg:
        eps = list(lg)
    assert eps[1].num_steps == 0 and eps[1].actions.shape == (0, 1) and eps[1].observations.shape == (1, 2)
