"""Minari both ways (issue 17): `wmcheck export --minari` writes what `minari.load_dataset` reads,
and Minari datasets (folder or id) read back into wmcheck with dt from the env spec.

The tests that load with Minari skip when it is not installed; the export itself needs no Minari."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.importers import import_to_log
from wmcheck.datasets.importers.minari_source import env_spec_dt, reality_warning
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.record import record_episodes
from wmcheck.scripts.cli import main

ENV = "Pendulum-v1"
IDS = (0, 4, 9)  # not 0..n-1: Minari needs them renumbered, the log's ids are kept as wmcheck_id


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty local Minari root for this test (never the user's ~/.minari)."""
    r = tmp_path / "minari-root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(r))
    return r


@pytest.fixture
def minari():
    return pytest.importorskip("minari")


def pendulum_log(path: Path, dt: float | None = 0.05, source: str = "real") -> list[Episode]:
    """Pendulum-v1 episodes from wmcheck's recorder, with the measured inputs, timestamps and machine
    names a real imported log has, under ids that are not 0..n-1."""
    eps = record_episodes(ENV, policy="hold:3", episodes=3, max_steps=25, seed=7)
    out = []
    for k, (ep, ep_id) in enumerate(zip(eps, IDS, strict=True)):
        n = ep.num_steps
        ep.id, ep.name = ep_id, f"rig-{k}"
        ep.inputs = np.random.default_rng(k).normal(size=(n, 2)).astype(np.float32)
        ep.timestamps = 1000.0 * k + 0.05 * np.arange(n + 1)
        out.append(ep)
    meta = LogMeta(
        source=source,
        dt=dt,
        observation_names=["cos", "sin", "omega"],
        action_names=["torque"],
        input_names=["wind", "load"],
        units={"omega": "rad/s", "torque": "N m"},
    )
    write_log(path, out, meta)
    return out


def test_exported_log_loads_in_minari_and_imports_back_equal(tmp_path, root, minari, capsys):
    import gymnasium as gym

    log = tmp_path / "pend.h5"
    eps = pendulum_log(log)
    assert main(["export", str(log), "--minari", "wmcheck/pend-v0", "--env", ENV]) == 0
    assert "wrote Minari dataset wmcheck/pend-v0" in capsys.readouterr().out

    ds = minari.load_dataset("wmcheck/pend-v0")
    env = gym.make(ENV)
    assert ds.observation_space == env.observation_space and ds.action_space == env.action_space
    assert ds.env_spec.id == ENV and ds.env_spec.max_episode_steps == 200
    assert ds.total_episodes == 3 and ds.total_steps == sum(e.num_steps for e in eps)
    assert ds.recover_environment().spec.id == ENV
    for i, (m, ep) in enumerate(zip(ds.iterate_episodes(), eps, strict=True)):
        assert m.id == i
        np.testing.assert_array_equal(m.observations, ep.observations)
        np.testing.assert_array_equal(m.actions, ep.actions)
        np.testing.assert_array_equal(m.rewards, ep.reward_array())
        np.testing.assert_array_equal(m.terminations, ep.termination_array())
        np.testing.assert_array_equal(m.truncations, ep.truncation_array())
        assert m.truncations[-1] and not m.terminations.any()  # cut by max_steps
    (meta,) = ds.storage.get_episode_metadata([1])
    assert meta["seed"] == eps[1].seed and meta["wmcheck_id"] == IDS[1] and meta["name"] == "rig-1"
    with h5py.File(root / "wmcheck/pend-v0/data/main_data.hdf5", "r") as f:  # the extras, beside Minari's data
        for i, ep in enumerate(eps):
            np.testing.assert_array_equal(f[f"episode_{i}/inputs"][()], ep.inputs)
            np.testing.assert_array_equal(f[f"episode_{i}/timestamps"][()], ep.timestamps)
    assert json.loads((root / "wmcheck/namespace_metadata.json").read_text()) == {}
    assert "wmcheck" in minari.namespace.list_local_namespaces()

    # ... and back, by dataset id, as `wmcheck import` resolves it
    back = tmp_path / "back.h5"
    assert main(["import", "wmcheck/pend-v0", "--out", str(back)]) == 0
    with open_log(back) as log_back, open_log(log) as orig:
        assert log_back.meta == orig.meta  # names, units, source "real", dt 0.05
        assert log_back.episode_ids == [0, 1, 2]
        for a, b in zip(orig, log_back, strict=True):
            for key in ("observations", "actions", "inputs", "rewards", "terminations", "truncations", "timestamps"):
                np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
            assert (a.seed, a.name) == (b.seed, b.name)


