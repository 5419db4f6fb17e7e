"""Baselines: calibrated on faithful data, detect a clear actuator gap (linear system, fast)."""

from __future__ import annotations

import numpy as np

from wmcheck.checks.baselines import ARXBaseline, mlp_baseline, mmd_baseline
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.normalize import Normalizer


def _system(n_eps, gain=1.0, seed=0, steps=192, noise=0.02):
    rng = np.random.default_rng(seed)
    eps = []
    for i in range(n_eps):
        x = np.zeros((steps + 1, 2), np.float32)
        a = np.repeat(rng.uniform(-1, 1, size=(steps // 8, 1)), 8, 0).astype(np.float32)
        for t in range(steps):
            x[t + 1, 0] = 0.9 * x[t, 0] + 0.1 * x[t, 1] + 0.5 * gain * a[t, 0] + noise * rng.normal()
            x[t + 1, 1] = 0.8 * x[t, 1] + 0.1 * x[t, 0] + noise * rng.normal()
        eps.append(Episode(x, a, id=i))
    return eps


def test_mlp_and_mmd_baselines():
    train, held = _system(20, seed=0), _system(8, seed=1)
    norm = Normalizer.fit(train)
    faithful, gapped = _system(8, seed=2), _system(8, gain=2.0, seed=3)
    ok = mlp_baseline(train, held, faithful, norm, steps=200)
    bad = mlp_baseline(train, held, gapped, norm, steps=200)
    assert ok.p_value > 0.05 and bad.p_value < 0.01 and bad.score > ok.score
    # one draw each: a calibrated test gives p < 0.01 on faithful data 1% of the time; the gapped
    # run reaches the permutation floor (1 / 201: every permutation of episodes is less extreme)
    assert mmd_baseline(held, faithful, norm).p_value > 0.01
    assert mmd_baseline(held, gapped, norm).p_value < 0.01  # a gain of 2 also moves the visited states


def test_arx_baseline_is_two_sided():
    """A gain gap (larger residuals) and a noise-free, deterministic copy (smaller residuals) are both
    found; a faithful copy is not."""
    train, held = _system(20, seed=0), _system(8, seed=1)
    arx = ARXBaseline(train, held, Normalizer.fit(train))
    ok, gain, smooth = (
        arx.test(_system(8, seed=2)),
        arx.test(_system(8, gain=2.0, seed=3)),
        arx.test(_system(8, seed=4, noise=0.0)),
    )
    assert ok.p_value > 0.05, ok
    assert gain.p_value < 0.01 and smooth.p_value < 0.01, (gain, smooth)
    assert min(gain.score, smooth.score) > ok.score
