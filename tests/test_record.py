"""Recording gymnasium rollouts: shapes, alignment, seeds, policies, metadata, errors."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.record import Recorder, record_episodes, record_to_log
from wmcheck.datasets.validate import validate_log
from wmcheck.scripts.cli import main

HELPERS = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    def half(obs):
        return np.array([0.5], np.float32)

    class NoClock(gym.Env):
        """A 1-D integrator with no dt and no render_fps."""
        observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
        action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.x = np.zeros(1, np.float32)
            return self.x.copy(), {}
        def step(self, a):
            self.x = self.x + np.asarray(a, np.float32)
            return self.x.copy(), 0.0, False, False, {}

    class DictObs(NoClock):
        observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (1,))})
''')


@pytest.fixture
def helpers(tmp_path, monkeypatch):
    (tmp_path / "wmc_rec_helpers.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "wmc_rec_helpers"


def test_pendulum_round_trip(tmp_path):
    out = tmp_path / "pend.h5"
    meta, steps = record_to_log(out, "Pendulum-v1", episodes=2, max_steps=15, seed=3)
    assert steps == 30 and meta.dt == 0.05
    assert meta.observation_names == ["obs_0", "obs_1", "obs_2"] and meta.action_names == ["act_0"]
    with open_log(out) as log:
        assert log.meta.source == "sim" and log.episode_ids == [0, 1]
        for i, ep in enumerate(log):
            assert ep.observations.shape == (16, 3) and ep.actions.shape == (15, 1)  # N+1 and N rows
            assert ep.rewards.shape == (15,) and ep.seed == 3 + i
            assert ep.truncations[-1] and not ep.terminations.any()  # stopped by max_steps
    assert validate_log(out).ok


def test_recorded_rows_align_with_a_replay():
    """obs row t+1 is what the env returned after actions row t, from a reset with the episode seed."""
    import gymnasium as gym

    (ep,) = record_episodes("Pendulum-v1", "random", episodes=1, max_steps=10, seed=11)
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=ep.seed)
    np.testing.assert_allclose(ep.observations[0], obs, rtol=1e-6)
    for t in range(ep.num_steps):
        obs, r, *_ = env.step(ep.actions[t])
        np.testing.assert_allclose(ep.observations[t + 1], obs, rtol=1e-6)
        assert ep.rewards[t] == pytest.approx(r, rel=1e-6)


def test_same_seed_same_episode_and_hold_policy():
    a = record_episodes("Pendulum-v1", "hold:4", episodes=2, max_steps=12, seed=5)
    b = record_episodes("Pendulum-v1", "hold:4", episodes=2, max_steps=12, seed=5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.observations, y.observations)
    acts = a[0].actions[:, 0]
    assert np.all(acts[:4] == acts[0]) and np.all(acts[4:8] == acts[4]) and acts[0] != acts[4]


def test_episode_runs_to_the_env_time_limit():
    (ep,) = record_episodes("Pendulum-v1", episodes=1)
    assert ep.num_steps == 200 and ep.truncations[-1]


def test_halfcheetah_quick_episode():
    pytest.importorskip("mujoco")
    with Recorder("HalfCheetah-v5", max_steps=5) as rec:
        (ep,) = rec.episodes(1)
        assert rec.dt == pytest.approx(0.05)
    assert ep.observations.shape == (6, 17) and ep.actions.shape == (5, 6)
    assert ep.observations.dtype == np.float32 and np.isfinite(ep.observations).all()


def test_discrete_actions_are_one_hot():
    (ep,) = record_episodes("CartPole-v1", episodes=1, max_steps=20, seed=0)
    assert ep.actions.shape[1] == 2
    np.testing.assert_array_equal(ep.actions.sum(axis=1), 1.0)


def test_module_callable_policy_via_cli(tmp_path, helpers, capsys):
    out = tmp_path / "p.h5"
    rc = main(
        [
            "record",
            "Pendulum-v1",
            "--out",
            str(out),
            "--episodes",
            "1",
            "--max-steps",
            "6",
            "--policy",
            f"{helpers}:half",
            "--source",
            "policy",
            "--env-kwargs",
            '{"g": 3.0}',
        ]
    )
    assert rc == 0 and "1 episode(s) of Pendulum-v1" in capsys.readouterr().out
    with open_log(out) as log:
        assert log.meta.source == "policy"
        np.testing.assert_array_equal(log.read(0).actions, np.full((6, 1), 0.5, np.float32))


def test_torchscript_policy(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(3, 1)
    path = tmp_path / "pi.pt"
    torch.jit.script(net).save(str(path))
    (ep,) = record_episodes("Pendulum-v1", str(path), episodes=1, max_steps=4)
    with torch.no_grad():
        expected = net(torch.as_tensor(ep.observations[:-1])).numpy()
    np.testing.assert_allclose(ep.actions, expected, rtol=1e-5)


def test_env_from_module_class_without_dt_warns(helpers):
    with pytest.warns(UserWarning, match="dt recorded as 1.0"):
        rec = Recorder(f"{helpers}:NoClock", policy=f"{helpers}:half", max_steps=3)
    (ep,) = rec.episodes(1)
    rec.close()
    np.testing.assert_allclose(ep.observations[:, 0], [0, 0.5, 1.0, 1.5])
    assert rec.dt == 1.0


def test_errors(helpers, tmp_path, capsys):
    with pytest.raises(UserError, match="observation space Dict"):
        Recorder(f"{helpers}:DictObs", max_steps=3)
    with pytest.raises(UserError, match="no time limit"):
        Recorder(f"{helpers}:NoClock")
    with pytest.raises(UserError, match="K must be"):
        Recorder("Pendulum-v1", policy="hold:0")
    with pytest.raises(UserError, match="has no 'nope'"):
        Recorder("Pendulum-v1", policy=f"{helpers}:nope")
    with pytest.raises(UserError, match="2 values"):
        record_episodes("Pendulum-v1", lambda obs: [0.0, 0.0], max_steps=2)
    out = tmp_path / "bad.h5"
    assert main(["record", "Pendulm-v1", "--out", str(out), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "Pendulum-v1" in err and "fix:" in err and "Traceback" not in err
    assert main(["record", "Pendulum-v1", "--out", str(out), "--env-kwargs", "{g: 1}"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]


def _swing_helpers(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import policy_helpers

    return policy_helpers


def test_success_from_callable_from_info_or_unknown(tmp_path, monkeypatch):
    ph = _swing_helpers(monkeypatch)
    # a success rule given as module:callable, called on each recorded episode
    with Recorder(
        "Pendulum-v1", "policy_helpers:swing_up", seed=3, max_steps=200, success="policy_helpers:upright"
    ) as rec:
        eps = list(rec.episodes(3))
    assert [rec.outcomes[e.id].success for e in eps] == [ph.upright(e, {}) for e in eps]
    assert {o.source for o in rec.outcomes.values()} == {"callable"}
    assert any(o.success for o in rec.outcomes.values())
    # a do-nothing policy never gets the pendulum up: the same rule says so
    with Recorder("Pendulum-v1", lambda obs: np.zeros(1, np.float32), seed=3, max_steps=200, success=ph.upright) as rec:
        list(rec.episodes(2))
    assert [o.success for o in rec.outcomes.values()] == [False, False]
    # no rule: the env's info["is_success"] at the last step
    outcomes = {}
    record_to_log(
        tmp_path / "p.h5",
        "policy_helpers:UprightPendulum",
        "policy_helpers:swing_up",
        episodes=3,
        max_steps=200,
        seed=3,
        outcomes=outcomes,
    )
    assert [outcomes[i].success for i in range(3)] == [ph.upright(e, {}) for e in eps]
    assert {o.source for o in outcomes.values()} == {"info:is_success"}
    assert validate_log(tmp_path / "p.h5").ok  # the log format is untouched
    # neither: unknown, never a guess
    with Recorder("Pendulum-v1", "random", max_steps=5) as rec:
        list(rec.episodes(1))
    assert rec.outcomes[0].success is None and rec.outcomes[0].source is None


def test_success_rule_errors(monkeypatch):
    _swing_helpers(monkeypatch)
    with pytest.raises(UserError, match="success rule"):
        Recorder("Pendulum-v1", "random", max_steps=5, success="nocolon")
    with pytest.raises(UserError, match="no 'nothere'"):
        Recorder("Pendulum-v1", "random", max_steps=5, success="policy_helpers:nothere")
    with Recorder("Pendulum-v1", "random", max_steps=5, success=lambda ep, info: info["missing"]) as rec:
        with pytest.raises(UserError, match="success rule failed on episode 0"):
            rec.episode(0)