def test_dt_comes_back_from_the_env_spec(tmp_path, root, minari):
    """A log without dt, exported with its env: the import reads dt from the env spec."""
    log = tmp_path / "nodt.h5"
    pendulum_log(log, dt=None, source="sim")
    assert main(["export", str(log), "--minari", "pend-nodt-v0", "--env", ENV]) == 0
    assert minari.load_dataset("pend-nodt-v0").env_spec.id == ENV
    with h5py.File(root / "pend-nodt-v0/data/main_data.hdf5", "r") as f:
        assert "dt" not in f.attrs  # nothing to copy: dt must come from the spec
    s = import_to_log(root / "pend-nodt-v0", tmp_path / "back.h5")  # the dataset folder this time
    assert s.dt == pytest.approx(0.05)
    assert any("from Pendulum-v1" in n for n in s.notes), s.notes
    with open_log(tmp_path / "back.h5") as back:
        assert back.meta.dt == pytest.approx(0.05) and back.meta.source == "sim"


def test_a_dataset_minari_made_reads_with_dt_and_is_flagged_simulated(tmp_path, root, minari, capsys, monkeypatch):
    """A genuine Minari file (written by minari itself, no wmcheck attributes): import, validate
    and train all take its id; dt is the env's, read in place too; train warns that it is a simulator's."""
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    env = gym.make(ENV)
    buffers = []
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        rows, acts, rews = [obs], [], []
        for _ in range(12):
            a = env.action_space.sample()
            obs, r, *_ = env.step(a)
            rows.append(obs), acts.append(a), rews.append(r)
        trunc = np.r_[np.zeros(11, bool), True]
        buffers.append(
            EpisodeBuffer(
                observations=np.array(rows),
                actions=np.array(acts),
                rewards=np.array(rews),
                terminations=np.zeros(12, bool),
                truncations=trunc,
                seed=seed,
            )
        )
    with pytest.warns(UserWarning):  # minari's own warnings about missing author etc.
        minari.create_dataset_from_buffers("sim/pend-v0", buffers, env=env, algorithm_name="random")

    s = import_to_log("sim/pend-v0", tmp_path / "log.h5")
    assert s.dt == pytest.approx(0.05) and s.episodes_produced == 2
    with open_log(tmp_path / "log.h5") as log:
        assert log.meta.source == "sim"
        np.testing.assert_array_equal(log.read(1).observations, buffers[1].observations)

    main_file = root / "sim/pend-v0/data/main_data.hdf5"
    with open_log(main_file) as log:  # read in place (train, validate, check): dt from the spec too
        assert log.meta.dt == pytest.approx(0.05) and log.meta.source == "sim"
    warning = reality_warning(main_file)
    assert "Pendulum-v1" in warning and "--source real" in warning
    assert main(["validate", "sim/pend-v0"]) == 0
    assert str(main_file) in capsys.readouterr().out

    seen = {}

    def stop_before_training(log_path, out, rc, resume=True):
        seen["log"] = Path(log_path)
        from wmcheck.datasets.errors import UserError

        raise UserError("stopped by the test before training")

    monkeypatch.setattr("wmcheck.training.run.train", stop_before_training)
    assert main(["train", "sim/pend-v0", "--out", str(tmp_path / "run"), "--preset", "debug"]) == 2
    out = capsys.readouterr().out
    assert seen["log"] == main_file
    assert "warning:" in out and "recorded from the gymnasium environment Pendulum-v1" in out


