"""The corrections' fit (checks/sysid.py): the differentiable layer is the numpy transforms, its
derivatives are the ones the score test needs, and the sandwich interval covers at its level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmcheck.checks import sysid
from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.transforms import actuator, shift_drivers
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.normalize import Normalizer


def _episodes(n_eps: int = 3, n: int = 120, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_eps):
        t = np.arange(n)
        out.append(
            Episode(
                observations=rng.normal(size=(n + 1, 2)).astype(np.float32),
                actions=np.stack([np.sin(t / 7.0 + i) * 2, rng.normal(size=n)], 1).astype(np.float32),
                inputs=(np.cos(t / 11.0) * 3 + i).astype(np.float32)[:, None],
                id=i,
            )
        )
    return out


def _setup(max_delay: int = 3):
    eps = _episodes()
    norm = Normalizer.fit(eps)
    blocks = make_blocks(eps, norm, 8, 24)
    layout = sysid.Layout.for_normalizer(norm, max_delay)
    return eps, norm, blocks, layout, sysid.FitData.of(eps, blocks, norm, layout)


def _controls(data, layout, theta):
    drv = torch.from_numpy(data.drivers)
    rows = torch.as_tensor(np.asarray(theta, float), dtype=torch.float32).expand(drv.shape[0], -1)
    pa, pi = sysid.corrected_controls(drv, rows, layout, data.act_mean, data.act_std)
    return pa.numpy(), pi.numpy()


def test_layout_has_one_delay_and_three_parameters_per_command():
    _, _, _, layout, _ = _setup()
    assert [p.kind for p in layout.params] == ["delay"] + ["gain", "offset", "deadband"] * 2
    assert list(layout.columns("latency")) == [0] and list(layout.columns("actuator")) == list(range(1, 7))


def test_identity_reproduces_the_blocks_controls():
    _, _, blocks, layout, data = _setup()
    pa, pi = _controls(data, layout, np.zeros(len(layout)))
    assert np.allclose(pa, blocks.batch.prev_action, atol=1e-5) and np.allclose(pi, blocks.batch.prev_input, atol=1e-5)
    assert (pa[:, 0] == 0).all() and (pi[:, 0] == 0).all()  # every block starts from the initial state


@pytest.mark.parametrize("d", [-3, -1, 2, 3])
def test_an_integer_delay_is_shift_drivers(d):
    eps, norm, _, layout, data = _setup()
    theta = np.zeros(len(layout))
    theta[0] = d
    pa, pi = _controls(data, layout, theta)
    ref = make_blocks([shift_drivers(e, d) for e in eps], norm, 8, 24)
    assert np.allclose(pa, ref.batch.prev_action, atol=1e-5) and np.allclose(pi, ref.batch.prev_input, atol=1e-5)


@pytest.mark.parametrize(
    "kind,value", [("gain", 0.5), ("gain", 1.7), ("offset", -0.4), ("deadband", 0.6), ("deadband", -0.3)]
)
def test_actuator_parameters_are_the_numpy_transforms(kind, value):
    eps, norm, _, layout, data = _setup()
    c = 0
    std = float(norm.std["action"][c])
    theta = np.zeros(len(layout))
    theta[layout.index(kind, c)] = np.log(value) if kind == "gain" else value
    pa, _ = _controls(data, layout, theta)
    kw = {"gain": dict(gain=value), "offset": dict(offset=value * std), "deadband": dict(band=value * std)}[kind]
    ref = make_blocks([actuator(e, c, **kw) for e in eps], norm, 8, 24)
    assert np.allclose(pa, ref.batch.prev_action, atol=1e-4), np.abs(pa - ref.batch.prev_action).max()


def test_fractional_delay_interpolates_and_its_derivative_at_zero_is_the_central_difference():
    eps, norm, blocks, layout, data = _setup()
    drv = torch.from_numpy(data.drivers)
    rows = torch.zeros(drv.shape[0], len(layout), requires_grad=True)
    pa, pi = sysid.corrected_controls(drv, rows, layout, data.act_mean, data.act_std)
    (g,) = torch.autograd.grad(pi[:, 1:, 0].sum(), rows)
    # d u(t + d) / dd at d = 0 is (u[t+1] - u[t-1]) / 2 with Catmull-Rom
    M = layout.margin
    central = (data.drivers[:, 1:, M + 1, 2] - data.drivers[:, 1:, M - 1, 2]) / 2
    assert np.allclose(g[:, 0].numpy(), central.sum(1), rtol=1e-4, atol=1e-4)
    # halfway between two integer delays the interpolation lies between their shifts
    half = np.zeros(len(layout))
    half[0] = 1.5
    _, p15 = _controls(data, layout, half)
    lo, hi = (_controls(data, layout, np.eye(len(layout))[0] * k)[1] for k in (1, 2))
    inner = slice(4, -4)
    mid = 0.5 * (lo + hi)
    assert np.abs(p15 - mid)[:, inner].max() < 0.05 * np.abs(hi - lo)[:, inner].max() + 0.02


def test_score_test_is_paired_with_twins_and_unpaired_otherwise():
    rng = np.random.default_rng(0)
    real = rng.normal(size=(40, 3))
    groups = np.repeat(np.arange(10), 4)
    checked = real + np.array([0.0, 2.0, 0.0]) + 0.3 * rng.normal(size=real.shape)  # the second score moved
    t_unpaired = sysid.score_test(checked, groups, real, groups, np.array([0, 1, 2]), 0.05, rng)
    t_paired = sysid.score_test(checked, groups, real, groups, np.array([0, 1, 2]), 0.05, rng, twin=np.arange(40))
    assert not t_unpaired.paired and t_paired.paired
    assert t_unpaired.evidence >= 1 and t_paired.evidence >= 1
    assert np.argmax(np.abs(t_unpaired.t)) == 1


def test_score_test_holds_its_level_under_no_gap():
    """Faithful data: the checked scores are draws of the real ones' distribution (different
    episode counts): false alarms at most alpha + sampling error."""
    rng = np.random.default_rng(1)
    fires = 0
    reps = 200
    for _ in range(reps):
        real = rng.normal(size=(48, 4)) + rng.normal(size=(12, 1)).repeat(4, 0)  # episode effects
        checked = rng.normal(size=(20, 4)) + rng.normal(size=(5, 1)).repeat(4, 0)
        t = sysid.score_test(
            checked,
            np.repeat(np.arange(5), 4),
            real,
            np.repeat(np.arange(12), 4),
            np.arange(4),
            0.05,
            rng,
            permutations=199,
        )
        fires += t.evidence >= 1
    assert fires / reps <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / reps), fires


def test_one_gain_on_every_channel_gathers_the_gain_scores():
    """sysid.COMMON_GAIN: seven command channels whose gain scores all move a little the same way
    (each alone below the level of a test over 22 parameters; on Pusher a gain x2 on every channel
    gave t of 1.9-4.1 and no finding) are found by the cell of one gain on every channel, which
    the per-parameter cells miss; with no shift the test keeps its level. (Where the channels'
    scores share their episode effects, the sum gains nothing: the cell helps as far as the
    channels' noise is their own, as on Pusher, where it gave t 7.5 against 1.9-4.1.)"""
    layout = sysid.Layout.of(n_actions=7, n_inputs=0, max_delay=2)
    cols = layout.columns("actuator")
    params = sysid.test_params(layout, cols)
    assert params[-1] == sysid.COMMON_GAIN and len(params) == len(cols) + 1
    assert sysid.describe("gain", None) == "gain on every command channel"
    gain = np.array([layout.params[j].kind == "gain" for j in range(len(layout))])
    groups_r, groups_c = np.repeat(np.arange(24), 4), np.repeat(np.arange(6), 4)
    found = missed = fires = 0
    commons = []
    reps = 40
    rng = np.random.default_rng(5)
    for _ in range(reps):
        real = rng.normal(size=(96, len(layout))) + rng.normal(size=(24, len(layout))).repeat(4, 0)
        checked = rng.normal(size=(24, len(layout))) + rng.normal(size=(6, len(layout))).repeat(4, 0)
        shifted = checked + 1.2 * gain  # every gain score moves by 1.2 block sd
        common = sysid.score_test(shifted, groups_c, real, groups_r, cols, 0.05, rng, permutations=199, layout=layout)
        alone = sysid.score_test(shifted, groups_c, real, groups_r, cols, 0.05, rng, permutations=199)
        found += common.evidence >= 1 and bool(common.significant[-1])
        commons.append(common)
        missed += alone.evidence < 1
        null = sysid.score_test(checked, groups_c, real, groups_r, cols, 0.05, rng, permutations=199, layout=layout)
        fires += null.evidence >= 1
    assert found >= 0.8 * reps and found - (reps - missed) >= 0.2 * reps, (found, missed)  # 34 against 22 of 40
    # a finding on the summed cell alone is a look-alike of dynamics (gap_tests.common_gain_only);
    # one channel's own significant cell makes it a gain of its own
    from wmcheck.checks.gap_tests import FitDetail, common_gain_only

    def detail(t):
        return FitDetail("actuator", t, params, None, [f"act_{c}" for c in range(7)], {})

    only_common = [t for t in commons if t.significant[-1] and not t.significant[:-1].any()]
    assert only_common and all(common_gain_only(detail(t)) for t in only_common), len(only_common)
    one = checked.copy()
    one[:, cols[0]] += 4.0  # the first channel's first parameter alone, strongly
    single = sysid.score_test(one, groups_c, real, groups_r, cols, 0.05, rng, permutations=199, layout=layout)
    assert single.significant[0] and not common_gain_only(detail(single))
    assert fires / reps <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / reps), fires


