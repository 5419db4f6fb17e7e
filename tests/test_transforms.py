"""The episode transformations the power table injects and the latency search tries (checks/transforms.py)."""

from __future__ import annotations

import numpy as np

from wmcheck.checks.transforms import observation_scale, observation_smoothing, shift_drivers
from wmcheck.datasets.episode import Episode


def _episode(n: int = 400, d: int = 2, seed: int = 0) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        observations=rng.normal(size=(n + 1, d)).astype(np.float32),
        actions=np.arange(n, dtype=np.float32)[:, None],
        inputs=(10 + np.arange(n, dtype=np.float32))[:, None],
    )


def test_smoothing_removes_white_noise_by_its_window_and_keeps_a_trend():
    ep = _episode()
    for w in (3, 5, 9, 17):
        out = observation_smoothing(ep, w).observations
        # the variance of a mean of w independent steps is 1 / w (the ends average fewer steps)
        assert abs(out[w:-w].var() * w - 1.0) < 0.25, (w, out[w:-w].var() * w)
    ramp = Episode(observations=np.linspace(0, 1, 51, dtype=np.float32)[:, None], actions=np.zeros((50, 1), np.float32))
    sm = observation_smoothing(ramp, 9).observations
    assert np.allclose(sm[4:-4], ramp.observations[4:-4], atol=1e-6)  # centred: no lag on a ramp
    assert np.isclose(sm[0, 0], ramp.observations[:5, 0].mean())  # the window shrinks at the ends


def test_scale_multiplies_every_observation():
    ep = _episode()
    assert np.allclose(observation_scale(ep, 1.1).observations, ep.observations * 1.1, rtol=1e-6)


def test_the_latency_shift_moves_commands_and_inputs_together():
    ep = _episode(n=10)
    out = shift_drivers(ep, 2)
    assert out.actions[0, 0] == 2 and out.inputs[0, 0] == 12
    assert out.actions[-1, 0] == 9 and out.inputs[-1, 0] == 19  # the edge is held
    assert shift_drivers(Episode(observations=ep.observations, actions=ep.actions), 1).inputs is None
