"""Log format v1: writer/reader round trip, atomic writes, bad files, plain Minari files."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import LogWriter, open_log, write_log


def make_episode(
    i: int, n: int = 7, d: int = 3, a: int = 2, e: int = 0, image: bool = False, terminated: bool = False
) -> Episode:
    rng = np.random.default_rng(i)
    return Episode(
        observations=rng.normal(size=(n + 1, d)).astype(np.float32),
        actions=rng.normal(size=(n, a)).astype(np.float32),
        inputs=rng.normal(size=(n, e)).astype(np.float32) if e else None,
        rewards=rng.normal(size=n).astype(np.float32),
        terminations=np.eye(1, n, n - 1, dtype=bool)[0] if terminated else None,
        timestamps=100.0 + 0.05 * np.arange(n + 1),
        obs_groups={"image": rng.integers(0, 255, (n + 1, 8, 6, 3), dtype=np.uint8)} if image else {},
        id=i,
        seed=10 + i,
        name=f"R{i}",
    )


def assert_same(a: Episode, b: Episode) -> None:
    np.testing.assert_array_equal(a.observations, b.observations)
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.input_array(), b.input_array())
    np.testing.assert_array_equal(a.reward_array(), b.reward_array())
    np.testing.assert_array_equal(a.termination_array(), b.termination_array())
    np.testing.assert_array_equal(a.truncation_array(), b.truncation_array())
    if a.timestamps is None:
        assert b.timestamps is None
    else:
        np.testing.assert_array_equal(a.timestamps, b.timestamps)
    assert a.obs_groups.keys() == b.obs_groups.keys()
    for k in a.obs_groups:
        np.testing.assert_array_equal(a.obs_groups[k], b.obs_groups[k])
    assert (a.id, a.seed, a.name) == (b.id, b.seed, b.name)


META = LogMeta(
    source="real",
    dt=0.05,
    observation_names=["x", "y", "z"],
    action_names=["u", "v"],
    input_names=["wind"],
    units={"x": "m", "wind": "m/s"},
)


def test_round_trip_with_inputs_and_file_attrs(tmp_path):
    eps = [make_episode(i, n=5 + i, e=1, terminated=(i == 1)) for i in (2, 0, 1)]
    path = write_log(tmp_path / "log.h5", eps, META)
    with h5py.File(path) as f:
        assert f.attrs["format"] == "wmcheck-log" and f.attrs["format_version"] == 1
        assert json.loads(f.attrs["units"]) == META.units
        g = f["episode_1"]
        assert dict(g.attrs) == {"id": 1, "total_steps": 6, "seed": 11, "name": "R1"}
        assert g["observations"].dtype == np.float32 and g["observations"].shape == (7, 3)
        assert g["inputs"].shape == (6, 1) and g["timestamps"].dtype == np.float64
        assert g["terminations"].dtype == bool and g["rewards"].dtype == np.float32
    with open_log(path) as log:
        assert log.meta == META
        assert log.episode_ids == [0, 1, 2]  # id order, not write order
        assert [log.num_steps(i) for i in log.episode_ids] == [5, 6, 7]
        for ep in eps:
            assert_same(ep, log.read(ep.id))
        assert [ep.id for ep in log] == [0, 1, 2]


def test_defaults_and_optional_datasets(tmp_path):
    ep = Episode(observations=np.zeros((4, 2), np.float32) + np.arange(2), actions=np.ones((3, 1), np.float32))
    path = write_log(tmp_path / "log.h5", [ep], LogMeta(source="sim"))
    with h5py.File(path) as f:
        g = f["episode_0"]
        assert "inputs" not in g and "timestamps" not in g and "dt" not in f.attrs
        np.testing.assert_array_equal(g["rewards"][()], np.zeros(3))
        np.testing.assert_array_equal(g["truncations"][()], [False, False, True])
        assert list(f.attrs["observation_names"]) == ["obs_0", "obs_1"]
        assert list(f.attrs["input_names"]) == []
    with open_log(path) as log:
        assert log.meta.action_names == ["action_0"] and log.meta.dt is None
        back = log.read(0)
        assert back.inputs is None and back.seed is None and back.name is None


def test_image_groups_are_chunked_per_frame_and_compressed(tmp_path):
    eps = [make_episode(i, image=True) for i in range(2)]
    path = write_log(tmp_path / "log.h5", eps, LogMeta(source="sim"))
    with h5py.File(path) as f:
        img = f["episode_0/observations/image"]
        assert img.dtype == np.uint8 and img.chunks == (1, 8, 6, 3) and img.compression == "gzip"
        assert f["episode_0/observations/state"].shape == (8, 3)
    with open_log(path) as log:
        assert_same(eps[1], log.read(1))


def test_incremental_writer_is_atomic(tmp_path):
    target = tmp_path / "log.h5"
    with pytest.raises(RuntimeError):
        with LogWriter(target, LogMeta(source="sim")) as w:
            w.add(make_episode(0))
            raise RuntimeError("importer crashed")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no episodes"):
        with LogWriter(target, LogMeta(source="sim")):
            pass
    assert list(tmp_path.iterdir()) == []
    write_log(target, [make_episode(0)], LogMeta(source="sim"))
    before = target.read_bytes()
    with pytest.raises(ValueError):  # a bad episode mid-way leaves the old file untouched
        write_log(target, [make_episode(0), make_episode(1, d=4)], LogMeta(source="sim"))
    assert target.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_writer_rejects_inconsistent_episodes_listing_every_problem(tmp_path):
    bad = make_episode(1)
    bad.rewards = np.zeros(3, np.float32)
    bad.timestamps = np.arange(2.0)
    with pytest.raises(ValueError) as exc:
        with LogWriter(tmp_path / "log.h5", META) as w:
            w.add(bad)
    msg = str(exc.value)
    assert "rewards" in msg and "timestamps" in msg and "input" in msg  # META names 1 input, none given
    with pytest.raises(ValueError, match="already"):
        write_log(tmp_path / "log.h5", [make_episode(0), make_episode(0)], LogMeta(source="sim"))


# --- bad files ------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist") as exc:
        open_log(tmp_path / "nope.h5")
    assert exc.value.fix


def test_not_hdf5_and_truncated(tmp_path):
    (tmp_path / "a.h5").write_text("time,x\n0,1\n")
    with pytest.raises(UserError, match="not a readable HDF5"):
        open_log(tmp_path / "a.h5")
    path = write_log(tmp_path / "b.h5", [make_episode(i) for i in range(3)], LogMeta(source="sim"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(UserError, match="truncated"):
        open_log(path)


def test_no_episodes_and_newer_version(tmp_path):
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f.attrs["format"] = "wmcheck-log"
        f.create_group("metadata")
    with pytest.raises(UserError, match="no episode groups"):
        open_log(tmp_path / "empty.h5")
    path = write_log(tmp_path / "new.h5", [make_episode(0)], LogMeta(source="sim"))
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 2
    with pytest.raises(UserError, match="newer") as exc:
        open_log(path)
    assert "upgrade" in exc.value.fix


def test_read_rejects_broken_episode_with_every_problem(tmp_path):
    path = write_log(tmp_path / "log.h5", [make_episode(0), make_episode(1)], LogMeta(source="sim"))
    with h5py.File(path, "a") as f:
        g = f["episode_1"]
        g["observations"][2, 1] = np.nan
        del g["rewards"]
        g["rewards"] = np.zeros(3, np.float32)
        g["timestamps"][4] = g["timestamps"][3]
    with open_log(path) as log:
        log.read(0)
        with pytest.raises(UserError) as exc:
            log.read(1)
    msg = str(exc.value)
    assert "NaN" in msg and "rewards has 3 rows" in msg and "timestamps" in msg
    assert "wmcheck validate" in exc.value.fix


# --- plain Minari files ---------------------------------------------------------------------


def write_minari_episode(f: h5py.File, i: int, obs, actions, seed=None):
    """Exactly what Minari's HDF5Storage writes: attrs id/total_steps/(seed), chunked resizable
    datasets, float64 rewards, an `infos` group, and no file attributes."""
    g = f.create_group(f"episode_{i}")
    g.attrs["id"] = i
    if seed is not None:
        g.attrs["seed"] = seed
    n = len(actions)
    g.attrs["total_steps"] = n

    def put(group, key, data):
        data = np.asarray(data)
        group.create_dataset(key, data=data, chunks=True, maxshape=(None, *data.shape[1:]))

    if isinstance(obs, dict):
        og = g.create_group("observations")
        for k, v in obs.items():
            put(og, k, v)
    else:
        put(g, "observations", obs)
    put(g, "actions", actions)
    put(g, "rewards", np.arange(n, dtype=np.float64))
    put(g, "terminations", np.eye(1, n, n - 1, dtype=bool)[0])
    put(g, "truncations", np.zeros(n, bool))
    infos = g.create_group("infos")
    put(infos, "success", np.zeros(n + 1, bool))


def test_plain_minari_file_with_discrete_actions(tmp_path):
    path = tmp_path / "main_data.hdf5"
    with h5py.File(path, "w", track_order=True) as f:
        write_minari_episode(f, 0, np.random.rand(5, 4), np.array([0, 2, 1, 0]), seed=3)
        write_minari_episode(f, 1, np.random.rand(3, 4), np.array([1, 1]))
    with open_log(path) as log:
        m = log.meta
        assert (m.source, m.dt) == ("sim", None)
        assert m.observation_names == ["obs_0", "obs_1", "obs_2", "obs_3"]
        assert m.action_names == ["action_0", "action_1", "action_2"]  # max action 2 → 3 classes
        ep = log.read(0)
        assert ep.observations.dtype == np.float32 and ep.observations.shape == (5, 4)
        np.testing.assert_array_equal(ep.actions, np.eye(3, dtype=np.float32)[[0, 2, 1, 0]])
        np.testing.assert_array_equal(ep.rewards, [0, 1, 2, 3])
        assert ep.terminations[-1] and ep.seed == 3 and log.read(1).seed is None
    # Minari's metadata.json beside the file names the true number of classes.
    (tmp_path / "metadata.json").write_text(
        json.dumps({"action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 5})})
    )
    with open_log(path) as log:
        assert log.read(1).actions.shape == (2, 5)


def test_plain_minari_dict_observations(tmp_path):
    n = 4
    obs = {
        "observation": np.random.rand(n + 1, 3),
        "desired_goal": np.random.rand(n + 1, 2),
        "achieved_goal": np.random.rand(n + 1, 2),
        "pixels": np.zeros((n + 1, 6, 5, 3), np.uint8),
    }
    path = tmp_path / "main_data.hdf5"
    with h5py.File(path, "w") as f:
        write_minari_episode(f, 0, obs, np.random.rand(n, 2).astype(np.float32), seed=0)
        f["episode_0"].attrs["seed"] = "None"  # older Minari versions stored a missing seed like this
    with open_log(path) as log:
        assert log.meta.observation_names == [
            "achieved_goal[0]",
            "achieved_goal[1]",
            "desired_goal[0]",
            "desired_goal[1]",
            "observation[0]",
            "observation[1]",
            "observation[2]",
        ]
        ep = log.read(0)
        expected = np.concatenate([obs["achieved_goal"], obs["desired_goal"], obs["observation"]], 1)
        np.testing.assert_allclose(ep.observations, expected.astype(np.float32))
        assert list(ep.obs_groups) == ["pixels"] and ep.obs_groups["pixels"].shape == (n + 1, 6, 5, 3)
        assert ep.seed is None