def test_sandwich_interval_covers_with_clustered_blocks():
    """J_b(theta) = (theta - x_b)^2 / 2 with x correlated within episodes: the fit is the mean of x,
    H = 1, and the cluster-robust sandwich must cover the truth at ~95 %; treating the blocks as
    independent (the wrong variance) under-covers, so this test fails for that method."""
    rng = np.random.default_rng(2)
    cover, naive = 0, 0
    reps, E, k = 400, 12, 6
    for _ in range(reps):
        x = (rng.normal(size=(E, 1)) + 0.3 * rng.normal(size=(E, k))).ravel()  # truth 0
        groups = np.repeat(np.arange(E), k)
        theta = x.mean()
        grad = (theta - x)[:, None]  # (n, 1) scores at the fit
        cov = sysid.sandwich(np.eye(1), grad, groups)
        se = np.sqrt(cov[0, 0])
        cover += abs(theta) <= 1.96 * se
        naive += abs(theta) <= 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert 0.9 <= cover / reps <= 0.98, cover / reps
    assert naive / reps < 0.8, naive / reps


def test_chi2_quantile_is_exact_for_one_and_two_and_close_beyond():
    assert sysid.chi2_isf(0.05, 1) == pytest.approx(3.8415, abs=1e-3)
    assert sysid.chi2_isf(0.05, 2) == pytest.approx(5.9915, abs=1e-3)
    for k, exact in {3: 7.8147, 6: 12.5916, 19: 30.1435}.items():
        assert sysid.chi2_isf(0.05, k) == pytest.approx(exact, rel=6e-3)


