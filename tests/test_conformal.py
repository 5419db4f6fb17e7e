"""The conformal spread scale (training/conformal.py): calibrated intervals cover what they say."""

from __future__ import annotations

from dataclasses import replace

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


def test_calibration_coverage_halves_hold_each_fold_equally():
    """calibration.interval_coverage: the halves that fit and score the scale are stratified by
    fold, so a fold whose model is less certain sits in both (unstratified halves by id order put
    it in one half: the other half's scale misses it)."""
    from types import SimpleNamespace

    from wmcheck.checks.calibration import interval_coverage

    rng = np.random.default_rng(2)
    ids = np.arange(12)
    fold = {int(i): int(i >= 6) for i in ids}  # fold 0 holds ids 0-5, fold 1 ids 6-11
    groups = np.repeat(ids, 40)
    r = _errors(rng, len(groups), np.full((8, 2), 1.0))
    r[groups < 6] *= 3.0  # fold 0's model states a spread three times too small
    held = [SimpleNamespace(id=int(i)) for i in ids]
    stratified = interval_coverage(r, groups, held, fold)
    assert stratified["episodes"] == 12 and len(stratified["per_step"]) == 8 and len(stratified["per_channel"]) == 2
    assert abs(np.mean(stratified["per_step"]) - 0.9) < 0.03, stratified
    assert stratified["min"] <= stratified["max"]
    by_id = cross_fitted_coverage(r, groups)  # the first six ids against the last six
    assert by_id.mean() < 0.8
    # one episode: a half is empty, nothing measurable
    one = interval_coverage(r[:40], groups[:40], held[:1])
    assert one["min"] is None and one["per_step"] == [None] * 8


def _scores_with_z(z):
    """BlockScores holding only standardised open-loop errors z (n, H, D) (what the divergence uses)."""
    from wmcheck.checks.scoring import BlockScores

    empty = BlockScores.from_arrays({}, "")
    return replace(empty, z_steps=z.astype(np.float32))


def test_divergence_is_the_share_outside_the_calibrated_interval_and_one_wrong_branch_does_not_dominate():
    """The block divergence is (cells outside the 90 % interval + 0.5) / (cells + 1), after the
    conformal scale. Real-like blocks score about 0.1; a block whose last steps went down another
    branch (|z| of 30 there) scores at most its share of those steps, where the former mean z^2
    made it 60x a real block's; a gap that moves every step still scores near 1."""
    from wmcheck.checks.scoring import exceedance_share, with_spread_scale

    rng = np.random.default_rng(0)
    H, D = 48, 3
    z = rng.normal(size=(200, H, D))
    real = with_spread_scale(_scores_with_z(z), np.ones((H, D))).divergence
    assert abs(real.mean() - 0.1) < 0.01 and real.min() > 0
    branch = z[:1].copy()
    branch[0, -8:] = 30.0  # the last 8 of 48 steps on the wrong branch
    wrong = with_spread_scale(_scores_with_z(branch), np.ones((H, D))).divergence[0]
    assert wrong < 0.1 + 8 / 48 + 0.02  # bounded by the share of the steps it went wrong on
    assert (branch**2).mean() > 60 * (z**2).mean()  # what the mean z^2 made of it
    gap = with_spread_scale(_scores_with_z(z[:1] + 5.0), np.ones((H, D))).divergence[0]
    assert gap > 0.95
    # the conformal scale enters: the same errors under a scale of 2 fall inside the interval
    assert with_spread_scale(_scores_with_z(z[:50] * 2), 2 * np.ones((H, D))).divergence.mean() < 0.12
    np.testing.assert_allclose(exceedance_share(np.array([0, 144]), 144), [0.5 / 145, 144.5 / 145])


def test_left_out_scales_put_the_reference_where_a_new_episode_stands():
    """The reference's own blocks scored with a scale fitted on them are in-sample: over many
    draws of 18 reference episodes (3 blocks each, errors smooth in time, episode-level difficulty that varies), their
    mean log divergence sits below that of new episodes scored with the same scale. Scored with
    the scale fitted without their episode (left_out_scales), the difference is zero within its
    error, and on the same draws the in-sample one is below it by many paired errors (about 0.03
    in log divergence here; 0.08 on the Pendulum model of the tests, docs/benchmarks.md)."""
    from wmcheck.checks.scoring import with_spread_scale
    from wmcheck.training.conformal import left_out_scales

    rng = np.random.default_rng(3)
    H, D, per, m, n = 12, 2, 3, 18, 16
    groups = np.repeat(np.arange(m), per)
    gaps = {"in-sample": [], "left out": []}
    for _ in range(600):
        hard = np.exp(rng.normal(0, 0.5, size=m + n))  # each episode's own error level
        # open-loop errors are smooth in time: one heavy-tailed level per block and channel, with a little
        # step-to-step noise, so a step's quantile rests on about as many values as there are blocks
        level = rng.standard_t(4, size=((m + n) * per, 1, D)) + 0.2 * rng.normal(size=((m + n) * per, H, D))
        r = np.abs(level) * np.repeat(hard, per)[:, None, None]
        ref, new = r[: m * per], r[m * per :]
        scale = fit_spread_scale(ref)

        def log_div(x, s, g):
            d = with_spread_scale(_scores_with_z(x), s).divergence
            return np.mean([np.log(d[g == e]).mean() for e in np.unique(g)])

        fresh = log_div(new, scale, np.repeat(np.arange(n), per))
        gaps["in-sample"].append(log_div(ref, scale, groups) - fresh)
        gaps["left out"].append(log_div(ref, left_out_scales(ref, groups), groups) - fresh)
    left, inside = np.array(gaps["left out"]), np.array(gaps["in-sample"])
    assert abs(left.mean()) < 3 * left.std() / np.sqrt(len(left)), left.mean()
    # on the same draws, the in-sample reference is the better-looking one, by many paired errors
    paired = inside - left
    assert paired.mean() < -10 * paired.std() / np.sqrt(len(paired)), (paired.mean(), paired.std())
    # one episode: nothing to leave out, the one scale
    one = left_out_scales(r[:per], np.zeros(per, int))
    np.testing.assert_allclose(one, np.broadcast_to(fit_spread_scale(r[:per]), one.shape))