def test_train_on_a_real_export_does_not_warn(tmp_path, root, capsys, monkeypatch):
    log = tmp_path / "real.h5"
    pendulum_log(log, source="real")
    assert main(["export", str(log), "--minari", "rig-v3"]) == 0  # no env: spaces from the data
    folder = root / "rig-v3"
    assert reality_warning(folder / "data/main_data.hdf5") is None
    meta = json.loads((folder / "data/metadata.json").read_text())
    box = json.loads(meta["observation_space"])
    assert box["type"] == "Box" and box["shape"] == [3] and box["low"] == [-np.inf] * 3 and "env_spec" not in meta

    seen = {}

    def stop(log_path, *a, **k):
        seen["log"] = Path(log_path)
        from wmcheck.datasets.errors import UserError

        raise UserError("stopped by the test before training")

    monkeypatch.setattr("wmcheck.training.run.train", stop)
    assert main(["train", str(folder), "--out", str(tmp_path / "run"), "--preset", "debug"]) == 2
    assert seen["log"] == folder / "data/main_data.hdf5"
    assert "warning:" not in capsys.readouterr().out
    # a simulator's log (source sim) is flagged whatever its format
    sim = tmp_path / "sim.h5"
    pendulum_log(sim, source="sim")
    assert "marked source 'sim'" in reality_warning(sim)


def test_discrete_actions_export_as_a_discrete_space(tmp_path, root, minari):
    import gymnasium as gym

    from wmcheck.datasets.record import record_to_log

    log = tmp_path / "cart.h5"
    record_to_log(log, "CartPole-v1", episodes=2, max_steps=15, seed=1)
    assert main(["export", str(log), "--minari", "cart-v0", "--env", "CartPole-v1"]) == 0
    ds = minari.load_dataset("cart-v0")
    assert ds.action_space == gym.spaces.Discrete(2)
    with open_log(log) as orig:
        for m, ep in zip(ds.iterate_episodes(), orig, strict=True):
            assert m.actions.dtype == np.int64 and m.actions.shape == (ep.num_steps,)
            np.testing.assert_array_equal(m.actions, ep.actions.argmax(axis=1))  # one-hot -> class
            np.testing.assert_array_equal(m.observations, ep.observations)
    import_to_log("cart-v0", tmp_path / "back.h5")
    with open_log(tmp_path / "back.h5") as back, open_log(log) as orig:
        np.testing.assert_array_equal(back.read(1).actions, orig.read(1).actions)  # one-hot again


def test_camera_frames_export_as_a_dict_space(tmp_path, root, minari):
    rng = np.random.default_rng(0)
    eps = [
        Episode(
            rng.normal(size=(6, 2)).astype(np.float32),
            rng.normal(size=(5, 1)).astype(np.float32),
            obs_groups={"image": rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)},
            id=i,
        )
        for i in range(2)
    ]
    write_log(tmp_path / "frames.h5", eps, LogMeta(dt=0.1))
    assert main(["export", str(tmp_path / "frames.h5"), "--minari", "frames-v0"]) == 0
    ds = minari.load_dataset("frames-v0")
    assert set(ds.observation_space.spaces) == {"state", "image"}
    m = ds[1]
    np.testing.assert_array_equal(m.observations["image"], eps[1].obs_groups["image"])  # raw, not JPEG
    np.testing.assert_array_equal(m.observations["state"], eps[1].observations)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_bad_input_exits_2_and_leaves_nothing(tmp_path, root, capsys):
    root.mkdir()
    code = main(["export", str(tmp_path / "missing.h5"), "--minari", "ns/x-v0"])
    err = capsys.readouterr().err
    assert code == 2 and "missing.h5 does not exist" in err and "fix:" in err
    assert _names(root) == []

    assert main(["export", str(tmp_path / "missing.h5"), "--minari", "no version"]) == 2
    assert "not a Minari dataset id" in capsys.readouterr().err

    log = tmp_path / "pend.h5"
    pendulum_log(log)
    assert main(["export", str(log), "--minari", "ns/x-v0"]) == 0
    first = (root / "ns/x-v0/data/metadata.json").read_bytes()
    capsys.readouterr()
    code = main(["export", str(log), "--minari", "ns/x-v0", "--env", ENV])
    err = capsys.readouterr().err
    assert code == 2 and "already exists" in err and "--force" in err
    assert (root / "ns/x-v0/data/metadata.json").read_bytes() == first  # untouched
    assert _names(root / "ns") == ["namespace_metadata.json", "x-v0"]  # no temporary left beside it

    assert main(["export", str(log), "--minari", "ns/x-v0", "--env", ENV, "--force"]) == 0
    assert "env_spec" in json.loads((root / "ns/x-v0/data/metadata.json").read_text())  # replaced
    assert _names(root / "ns") == ["namespace_metadata.json", "x-v0"]

    # a log that breaks mid-way (NaN in its last episode): nothing of the new dataset is left
    broken = tmp_path / "broken.h5"
    broken.write_bytes(log.read_bytes())
    with h5py.File(broken, "r+") as f:
        f[f"episode_{IDS[-1]}/observations"][3, 0] = np.nan
    code = main(["export", str(broken), "--minari", "other/deeper/y-v1"])
    err = capsys.readouterr().err
    assert code == 2 and "NaN" in err
    assert _names(root) == ["ns"]  # neither the dataset nor the namespace folders it would have made

    assert main(["import", "ns/nothing-v0", "--out", str(tmp_path / "o.h5")]) == 2
    assert "local Minari root" in capsys.readouterr().err