def test_joint_support_sees_confounded_corrections_that_each_look_insignificant():
    """A gain and a deadband that mimic each other: each marginal interval covers the identity, the
    joint Wald test does not (the combination is well determined). The support must follow the
    joint test, or a clear actuator gap would be called absent."""
    layout = sysid.Layout.of(1, 0, 3)
    fit = sysid.Fit(np.zeros(4), np.array([1, 3]), 0.0, 0.0, None, 0, np.zeros(2, bool))
    sd = np.array([1.0, 1.0])
    corr = np.array([[1.0, -0.999], [-0.999, 1.0]])
    cov = corr * np.outer(sd, sd)
    rel = np.array([1.5, 1.5])  # each 1.5 sd from the identity: marginally not significant
    res = sysid.SysidResult(layout, fit, relative=rel, covariance=cov)
    assert res.support(layout.columns("actuator")) > 1.0
    independent = sysid.SysidResult(layout, fit, relative=rel, covariance=np.diag(sd**2))
    assert independent.support(layout.columns("actuator")) < 1.0  # two 1.5-sd estimates, independent
    assert res.support(layout.columns("latency")) == 0.0  # the delay was not fitted


def test_the_headline_estimate_prefers_an_excluded_identity_then_the_inside_of_the_box():
    from wmcheck.checks.gap_tests import headline_order

    def est(kind, value, interval, t, at_bound=False):
        return sysid.Estimate(sysid.Param(kind, 0), "torque", value, interval, t, at_bound)

    gain = est("gain", 0.40, (0.31, 0.52), 9.0)
    pressed = est("deadband", 0.28, (0.07, 0.48), -9.4, at_bound=True)  # the Pendulum x0.3 case
    loose = est("deadband", 0.3, (-0.4, 0.9), 12.0)  # its interval holds the identity
    assert max([pressed, gain, loose], key=headline_order) is gain
    assert max([pressed, loose], key=headline_order) is pressed
    inside = est("deadband", 0.28, (0.07, 0.48), -9.4)
    assert max([gain, inside], key=headline_order) is inside  # then the larger |t|
    assert not sysid.excludes_identity(est("gain", 0.5, (float("nan"), 0.7), 5.0))


