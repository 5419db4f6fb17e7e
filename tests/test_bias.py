"""The two-sided open-loop bias test (checks/bias.py) on synthetic block errors with a known truth.

Blocks of one episode share an episode effect (as real episodes share weather or operators), so a
test that treats blocks as independent over-rejects; the test must hold its level with episodes as
the units, find a bias confined to one operating regime (the one a deterministic simulator has),
find one whose sign changes between regimes (a wrong power curve: too much at low wind, too little
at high wind, zero on average), and give intervals that cover the true bias.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from wmcheck.checks.bias import bias_cells, bias_test, cell_layout, regime_edges

H, D = 48, 3


def _episodes(rng, n_ep: int, blocks: int = 3, ep_sd: float = 0.5, bias=None):
    """Block errors (n, H, D), their episodes (n,) and one control (n, H, 1) uniform in [-1, 1];
    `bias(control) -> (..., D)` is added to the errors (the checked simulator's systematic error)."""
    err, groups, ctrl = [], [], []
    for e in range(n_ep):
        effect = rng.normal(0, ep_sd, D)
        for _ in range(blocks):
            c = rng.uniform(-1, 1, (H, 1))
            x = effect + rng.normal(0, 1, (H, D))
            if bias is not None:
                x = x + bias(c)
            err.append(x)
            groups.append(e)
            ctrl.append(c)
    return np.array(err), np.array(groups), np.array(ctrl)


def _run(rng, n_checked: int, bias=None, level: float = 0.1, ep_sd: float = 0.5, n_real: int = 16):
    real, rg, rc = _episodes(rng, n_real, ep_sd=ep_sd)
    edges = regime_edges(rc)
    x, g, c = _episodes(rng, n_checked, ep_sd=ep_sd, bias=bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        test = bias_test(bias_cells(x, c, edges), g, bias_cells(real, rc, edges), rg, level, rng, permutations=499)
    return test, cell_layout(D, edges)


@pytest.mark.parametrize("n_checked", [8, 24])
def test_the_level_holds_with_episodes_as_the_units(n_checked):
    """Under no gap the permutation null keeps the false-alarm rate at the level; with a strong episode
    effect (ep_sd 1 against unit step noise, 3 blocks per episode) a block-level test would not."""
    rng = np.random.default_rng(n_checked)
    reps, level = 300, 0.1
    fires = sum(_run(rng, n_checked, level=level, ep_sd=1.0)[0].evidence >= 1 for _ in range(reps))
    rate = fires / reps
    sd = (level * (1 - level) / reps) ** 0.5
    assert level - 4 * sd <= rate <= level + 3 * sd, rate


def test_one_checked_episode_uses_bonferroni_and_stays_below_the_level():
    rng = np.random.default_rng(1)
    reps, level = 200, 0.1
    results = [_run(rng, 1, level=level)[0] for _ in range(reps)]
    assert all(t.null == "bonferroni" for t in results)
    rate = sum(t.evidence >= 1 for t in results) / reps
    assert rate <= level + 3 * (level * (1 - level) / reps) ** 0.5, rate


def test_the_bonferroni_branch_holds_its_level_with_few_episodes():
    """2 checked against 6 real episodes leave 28 splits: too few for a permutation null at the
    gap tests' levels, so the cells are judged by Bonferroni. The test is the pooled t's (its
    threshold on the Welch |t| scaled by se_pooled / se_welch): on normal episode means it holds
    the level, where Welch's own critical values rejected 2.5x as often. The interval stays Welch's."""
    from wmcheck.checks.bias import _bonferroni

    rng = np.random.default_rng(7)
    R, level = 20_000, 0.005
    g, rg = np.repeat(np.arange(2), 1), np.arange(6)
    fires = welch_fires = 0
    for _ in range(R):
        x, y = rng.normal(size=(2, 1)), rng.normal(size=(6, 1))
        t = bias_test(x, g, y, rg, level, rng)
        assert t.null == "bonferroni"
        fires += bool(t.significant[0])
        welch_fires += bool(abs(t.t[0]) >= _bonferroni(t.df, level)[0])
    expected = R * level  # 100
    assert fires <= expected + 3 * np.sqrt(expected), fires
    assert welch_fires > 1.6 * expected, welch_fires  # the test tells the two forms apart
    shifted = [bias_test(rng.normal(4.0, size=(2, 1)), g, rng.normal(size=(6, 1)), rg, level, rng) for _ in range(300)]
    assert np.mean([t.significant[0] for t in shifted]) > 0.5  # a 4-sd bias of 2 episodes is still found
    lo, hi = shifted[0].interval()[0]
    assert lo < shifted[0].difference[0] < hi


def test_a_bias_confined_to_one_regime_is_found_there_with_its_sign():
    """+1 (in step-noise units) where the control exceeds 0.5, nothing elsewhere: found in most
    checks, and the significant regime cells lie above 0.5 with a positive sign."""
    rng = np.random.default_rng(2)
    found, placed = 0, 0
    for _ in range(40):
        test, cells = _run(rng, 8, bias=lambda c: 1.0 * (c > 0.5) * np.array([1.0, 0.0, 0.0]), level=0.05, ep_sd=0.3)
        if test.evidence < 1:
            continue
        found += 1
        sig = [(cells[i], test.t[i]) for i in np.flatnonzero(test.significant) if cells[i].control is not None]
        placed += bool(sig) and all(c.channel == 0 and c.lo >= 0.4 and t > 0 for c, t in sig)
    assert found >= 36, found
    assert placed >= 0.9 * found, (placed, found)


def test_a_bias_whose_sign_changes_between_regimes_is_found_although_it_averages_to_zero():
    """+1 at low control values, -1 at high ones (a wrong power curve): the overall cell sees
    nothing, the regime cells do, with both signs."""
    rng = np.random.default_rng(3)
    found, both_signs, overall = 0, 0, 0
    for _ in range(30):
        test, cells = _run(rng, 8, bias=lambda c: 1.0 * np.sign(-c) * np.array([0.0, 1.0, 0.0]), level=0.05, ep_sd=0.3)
        found += test.evidence >= 1
        sig = [test.t[i] for i in np.flatnonzero(test.significant) if cells[i].control is not None]
        both_signs += any(t > 0 for t in sig) and any(t < 0 for t in sig)
        overall += bool(test.significant[1])  # channel 1's overall cell
    assert found >= 27 and both_signs >= 24, (found, both_signs)
    assert overall <= 3, overall


def test_the_interval_covers_the_true_bias():
    """A uniform bias of -0.3 on channel 2: the Welch 95 % interval of the overall cell covers it in
    about 95 % of checks, and the estimate is unbiased."""
    rng = np.random.default_rng(4)
    covered, estimates = 0, []
    for _ in range(100):
        test, _ = _run(rng, 10, bias=lambda c: np.array([0.0, 0.0, -0.3]), level=0.05)
        lo, hi = test.interval()[2]
        covered += lo <= -0.3 <= hi
        estimates.append(test.difference[2])
    assert covered >= 88, covered
    assert abs(np.mean(estimates) + 0.3) < 0.05, np.mean(estimates)


def test_cells_need_enough_steps_in_a_regime():
    rng = np.random.default_rng(5)
    err = rng.normal(size=(2, H, D))
    ctrl = np.full((2, H, 1), -0.9)
    ctrl[1, :2, 0] = 0.9  # block 1 has only 2 steps in the top bin
    edges = [np.array([-1.0, 0.0, 1.0])]
    cells = bias_cells(err, ctrl, edges, min_steps=3)
    assert cells.shape == (2, D * 3)
    assert np.allclose(cells[:, :D], err.mean(1), atol=1e-6)  # the overall cell
    assert np.isnan(cells[:, 2 * D :]).all()  # nobody has 3 steps above 0
    assert np.allclose(cells[1, D : 2 * D], err[1, 2:].mean(0), atol=1e-6)


def test_paired_cells_cancel_what_a_checked_block_shares_with_its_twin():
    """Each checked block replays a real block's conditions: a large shared episode effect (the
    week's weather) hides a bias of 0.3 from the unpaired test; the paired test finds it, and under
    no gap its sign-flip null holds the level."""
    from wmcheck.checks.bias import paired_bias_test

    rng = np.random.default_rng(6)

    def pair(bias: float):
        real, g, c = _episodes(rng, 12, ep_sd=2.0)
        checked = real + rng.normal(0, 1, real.shape) * 0.5 + bias  # same episode effects, new noise
        edges = regime_edges(c)
        rc, cc = bias_cells(real, c, edges), bias_cells(checked, c, edges)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            paired = paired_bias_test(cc, rc, g, 0.05, rng, permutations=499)
            unpaired = bias_test(cc, g, rc, g + 100, 0.05, rng, permutations=499)
        return paired, unpaired

    found = [pair(0.3) for _ in range(20)]
    assert sum(p.evidence >= 1 for p, _ in found) >= 18
    assert sum(u.evidence >= 1 for _, u in found) <= 5
    assert all(p.null == "sign-flip" and p.paired for p, _ in found)
    null = [pair(0.0)[0].evidence >= 1 for _ in range(100)]
    assert sum(null) <= 11, sum(null)  # level 0.05: 5 expected, 11 is 3 sd above


@pytest.mark.parametrize("n_checked", [1, 5])
def test_the_vectorised_welch_is_the_scalar_one(n_checked):
    """bias.welch (all cells and permutations at once) and stats.episode_welch (one comparison) are
    one rule written twice: they must give the same t, standard error and degrees of freedom. The
    exception is one checked episode: episode_welch judges it against a new real episode (the
    per-episode tests), while a bias cell needs two checked episodes and is not tested (t = 0)."""
    from wmcheck.checks.bias import _Moments, episode_cell_means, welch
    from wmcheck.checks.stats import episode_welch

    rng = np.random.default_rng(9)
    gx, gy = np.repeat(np.arange(n_checked), 3), np.repeat(np.arange(7), 3)
    x, y = rng.normal(0.5, 1, (len(gx), 4)), rng.normal(0, 1, (len(gy), 4))
    mx, my = episode_cell_means(x, gx), episode_cell_means(y, gy)
    t, se, df = (a[0] for a in welch(_Moments.of(np.ones((1, len(mx))), mx), _Moments.of(np.ones((1, len(my))), my)))
    if n_checked == 1:
        assert np.all(t == 0) and np.all(np.isnan(se))
        return
    for c in range(4):
        d, s, f = episode_welch(x[:, c], gx, y[:, c], gy)
        assert np.isclose(t[c], d / s) and np.isclose(se[c], s) and np.isclose(df[c], f), (c, t[c], d / s, df[c], f)


def test_the_permutation_rows_t_is_welchs_t_to_the_last_bit():
    """bias.welch_t (the permutation and bootstrap rows, computed in place) gives welch's t exactly,
    on every row and cell, including cells that one side lacks or holds in one episode only (t = 0
    there): the permutation null's ranks count exact ties (with as many checked as real episodes a
    split and its complement give t and -t), and another rounding would break them."""
    from wmcheck.checks.bias import _Moments, episode_cell_means, welch, welch_t

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(12), 2)
    vals = rng.normal(0, 1, (len(groups), 6))
    vals[groups < 6, 0] = np.nan  # cell 0: only episodes 6-11 have it
    vals[groups != 3, 1] = np.nan  # cell 1: one episode has it
    means = episode_cell_means(vals, groups)  # (12, 6)
    w = np.zeros((50, 12))
    perm = rng.permuted(np.tile(np.arange(12), (50, 1)), axis=1)
    np.put_along_axis(w, perm[:, :6], 1.0, 1)
    side, other = _Moments.of(w, means), _Moments.of(1.0 - w, means)
    fast = welch_t(side, other)
    assert np.array_equal(fast, welch(side, other)[0])
    assert np.all(fast[:, 1] == 0) and np.any(fast[:, 0] != 0)
    # a split and its complement: exactly t and -t
    assert np.array_equal(welch_t(other, side), -fast)
    # the bootstrap's form: resampled rows of one side against the other side's single row
    real = _Moments.of(np.ones((1, 12)), means + 0.3)
    assert np.array_equal(welch_t(side, real), welch(side, real)[0])


@pytest.mark.parametrize("n_checked", [2, 4])
def test_the_vectorised_pooled_se_is_the_scalar_pooled_t(n_checked):
    """bias.pooled_se (the Bonferroni branch's standard error, all cells at once) and
    stats.episode_t (one comparison) are the pooled t written twice: the difference over the
    pooled standard error, and the degrees of freedom, must agree cell by cell."""
    from wmcheck.checks.bias import _Moments, episode_cell_means, pooled_se
    from wmcheck.checks.stats import episode_t

    rng = np.random.default_rng(10)
    gx, gy = np.repeat(np.arange(n_checked), 3), np.repeat(np.arange(7), 3)
    x, y = rng.normal(0.5, 2, (len(gx), 4)), rng.normal(0, 1, (len(gy), 4))  # unequal variances: pooled != Welch
    mx, my = episode_cell_means(x, gx), episode_cell_means(y, gy)
    se, df = (a[0] for a in pooled_se(_Moments.of(np.ones((1, len(mx))), mx), _Moments.of(np.ones((1, len(my))), my)))
    for c in range(4):
        t, f = episode_t(x[:, c], gx, y[:, c], gy)
        d = x[:, c].mean() - y[:, c].mean()  # equal blocks per episode: the mean of episode means
        assert np.isclose(d / se[c], t) and np.isclose(df[c], f), (c, d / se[c], t, df[c], f)


# ----------------------------------------------------------------------------- response cells, min-p
def _responding(rng, n_ep: int, slope: float = 0.0, blocks: int = 3, ep_sd: float = 0.5):
    """Block errors, predictions (n, H, D), episodes and one control: the prediction swings around an
    episode level; the error is `slope` x the prediction's swing (a damped system: < 0) plus an
    episode effect and noise, so its mean is the same for any slope."""
    err, pred, groups, ctrl = [], [], [], []
    for e in range(n_ep):
        level, effect = rng.normal(0, 1, D), rng.normal(0, ep_sd, D)
        for _ in range(blocks):
            swing = np.sin(np.linspace(0, 3, H)[:, None] + rng.uniform(0, 6, D)) * 1.5  # (H, D)
            pred.append(level + swing)
            err.append(effect + slope * swing + rng.normal(0, 1, (H, D)))
            groups.append(e)
            ctrl.append(rng.uniform(-1, 1, (H, 1)))
    return np.array(err), np.array(pred), np.array(groups), np.array(ctrl)


def _response_run(rng, n_checked: int, slope: float, level: float = 0.05, n_real: int = 16):
    from wmcheck.checks.bias import CellLayout

    re_, rp, rg, rc = _responding(rng, n_real)
    layout = CellLayout(D, regime_edges(rc), response=True)
    x, p, g, c = _responding(rng, n_checked, slope)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        test = bias_test(
            layout.block_columns(x, c, p),
            g,
            layout.block_columns(re_, rc, rp),
            rg + 100,
            level,
            rng,
            permutations=499,
            layout=layout,
        )
    return test, layout


def test_the_response_slope_is_the_least_squares_slope_of_the_error_on_the_prediction():
    from wmcheck.checks.bias import episode_cell_means, response_slopes, response_sums

    rng = np.random.default_rng(11)
    err, pred, g, _ = _responding(rng, 3, slope=-0.3)
    got = response_slopes(episode_cell_means(response_sums(err, pred), g), D)  # (E, D)
    for e in range(3):
        for d in range(D):
            x, y = pred[g == e][..., d].ravel(), err[g == e][..., d].ravel()
            assert np.isclose(got[e, d], np.polyfit(x, y, 1)[0], atol=1e-4)
    assert np.all(np.abs(got + 0.3) < 0.3) and abs(got.mean() + 0.3) < 0.07  # the truth, up to noise (se ~0.08)


def test_a_damped_system_is_found_by_its_response_cells_though_its_errors_average_to_zero():
    """Errors pointing against the predicted swings (slope -0.25) with no mean bias: the overall and
    regime cells cannot see it; the response cells do, with the sign of a damped system, and the
    test fires in nearly every check; with the overall and regime families alone it does not."""
    rng = np.random.default_rng(12)
    found, without = 0, 0
    for _ in range(20):
        test, layout = _response_run(rng, 6, slope=-0.25)
        fam = layout.families()
        resp = fam == 1
        found += test.evidence >= 1
        assert test.evidence < 1 or test.significant[resp].any()
        if test.evidence >= 1:
            d = np.argmax(np.abs(test.t) * resp)
            assert test.t[d] < 0 and test.difference[d] < 0
        without += (np.abs(test.t[~resp]) >= test.threshold[~resp]).any()
    assert found >= 18, found
    assert without <= 3, without


@pytest.mark.parametrize("n_checked", [6, 16])
def test_the_level_holds_over_the_three_families(n_checked):
    """Under no gap (both sides slope 0) the min-p over the overall, response and regime families
    keeps the false-alarm rate at the level."""
    rng = np.random.default_rng(100 + n_checked)
    reps, level = 200, 0.1
    rate = sum(_response_run(rng, n_checked, 0.0, level)[0].evidence >= 1 for _ in range(reps)) / reps
    sd = (level * (1 - level) / reps) ** 0.5
    assert level - 4 * sd <= rate <= level + 3 * sd, rate


def test_min_p_with_one_family_is_the_max_t_test():
    """One family: fire iff at most k - 1 of the P null maxima reach the statistic, k = floor(level
    (P + 1)); the threshold is the (k - 1)-th largest null maximum and p = (1 + #null >= stat) / (P + 1)."""
    from wmcheck.checks.bias import min_p_thresholds

    rng = np.random.default_rng(13)
    null = np.abs(rng.normal(size=(999, 7)))
    stat = np.abs(rng.normal(size=7)) * 1.6
    thr, p = min_p_thresholds(stat, null, np.zeros(7, int), 0.05)
    m = np.sort(null.max(1))
    k = int(np.floor(0.05 * 1000))
    assert np.allclose(thr, m[999 - k + 1])
    assert np.isclose(p, (1 + np.sum(m >= stat.max())) / 1000)


def test_min_p_keeps_a_small_family_strong_next_to_a_large_one():
    """A shift in one cell of a 3-cell family next to a 300-cell family: its family threshold is
    the small family's (lower than one max over all 303 cells), and the family-wise level holds."""
    from wmcheck.checks.bias import min_p_thresholds

    rng = np.random.default_rng(14)
    fam = np.r_[np.zeros(3, int), np.ones(300, int)]
    null = np.abs(rng.normal(size=(1999, 303)))
    thr, _ = min_p_thresholds(np.zeros(303), null, fam, 0.05)
    pooled, _ = min_p_thresholds(np.zeros(303), null, np.zeros(303, int), 0.05)
    assert thr[0] < pooled[0] - 0.5 and thr[5] > thr[0]
    fires = [
        (np.abs(s) >= thr).any() for s in rng.normal(size=(2000, 303))
    ]  # fresh null draws: family-wise rate at most the level (plus sampling error)
    assert np.mean(fires) <= 0.05 + 3 * (0.05 * 0.95 / 2000) ** 0.5, np.mean(fires)