def test_env_spec_dt_falls_back_to_the_spec_kwargs():
    unmakeable = {"id": "Gone-v0", "entry_point": "no_such_module_wmc:Env"}
    assert env_spec_dt({**unmakeable, "kwargs": {"dt": 0.02}})[0] == 0.02
    assert env_spec_dt({**unmakeable, "kwargs": {"timestep": 0.002, "frame_skip": 5}})[0] == pytest.approx(0.01)
    assert env_spec_dt({**unmakeable, "kwargs": {}})[0] is None
    dt, how = env_spec_dt(json.loads(__import__("gymnasium").spec("CartPole-v1").to_json()))
    assert dt == pytest.approx(0.02) and "made" in how


def test_cli_record_then_export_in_subprocesses(tmp_path):
    """The commands as a user types them (the installed `wmcheck` script)."""
    exe = Path(sys.executable).with_name("wmcheck")
    if not exe.exists():
        pytest.skip("the wmcheck script is not installed beside this Python")
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "root"), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "pend.h5"
    rec = [str(exe), "record", ENV, "--out", str(log), "--episodes", "2", "--max-steps", "10"]
    subprocess.run(rec, check=True, env=env, capture_output=True)
    done = subprocess.run(
        [str(exe), "export", str(log), "--minari", "cli-v0", "--env", ENV], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    again = subprocess.run(
        [str(exe), "export", str(log), "--minari", "cli-v0"], env=env, capture_output=True, text=True
    )
    assert again.returncode == 2 and "already exists" in again.stderr
    with h5py.File(tmp_path / "root/cli-v0/data/main_data.hdf5", "r") as f, open_log(log) as orig:
        assert sorted(k for k in f if k.startswith("episode_")) == ["episode_0", "episode_1"]
        np.testing.assert_array_equal(f["episode_1/observations"][()], orig.read(1).observations)


def test_a_recorded_log_names_its_env_so_export_needs_no_env(tmp_path, root, minari):
    """`record` stores the registered id and kwargs; export then writes that env's spec (with the
    kwargs) without --env, and a log from an env class outside the registry claims none."""
    from wmcheck.datasets.logformat import open_log
    from wmcheck.datasets.minari_export import export_minari
    from wmcheck.datasets.record import record_to_log

    log = tmp_path / "pend.h5"
    record_to_log(log, "Pendulum-v1", episodes=2, env_kwargs={"g": 9.5}, max_steps=20)
    with open_log(log) as r:
        assert (r.meta.env_id, r.meta.env_kwargs) == ("Pendulum-v1", {"g": 9.5})
    res = export_minari(log, "wmcheck/named-v0", root=root)
    assert res.env_id == "Pendulum-v1"
    ds = minari.load_dataset("wmcheck/named-v0")
    assert ds.spec.env_spec.id == "Pendulum-v1" and ds.spec.env_spec.kwargs.get("g") == 9.5
    back = tmp_path / "back.h5"  # and an import of the export names the same env
    import_to_log("wmcheck/named-v0", back)
    with open_log(back) as r:
        assert (r.meta.env_id, r.meta.env_kwargs) == ("Pendulum-v1", {"g": 9.5})

    from gymnasium.envs.classic_control.pendulum import PendulumEnv

    bare = tmp_path / "bare.h5"
    record_to_log(bare, PendulumEnv(), episodes=1, max_steps=20)  # no spec: not made by gym.make
    with open_log(bare) as r:
        assert (r.meta.env_id, r.meta.env_kwargs) == (None, None)