def test_batched_evaluations_are_the_one_at_a_time_ones():
    """evaluate_many / objective_many put several thetas through the model in one pass (each block
    repeated); every theta's J and per-block gradient are what its own pass gives, also when the
    rows of a pass are capped (several chunks), and the FD Hessian is symmetric with the ridge."""
    from wmcheck.worldmodel import WorldModel
    from wmcheck.worldmodel.config import preset

    eps, norm, blocks, layout, data = _setup(max_delay=2)
    torch.manual_seed(0)
    model = WorldModel(preset("debug", obs_dim=2, action_dim=2, input_dim=1)).eval()
    rng = np.random.default_rng(1)
    thetas = rng.normal(scale=0.2, size=(5, len(layout)))
    thetas[:, layout.index("delay")] = [-1.5, -0.3, 0.0, 0.7, 1.2]
    one = [sysid.evaluate(model, data, th, layout, 8, 4) for th in thetas]
    many = sysid.evaluate_many(model, data, thetas, layout, 8, 4)
    assert len(many) == 5 and not np.allclose(one[0].J, one[1].J)  # the thetas differ, and so do their Js
    for a, b in zip(one, many):
        np.testing.assert_allclose(b.J, a.J, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.grad, a.grad, rtol=1e-3, atol=1e-5)
    old = sysid.ROWS_PER_PASS
    try:
        sysid.ROWS_PER_PASS = 7  # one block copy per theta per pass: many chunks
        capped = sysid.objective_many(model, data, thetas, layout, 8, 4)
    finally:
        sysid.ROWS_PER_PASS = old
    np.testing.assert_allclose(capped, [a.J.mean() for a in one], rtol=1e-5)

    lo, hi = np.full(len(layout), -3.0), np.full(len(layout), 3.0)
    hi[0] = thetas[1, 0] + 0.01  # no room for a forward step: that column steps backward
    f = sysid.Fit(thetas[1], np.arange(len(layout)), 0.0, 0.0, one[1], 1, np.zeros(len(layout), bool))
    H, ok, evaluations = sysid.hessian(model, data, layout, f, lo, hi, 8, 4)
    assert evaluations == len(layout) + 1  # the fit's point and one step per free parameter
    raw = np.zeros((len(layout), len(layout)))
    for j in range(len(layout)):  # the forward differences one evaluation at a time
        step = -sysid.FD_STEP if j == 0 else sysid.FD_STEP
        th = thetas[1].copy()
        th[j] += step
        raw[:, j] = (sysid.evaluate(model, data, th, layout, 8, 4).grad.mean(0) - one[1].grad.mean(0)) / step
    want, want_ok = sysid.floored(raw)
    assert ok == want_ok
    np.testing.assert_allclose(H, want, rtol=1e-4, atol=1e-6)


def test_a_fit_stops_on_repeats_of_its_best_point_not_on_worse_trials():
    """sysid.Progress: worse trial points (a line search overshooting) never end a fit, however
    many; STALE_EVALS returns of the best J since the last gain do, and the best point is kept."""
    p = sysid.Progress(np.zeros(2))
    assert not p.stop_after(-1.0, np.array([0.0, 0.0]))
    for k in range(10):  # overshooting trials, all worse than the best
        assert not p.stop_after(-0.5 + k * 0.01, np.array([9.0, 9.0]))
    assert not p.stop_after(-2.0, np.array([1.0, 0.0]))  # a gain resets the count
    hits = [p.stop_after(-2.0 + sysid.TOL_CHANGE / 2, np.array([1.0, 1e-9])) for _ in range(sysid.STALE_EVALS)]
    assert hits == [False] * (sysid.STALE_EVALS - 1) + [True]
    assert p.best == -2.0 and p.theta.tolist() == [1.0, 0.0]  # the point of the best J, not a later repeat


