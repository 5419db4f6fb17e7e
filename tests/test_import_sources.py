"""Non-CSV sources: npz (columns and log layout), Minari HDF5, Parquet (optional dependency)."""

from __future__ import annotations

import json
import sys

import h5py
import numpy as np
import pytest

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers import CopyOptions, ImportMapping, import_to_log, load_source, source_kind
from wmcheck.datasets.importers.minari_source import resolve_dataset
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.validate import validate_log


def test_npz_columns_go_through_the_pipeline(tmp_path):
    p = tmp_path / "cols.npz"
    t = np.arange(12) * 2.0
    y = np.where(np.arange(12) == 3, np.nan, 3 * t)
    np.savez(p, time=t, machine=np.array(["a"] * 6 + ["b"] * 6), y=y, u=-t)
    m = ImportMapping(time_col="time", episode_col="machine", obs_cols=["y"], action_cols=["u"], min_episode_steps=1)
    assert source_kind(p) == "npz"
    r = load_source(p, m)
    assert [e.name for e in r.episodes] == ["a", "b"]
    assert r.summary.missing_in_source["y"] == 1 and r.summary.interpolated["y"] == 1
    np.testing.assert_allclose(r.episodes[0].observations[:, 0], 3 * t[:6])


def test_npz_log_layout_d4rl_rows(tmp_path):
    p = tmp_path / "log.npz"
    R = 10  # two episodes of 6 and 4 rows
    obs = np.arange(R * 2, dtype=np.float32).reshape(R, 2)
    np.savez(
        p,
        observations=obs,
        actions=np.arange(R, dtype=np.float32),
        rewards=np.ones(R),
        terminals=np.r_[np.zeros(9, bool), True],
        episode_starts=np.r_[True, [False] * 5, True, [False] * 3],
        observation_names=np.array(["x", "v"]),
        dt=np.float64(0.1),
    )
    assert source_kind(p) == "npz-log"
    r = load_source(p, options=CopyOptions(action_names=["force"]))
    e0, e1 = r.episodes
    assert e0.observations.shape == (6, 2) and e0.actions.shape == (5, 1)  # last row: observation only
    np.testing.assert_array_equal(e1.observations, obs[6:])
    assert r.meta.observation_names == ["x", "v"] and r.meta.action_names == ["force"] and r.meta.dt == 0.1
    assert e1.truncation_array()[-1]  # the terminal flag was on the dropped last row
    with pytest.raises(UserError, match="names 2 action channels but the data has 1"):
        load_source(p, options=CopyOptions(action_names=["a", "b"]))


def test_npz_log_layout_with_next_observations_keeps_every_transition(tmp_path):
    p = tmp_path / "next.npz"
    obs = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.savez(
        p,
        observations=obs,
        next_observations=obs + 100,
        actions=np.zeros((4, 3)),
        terminations=np.array([0, 0, 0, 1], bool),
        episode=np.array([7, 7, 7, 7]),
    )
    (ep,) = load_source(p).episodes
    assert ep.num_steps == 4 and ep.observations.shape == (5, 2)
    np.testing.assert_array_equal(ep.observations[-1], obs[-1] + 100)
    assert ep.termination_array()[-1] and not ep.truncation_array().any()


def test_npz_log_layout_rejects_nan_and_bad_shapes(tmp_path):
    p = tmp_path / "nan.npz"
    np.savez(p, observations=np.array([[0.0], [np.nan], [1.0]]), actions=np.zeros((3, 1)))
    with pytest.raises(UserError, match="NaN/inf values in observations"):
        load_source(p)
    np.savez(p, observations=np.zeros((3, 1)), actions=np.zeros((2, 1)))
    with pytest.raises(UserError, match="one row per time step"):
        load_source(p)


def _minari_like(path, episodes=2, n=7):
    """A plain Minari main_data.hdf5: per-episode groups, no wmcheck file attributes."""
    with h5py.File(path, "w") as f:
        for i in range(episodes):
            g = f.create_group(f"episode_{i}")
            g.attrs["id"], g.attrs["total_steps"] = i, n
            g["observations"] = np.random.default_rng(i).normal(size=(n + 1, 3)).astype(np.float32)
            g["actions"] = np.zeros((n, 1), np.float32)
            g["rewards"] = np.ones(n)
            g["terminations"] = np.zeros(n, bool)
            g["truncations"] = np.r_[np.zeros(n - 1, bool), True]


