"""The conformal spread scale (training/conformal.py): calibrated intervals cover what they say."""

from __future__ import annotations

import numpy as np

from wmcheck.training.conformal import cross_fitted_coverage, fit_spread_scale, interval_covered


def _errors(rng, n, true_scale):
    """|error| / predicted std for a model whose predicted std is `true_scale` times too small:
    (n, H, D) with one (H, D) scale per step and channel."""
    return np.abs(rng.normal(size=(n,) + true_scale.shape) * true_scale)


def test_scale_recovers_a_misstated_spread_per_step_and_channel():
    rng = np.random.default_rng(0)
    H, D = 24, 3
    true = np.outer(np.linspace(1.0, 3.0, H), [1.0, 0.5, 2.0])  # under- and over-confident channels
    r = _errors(rng, 400, true)
    scale = fit_spread_scale(r)
    assert scale.shape == (H, D)
    assert np.allclose(scale, true, rtol=0.2), np.abs(scale / true - 1).max()
    fresh = _errors(rng, 4000, true)
    raw, cal = interval_covered(fresh).mean((0, 2)), interval_covered(fresh, scale).mean((0, 2))
    assert abs(cal.mean() - 0.9) < 0.02 and np.all(np.abs(cal - 0.9) < 0.06), cal
    assert raw.mean() < 0.8  # the raw interval is wrong here: the test can tell the two apart


def test_cross_fitted_coverage_is_measured_on_episodes_the_scale_never_saw():
    rng = np.random.default_rng(1)
    true = np.full((16, 2), 2.0)
    r = _errors(rng, 600, true)
    groups = np.repeat(np.arange(12), 50)
    cov = cross_fitted_coverage(r, groups)
    assert cov.shape == (16,) and abs(cov.mean() - 0.9) < 0.03
    # an episode-level shift the other half never shows is not covered by a scale fitted there:
    shifted = r.copy()
    shifted[groups >= 6] *= 2.0
    assert cross_fitted_coverage(shifted, groups).mean() < 0.8
    assert np.isnan(cross_fitted_coverage(r, np.zeros(600, int))).all()  # one episode: not measurable