@pytest.mark.parametrize("dstar, quartic", [(1.3, 0.01), (-0.7, 0.2), (2.95, 0.0), (0.0, 0.1), (0.5, 1.0)])
def test_the_delay_search_finds_the_minimum_between_whole_shifts_in_a_few_evaluations(dstar, quartic):
    """sysid.delay_search on smooth, non-quadratic objectives (a quartic and a ripple): from the
    scan's best whole shift it reaches the minimum of J + RIDGE / 2 d^2 on a fine grid within
    TOL_CHANGE in at most 6 evaluations, and at the box's edge, pushing out, it stays there after one."""

    def J_and_grad(d):
        u = d - dstar
        return 0.05 * u**2 + quartic * u**4 + 0.002 * np.sin(3 * d), 0.1 * u + 4 * quartic * u**3 + 0.006 * np.cos(
            3 * d
        )

    def obj(d):
        return J_and_grad(d)[0] + 0.5 * sysid.RIDGE * d**2

    shifts = np.arange(-3.0, 4.0)
    Js = np.array([J_and_grad(s)[0] for s in shifts])
    d0 = shifts[np.argmin(Js)]
    d, evaluations = sysid.delay_search(J_and_grad, d0, shifts, Js, -3.0, 3.0, 40)
    grid = np.linspace(-3, 3, 60001)
    assert obj(d) <= obj(grid).min() + sysid.TOL_CHANGE and abs(d - d0) > 0  # refined off the whole shift
    assert evaluations <= 6


def test_the_delay_search_stays_at_the_edge_of_the_box_when_the_minimum_lies_beyond_it():
    """A minimum at 3.6 with the box ending at 3: the scan's best shift is the edge, the slope there
    points out of the box, and the search returns the edge after its one evaluation."""

    def J_and_grad(d):
        return 0.05 * (d - 3.6) ** 2, 0.1 * (d - 3.6)

    shifts = np.arange(-3.0, 4.0)
    Js = np.array([J_and_grad(s)[0] for s in shifts])
    edge, evaluations = sysid.delay_search(J_and_grad, 3.0, shifts, Js, -3.0, 3.0, 40)
    assert edge == 3.0 and evaluations == 1


def test_the_delay_alone_is_fitted_by_the_search_to_the_minimum_with_fewer_evaluations_than_lbfgs(pendulum_checked):
    """fit with only the delay free, on the trained Pendulum model and a reality whose torques act
    1.6 steps late (a delay near -1.6): the bracketed search ends within TOL_CHANGE of the best J on a fine grid of
    delays and next to where the general L-BFGS path (forced by start=) ends, with fewer of the
    model's evaluations after the scan."""
    from wmcheck.checks.calibration import load_run
    from wmcheck.checks.reality import RealityProfile, record_reality

    run, _, _ = pendulum_checked
    bundle = load_run(run)
    model, norm = bundle.model.eval(), Normalizer.from_dict(bundle.normalizer)
    eps = record_reality("Pendulum-v1", RealityProfile(latency_steps=1.6), "hold:5", episodes=4, max_steps=200, seed=7)
    context, H = 16, sysid.ATTRIBUTION_HORIZON
    layout = sysid.Layout.for_normalizer(norm, 3)
    data = sysid.FitData.of(eps, make_blocks(eps, norm, context, H), norm, layout)
    i_d = layout.index("delay")
    lo, hi = np.zeros(len(layout)), np.zeros(len(layout))
    lo[i_d], hi[i_d] = -3.0, 3.0
    ident = sysid.evaluate(model, data, np.zeros(len(layout)), layout, context, H)
    searched = sysid.fit(model, data, layout, [i_d], lo, hi, context, H, ident)
    start = np.zeros(len(layout))
    start[i_d] = np.round(searched.theta[i_d])
    lbfgs = sysid.fit(model, data, layout, [i_d], lo, hi, context, H, ident, start=start)

    th = np.zeros((241, len(layout)))
    th[:, i_d] = np.linspace(-3, 3, 241)
    grid = sysid.objective_many(model, data, th, layout, context, H) + 0.5 * sysid.RIDGE * th[:, i_d] ** 2
    d = searched.theta[i_d]
    assert -2.5 < d < -1.0  # the fit sees the late torques (u'[t] = u(t + d): late is negative)
    assert searched.J1 + 0.5 * sysid.RIDGE * d**2 <= grid.min() + sysid.TOL_CHANGE
    assert abs(d - lbfgs.theta[i_d]) < 0.05
    scans = 2 * layout.max_delay  # the identity's evaluation is given
    assert searched.evaluations - scans < lbfgs.evaluations