def test_minari_file_is_copied_with_attributes_from_flags(tmp_path):
    src, out = tmp_path / "main_data.hdf5", tmp_path / "log.h5"
    _minari_like(src)
    s = import_to_log(src, out, options=CopyOptions(source="sim", dt=0.05, observation_names=["cos", "sin", "omega"]))
    assert s.episodes_produced == 2 and s.steps_produced == 14
    with open_log(out) as log:
        assert log.meta.dt == 0.05 and log.meta.observation_names == ["cos", "sin", "omega"]
        assert log.meta.source == "sim" and len(log) == 2
        np.testing.assert_array_equal(log.read(1).rewards, np.ones(7, np.float32))
    assert validate_log(out).ok
    with pytest.raises(UserError, match="names 1 observation channels"):
        import_to_log(src, tmp_path / "bad.h5", options=CopyOptions(observation_names=["x"]))
    assert not (tmp_path / "bad.h5").exists()


def test_minari_dataset_folder_and_id_resolve_in_the_local_root(tmp_path, monkeypatch):
    """One rule for import, train and validate: a file, a dataset folder (<id>/ or <id>/data/) or
    an id in $MINARI_DATASETS_PATH; dt from the env spec's kwargs when the env cannot be made."""
    root = tmp_path / "root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    data = root / "lab" / "arm-v2" / "data"
    data.mkdir(parents=True)
    _minari_like(data / "main_data.hdf5")
    spec = {"id": "Gone-v0", "entry_point": "no_such_module_wmc:Env", "kwargs": {"dt": 0.1}}
    (data / "metadata.json").write_text(json.dumps({"env_spec": json.dumps(spec), "dataset_id": "lab/arm-v2"}))
    for arg in ("lab/arm-v2", root / "lab" / "arm-v2", data, data / "main_data.hdf5"):
        assert resolve_dataset(arg) == data / "main_data.hdf5", arg
    s = import_to_log("lab/arm-v2", tmp_path / "log.h5")
    assert s.dt == 0.1 and s.episodes_produced == 2
    with open_log(tmp_path / "log.h5") as log:
        assert log.meta.dt == 0.1 and log.meta.source == "sim"
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="without a Minari main_data.hdf5"):
        source_kind(tmp_path / "empty")
    with pytest.raises(UserError, match="neither a file nor a Minari dataset in the local Minari root"):
        source_kind("lab/nothing-v0")
    assert resolve_dataset(tmp_path / "missing.h5") == tmp_path / "missing.h5"  # the caller says "missing"


def test_unknown_extension_is_an_error(tmp_path):
    (tmp_path / "data.xlsx").write_bytes(b"")
    with pytest.raises(UserError, match="cannot tell the format"):
        source_kind(tmp_path / "data.xlsx")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    m = ImportMapping(time_col="t", obs_cols=["y"])
    with pytest.raises(UserError, match="needs pyarrow") as e:
        load_source(p, m)
    assert "wmcheck[parquet]" in e.value.fix


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import datetime as dt

    t0 = dt.datetime(2014, 3, 30, 0, 40, tzinfo=dt.timezone.utc)
    times = [t0 + dt.timedelta(minutes=10 * k) for k in range(6)]
    table = pa.table(
        {
            "time": pa.array(times, pa.timestamp("s", tz="Europe/Paris")),
            "turbine": ["A"] * 6,
            "y": [1.0, None, 3.0, 4.0, 5.0, 6.0],
            "u": list(range(6)),
        }
    )
    p = tmp_path / "x.parquet"
    pq.write_table(table, p)
    m = ImportMapping(time_col="time", episode_col="turbine", obs_cols=["y"], action_cols=["u"], min_episode_steps=1)
    r = load_source(p, m)
    (ep,) = r.episodes
    assert ep.timestamps[0] == t0.timestamp() and np.all(np.diff(ep.timestamps) == 600)
    np.testing.assert_allclose(ep.observations[:, 0], [1, 2, 3, 4, 5, 6])
