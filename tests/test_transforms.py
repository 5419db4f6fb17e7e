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


def test_horizon_motion_scales_how_far_the_horizon_moves_and_keeps_the_rest():
    """The dynamics row's power injection: after the context, every observation is
    x[C-1] + k (x[t] - x[C-1]); the context, the controls and the block layout stay real."""
    from wmcheck.checks.blocks import make_blocks
    from wmcheck.checks.transforms import horizon_motion
    from wmcheck.datasets.normalize import Normalizer

    eps = [_episode(n=60, seed=s) for s in range(3)]
    for i, e in enumerate(eps):
        e.id = i
    norm = Normalizer.fit(eps)
    blocks = make_blocks(eps, norm, context=4, horizon=8)
    C = blocks.context
    for k in (0.5, 2.0):
        out = horizon_motion(blocks, k)
        obs, ref = out.batch.obs, blocks.batch.obs
        assert np.array_equal(obs[:, :C], ref[:, :C])  # the model observes the real context
        anchor = ref[:, C - 1 : C]
        assert np.allclose(obs[:, C:] - anchor, k * (ref[:, C:] - anchor), atol=1e-5)
        assert np.array_equal(out.batch.prev_action, blocks.batch.prev_action)
        assert np.array_equal(out.batch.prev_input, blocks.batch.prev_input)
        assert np.array_equal(out.episode, blocks.episode) and np.array_equal(out.start, blocks.start)
    assert not np.shares_memory(horizon_motion(blocks, 2.0).batch.obs, blocks.batch.obs)  # the input is kept
    assert np.allclose(horizon_motion(blocks, 1.0).batch.obs, blocks.batch.obs)
