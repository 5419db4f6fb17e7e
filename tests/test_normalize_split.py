"""Normalizer (fit on train only, constant channels, save/load, errors) and the episode split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import split_episodes


def episode(i: int, n: int = 20, offset: float = 0.0) -> Episode:
    rng = np.random.default_rng(i)
    obs = rng.normal(offset, 1 + i, size=(n + 1, 3)).astype(np.float32)
    obs[:, 2] = 7.0  # constant channel
    return Episode(
        observations=obs,
        actions=rng.normal(size=(n, 2)).astype(np.float32),
        inputs=rng.normal(3, 2, size=(n, 1)).astype(np.float32),
        id=i,
    )


META = LogMeta(source="real", observation_names=["p", "q", "fixed"], action_names=["u", "v"], input_names=["wind"])


def test_fit_matches_numpy_on_the_training_episodes_only(tmp_path):
    eps = [episode(i, offset=10.0 * i) for i in range(6)]
    path = write_log(tmp_path / "log.h5", eps, META)
    train, val = split_episodes(range(6), 0.34, seed=0)
    assert val
    with open_log(path) as log:
        norm = Normalizer.fit(log.episodes(train), log.meta)
    obs = np.concatenate([eps[i].observations for i in train]).astype(np.float64)
    np.testing.assert_allclose(norm.mean["obs"], obs.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.std["obs"][:2], obs.std(0)[:2], rtol=1e-5)
    inputs = np.concatenate([eps[i].inputs for i in train]).astype(np.float64)
    np.testing.assert_allclose(norm.mean["input"], inputs.mean(0), rtol=1e-5)
    everything = np.concatenate([e.observations for e in eps])
    assert not np.allclose(norm.mean["obs"][:2], everything.mean(0)[:2], rtol=1e-3)
    assert norm.constant_channels == ["observations/fixed"] and norm.std["obs"][2] == 1.0
    z = norm.norm_obs(eps[train[0]].observations)
    assert np.all(z[:, 2] == 0) and z.dtype == np.float32


def test_round_trip_norm_denorm_and_torch():
    norm = Normalizer.fit([episode(i) for i in range(3)], META)
    x = episode(5).actions
    np.testing.assert_allclose(norm.denorm_action(norm.norm_action(x)), x, rtol=1e-5, atol=1e-5)
    import torch

    t = torch.as_tensor(x, dtype=torch.float64).reshape(4, 5, 2)  # (B, T, A)
    out = norm.norm_action(t)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64 and out.shape == (4, 5, 2)
    np.testing.assert_allclose(out.reshape(20, 2).numpy(), norm.norm_action(x), rtol=1e-5, atol=1e-6)


def test_to_dict_is_json_safe_and_round_trips():
    norm = Normalizer.fit([episode(i) for i in range(3)], META)
    back = Normalizer.from_dict(json.loads(json.dumps(norm.to_dict())))
    for kind in ("obs", "action", "input"):
        np.testing.assert_array_equal(back.mean[kind], norm.mean[kind])
        np.testing.assert_array_equal(back.std[kind], norm.std[kind])
    assert back.constant_channels == norm.constant_channels and back.names["input"] == ["wind"]


def test_missing_stats_and_shape_mismatch_are_errors():
    d = Normalizer.fit([episode(0)], META).to_dict()
    del d["input"]["std"]
    with pytest.raises(ValueError, match="input.std"):
        Normalizer.from_dict(d)
    with pytest.raises(ValueError, match="no input"):
        Normalizer({"obs": ([0.0], [1.0]), "action": ([0.0], [1.0])})
    with pytest.raises(ValueError, match="std > 0"):
        Normalizer({"obs": ([0.0], [0.0]), "action": ([0.0], [1.0]), "input": ([], [])})
    norm = Normalizer.fit([episode(0)], META)
    with pytest.raises(ValueError, match="4 channels .* fitted on 3"):
        norm.norm_obs(np.zeros((5, 4)))
    with pytest.raises(ValueError, match="zero training episodes"):
        Normalizer.fit([], META)


def test_fit_rejects_nan():
    ep = episode(0)
    ep.observations[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        Normalizer.fit([ep])


# --- split ------------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_complete():
    ids = list(range(200))
    train, val = split_episodes(ids, 0.2, seed=3)
    assert split_episodes(reversed(ids), 0.2, seed=3) == (train, val)
    assert sorted(train + val) == ids and not set(train) & set(val)
    assert 20 <= len(val) <= 60  # 40 expected
    assert split_episodes(ids, 0.2, seed=4) != (train, val)


def test_split_is_stable_when_episodes_are_added():
    train, val = split_episodes(range(50), 0.25, seed=1)
    train2, val2 = split_episodes(range(80), 0.25, seed=1)
    assert set(val) <= set(val2) and set(train) <= set(train2)


def test_split_edge_cases():
    assert split_episodes([4, 9], 0.01, seed=0)[1] != []  # at least one validation episode
    assert len(split_episodes([4, 9], 0.99, seed=0)[0]) == 1  # at least one training episode
    assert split_episodes([1, 2, 3], 0.0) == ([1, 2, 3], [])
    assert split_episodes([7], 0.5) == ([7], [])
    with pytest.raises(ValueError):
        split_episodes([1, 2], 1.0)
