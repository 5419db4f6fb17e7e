"""The monitor's drift statistics (checks/drift.py): exact under no drift, a false-alarm budget that
holds over repeated looks, and drifts found within a stated delay. Features are drawn here from
heavy-tailed distributions (no model), so the tests exercise the method, not a benchmark."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.checks.drift import LookPlan, decide_look, window_test

KINDS = ["divergence", "bias", "bias", "dispersion", "support"]
TWO = np.array([False, True, True, True, False])


def draw(rng, n, shift=None):
    x = rng.standard_t(3, size=(n, len(KINDS)))
    return x if shift is None else x + shift


@pytest.mark.parametrize("m,n", [(15, 4), (30, 10)])  # exact enumeration / random draws
def test_window_test_is_exact_under_no_drift(m, n):
    rng = np.random.default_rng(0)
    ps = np.array([window_test(draw(rng, n), draw(rng, m), TWO, rng, draws=999).p_value for _ in range(400)])
    for level in (0.05, 0.2):
        rate = (ps <= level).mean()
        se = np.sqrt(level * (1 - level) / len(ps))
        assert abs(rate - level) < 3 * se + 0.01, (level, rate)


def test_feature_p_values_are_max_adjusted():
    """Each feature's p-value is at least the omnibus one, and the shifted feature is the one flagged."""
    rng = np.random.default_rng(1)
    shift = np.array([0, 0, 5.0, 0, 0])
    t = window_test(draw(rng, 8, shift), draw(rng, 20), TWO, rng, draws=2000)
    assert np.all(t.feature_p >= t.p_value - 1e-12)
    assert int(np.argmin(t.feature_p)) == 2 and t.p_value < 0.01
    assert (
        t.ci[2, 0] < t.diff[2] < t.ci[2, 1] and t.ci[2, 0] > 0
    )  # the interval excludes 0 for a 3-sd shift (5 in t(3) units)


def test_two_sided_features_see_a_negative_shift_one_sided_do_not():
    rng = np.random.default_rng(2)
    neg = window_test(draw(rng, 10, np.array([0, -5.0, 0, 0, 0])), draw(rng, 20), TWO, rng, draws=2000)
    assert neg.feature_p[1] < 0.01
    lower = window_test(draw(rng, 10, np.array([-5.0, 0, 0, 0, 0])), draw(rng, 20), TWO, rng, draws=2000)
    assert lower.feature_p[0] > 0.5  # a smaller divergence than reality is not drift


def _stream(rng, plan, looks, per_period, ref, shift_from=None, shift=None):
    """Verdicts of `looks` looks over a stream of periods (the monitor's windows over the last periods)."""
    periods, verdicts, flagged = [], [], []
    for k in range(1, looks + 1):
        periods.append(draw(rng, per_period, shift if shift_from is not None and k >= shift_from else None))
        tests = {w: window_test(np.concatenate(periods[-w:]), ref, TWO, rng, draws=2000) for w in plan.windows}
        look = decide_look(tests, plan.level, KINDS)
        verdicts.append(look.verdict)
        flagged.append(look.flagged)
    return verdicts, flagged


def test_false_alarm_budget_holds_over_repeated_looks():
    """Under no drift, the share of streams with any alarm over the planned looks stays within alpha;
    testing every look at alpha (no spending) would not, so the test can tell the method from a wrong one."""
    plan = LookPlan(alpha=0.2, looks=12, windows=(1, 4))
    rng = np.random.default_rng(3)
    any_alarm, naive = [], []
    for _ in range(100):
        ref = draw(rng, 20)
        periods, naive_alarm = [], False
        verdicts = []
        for _k in range(plan.looks):
            periods.append(draw(rng, 3))
            tests = {w: window_test(np.concatenate(periods[-w:]), ref, TWO, rng, draws=2000) for w in plan.windows}
            verdicts.append(decide_look(tests, plan.level, KINDS).verdict)
            naive_alarm |= min(t.p_value for t in tests.values()) <= plan.alpha
        any_alarm.append(any(v != "stable" for v in verdicts))
        naive.append(naive_alarm)
    rate = np.mean(any_alarm)
    assert rate <= plan.alpha + 2 * np.sqrt(plan.alpha * (1 - plan.alpha) / 100), rate
    assert np.mean(naive) > 0.5  # the unspent version alarms on most faithful streams


def test_a_drift_is_found_within_three_looks():
    """A 1.5-sd bias drift from look 5 on (6 episodes per period) is found by look 8 (at most 3 looks late) in >= 90 % of
    streams, and it is the drifted feature that is named; before it, no alarm in most streams."""
    plan = LookPlan(alpha=0.2, looks=12, windows=(1, 4))
    rng = np.random.default_rng(4)
    shift = np.array([0, 1.5 * np.sqrt(3), 0, 0, 0])  # 1.5 sd of the t(3) noise
    delays, named, early = [], [], []
    for _ in range(40):
        verdicts, flagged = _stream(rng, plan, 8, 6, draw(rng, 24), shift_from=5, shift=shift)
        hits = [k for k, v in enumerate(verdicts, 1) if v == "drifted"]
        first = next((k for k in hits if k >= 5), None)
        delays.append(np.inf if first is None else first - 5)
        named.append(first is not None and 1 in flagged[first - 1])
        early.append(any(k < 5 for k in hits))
    assert np.mean(np.array(delays) <= 3) >= 0.9, delays
    assert np.mean(named) >= 0.9
    assert np.mean(early) <= plan.alpha


def test_off_support_takes_precedence_and_too_few_episodes_are_inconclusive():
    rng = np.random.default_rng(5)
    ref = draw(rng, 20)
    new = draw(rng, 8, np.array([0, 4.0, 0, 0, 6.0]))
    look = decide_look({1: window_test(new, ref, TWO, rng, draws=5000)}, 0.001, KINDS)
    assert look.verdict == "off-support" and 4 in look.flagged
    tiny = decide_look({1: window_test(draw(rng, 1), draw(rng, 5), TWO, rng)}, 0.001, KINDS)
    assert tiny.verdict == "inconclusive" and tiny.untestable == [1]  # 6 subsets: p >= 1/6


def test_look_plan_spends_alpha_over_looks_and_windows():
    plan = LookPlan(alpha=0.05, looks=52, windows=(1, 4))
    assert plan.level == pytest.approx(0.05 / 104)
    assert plan.cycle(52) == 1 and plan.cycle(53) == 2
    with pytest.raises(ValueError):
        LookPlan(alpha=1.5)


def test_a_single_new_episode_gets_a_prediction_interval():
    """One new episode: the reference's variance stands in for both sides, with m - 1 degrees of freedom."""
    from wmcheck.checks.stats import t_critical

    rng = np.random.default_rng(6)
    ref, new = draw(rng, 10), draw(rng, 1)
    t = window_test(new, ref, TWO, rng, draws=999)
    half = t_critical(0.025, 9) * ref.std(0, ddof=1) * np.sqrt(1 + 1 / 10)
    assert np.allclose((t.ci[:, 1] - t.ci[:, 0]) / 2, half)
