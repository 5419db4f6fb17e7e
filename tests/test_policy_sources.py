"""Policies the way people have them: Stable-Baselines3 models (an object, its bound `predict`, a
saved .zip), TorchScript modules traced with a batch dimension, and gymnasium `Env` instances.

Each test compares the recorded actions with what the user's own object returns on the recorded
observations, so a wrapper that drops, reorders or re-batches anything fails.
"""

from __future__ import annotations

import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.record import make_policy, record_episodes, record_to_log
from wmcheck.scripts.cli import main


@pytest.fixture
def ppo_zip(tmp_path):
    sb3 = pytest.importorskip("stable_baselines3")
    model = sb3.PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, seed=0, device="cpu")
    path = tmp_path / "ppo_pendulum.zip"
    model.save(str(path))
    return sb3.PPO.load(str(path), device="cpu"), path


def _expected(model, observations: np.ndarray) -> np.ndarray:
    return np.stack([model.predict(o, deterministic=True)[0] for o in observations]).astype(np.float32)


def test_sb3_zip_policy(ppo_zip):
    model, path = ppo_zip
    (ep,) = record_episodes("Pendulum-v1", str(path), episodes=1, max_steps=12, seed=4)
    np.testing.assert_allclose(ep.actions, _expected(model, ep.observations[:-1]), rtol=1e-5, atol=1e-6)
    # the policy is not constant (a wrapper returning one action would pass a weaker test)
    assert np.ptp(ep.actions) > 1e-4


def test_sb3_model_object_and_bound_predict(ppo_zip, tmp_path, monkeypatch):
    model, path = ppo_zip
    (tmp_path / "my_sb3_policy.py").write_text(
        textwrap.dedent(f"""
        from stable_baselines3 import PPO
        model = PPO.load({str(path)!r}, device="cpu")
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("my_sb3_policy:model", "my_sb3_policy:model.predict"):
        (ep,) = record_episodes("Pendulum-v1", spec, episodes=1, max_steps=10, seed=2)
        np.testing.assert_allclose(ep.actions, _expected(model, ep.observations[:-1]), rtol=1e-5, atol=1e-6)
    # from Python: the model object itself, and a callable returning (action, None) pairs
    (ep,) = record_episodes("Pendulum-v1", model, episodes=1, max_steps=6, seed=2)
    np.testing.assert_allclose(ep.actions, _expected(model, ep.observations[:-1]), rtol=1e-5, atol=1e-6)
    pi = make_policy(lambda o: (np.array([0.25], np.float32), None), gym.make("Pendulum-v1"))
    np.testing.assert_array_equal(pi(np.zeros(3, np.float32)), [0.25])


def test_sb3_zip_via_cli(ppo_zip, tmp_path, capsys):
    _, path = ppo_zip
    out = tmp_path / "ppo.h5"
    code = main(
        ["record", "Pendulum-v1", "--policy", str(path), "--episodes", "2", "--max-steps", "5", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr()
    with open_log(out) as log:
        assert log.episode_ids == [0, 1] and log.read(0).actions.shape == (5, 1)


def test_sb3_zip_errors(tmp_path, monkeypatch):
    not_sb3 = tmp_path / "policy.zip"
    not_sb3.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    env = gym.make("Pendulum-v1")
    if "stable_baselines3" in sys.modules or _importable("stable_baselines3"):
        with pytest.raises(UserError, match="could not be loaded by Stable-Baselines3"):
            make_policy(str(not_sb3), env)
    with pytest.raises(UserError, match="does not exist"):
        make_policy(str(tmp_path / "missing.zip"), env)
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # as if SB3 were not installed
    with pytest.raises(UserError, match="pip install stable-baselines3"):
        make_policy(str(not_sb3), env)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_torchscript_traced_with_a_batch_dimension(tmp_path):
    # SB3's export recipe traces with a (1, obs_dim) example; nn.Flatten then refuses (obs_dim,).
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    path = tmp_path / "traced.pt"
    torch.jit.trace(net, torch.randn(1, 3)).save(str(path))
    with pytest.raises(IndexError):
        net(torch.zeros(3))  # the unbatched call really fails: the test exercises the fallback
    (ep,) = record_episodes("Pendulum-v1", str(path), episodes=1, max_steps=8)
    with torch.no_grad():
        expected = net(torch.as_tensor(ep.observations[:-1])).numpy()  # (N, 1)
    np.testing.assert_allclose(ep.actions, expected, rtol=1e-5, atol=1e-6)

    class TupleOut(torch.nn.Module):  # (actions, values, log_prob), as an exported actor-critic returns
        def forward(self, x):
            return torch.tanh(x[:, :1]), x.sum(1), x.sum(1)

    tpath = tmp_path / "tuple.pt"
    torch.jit.trace(TupleOut(), torch.randn(1, 3)).save(str(tpath))
    (ep,) = record_episodes("Pendulum-v1", str(tpath), episodes=1, max_steps=5)
    np.testing.assert_allclose(ep.actions, np.tanh(ep.observations[:-1, :1]), rtol=1e-5, atol=1e-6)


def test_torchscript_refusing_both_shapes_is_a_user_error(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "wrong.pt"
    torch.jit.trace(torch.nn.Linear(5, 1), torch.randn(1, 5)).save(str(path))  # expects 5 inputs, gets 3
    with pytest.raises(UserError, match=r"fails on a \(3,\) observation and on a \(1, 3\) batch"):
        record_episodes("Pendulum-v1", str(path), episodes=1, max_steps=2)


def test_env_instance_is_used_and_left_open(tmp_path):
    env = gym.make("Pendulum-v1", g=4.0)
    meta, steps = record_to_log(tmp_path / "inst.h5", env, "hold:3", episodes=2, max_steps=7, seed=5)
    assert steps == 14 and meta.dt == 0.05
    # the same episodes as recording the id with the same kwargs: the instance's own g was used
    ref = record_episodes("Pendulum-v1", "hold:3", episodes=2, max_steps=7, seed=5, env_kwargs={"g": 4.0})
    other = record_episodes("Pendulum-v1", "hold:3", episodes=2, max_steps=7, seed=5)
    with open_log(tmp_path / "inst.h5") as log:
        got = [log.read(i).observations for i in log.episode_ids]
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b.observations)
    assert not np.allclose(got[0][-1], other[0].observations[-1])
    env.reset(seed=0)
    env.step(np.zeros(1, np.float32))  # still open: the caller owns it
    with pytest.raises(UserError, match="env_kwargs apply to an env id"):
        record_episodes(env, episodes=1, max_steps=2, env_kwargs={"g": 1.0})
    env.close()
