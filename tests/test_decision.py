"""The decision (checks/decision.py) rule by rule, without a model: typed evidence in, verdicts out.

Each row of CASES is one rule of the decision's docstring: the evidence that triggers it and the
verdict, exit code, failing reasons and top gap it must give. A decision that passes everything or
fails everything breaks many rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from wmcheck.checks.config import ActuatorTolerance, Gate, LatencyTolerance, Tolerances
from wmcheck.checks.decision import Levels, decide, episode_verdict, gap_verdict
from wmcheck.checks.evidence import (
    CheckEvidence,
    DistributionEvidence,
    DivergenceEvidence,
    EpisodeEvidence,
    GapEvidence,
    PooledEvidence,
    PowerEvidence,
)
from wmcheck.checks.policy_match import PolicyShift
from wmcheck.datasets.errors import UserError
from wmcheck.training.quality import Competence

LEVELS = Levels.for_check(0.05, 4)
CALM = {"divergence": 0.5, "nll": 0.4, "kl": 0.6}
TINY = 1e-9  # far below every level


def episodes(divergent: int = 0, unverifiable: int = 0, n: int = 4) -> list[EpisodeEvidence]:
    out = []
    for i in range(n):
        div = dict(CALM, nll=TINY) if i < divergent else dict(CALM)
        outside = 1 if divergent <= i < divergent + unverifiable else 0
        out.append(EpisodeEvidence(i, div, {"support": 0.5}, outside, 4))
    return out


def evidence(
    divergent=0,
    unverifiable=0,
    pooled=False,
    fire=(),
    tolerate=(),
    boot=None,
    shifted=False,
    min_coverage=None,
    coverage=1.0,
    corrected_clean=None,
    policy=None,
    not_checked=(),
    power=None,
    competent=None,
    policy_shifted=None,
) -> CheckEvidence:
    gaps = {}
    for g in ("latency", "actuator", "sensor_noise", "dynamics", "ending", "visual"):
        if g in not_checked:
            gaps[g] = GapEvidence.not_checked(g, "cannot run")
            continue
        ev = 3.0 if g in fire else 0.2
        b = np.full(50, ev) if boot is None else np.asarray(boot.get(g, np.full(50, ev)))
        gaps[g] = GapEvidence(g, ev, within_tolerance=g in tolerate, boot=b)
    div = DivergenceEvidence(
        episodes(divergent, unverifiable), PooledEvidence(dict(CALM, divergence=TINY) if pooled else dict(CALM))
    )
    corrected = None
    if corrected_clean is not None:
        corrected = (
            DivergenceEvidence(episodes(0, unverifiable), PooledEvidence(dict(CALM))) if corrected_clean else div
        )
    dist = DistributionEvidence(0.001 if shifted else 0.5, coverage=coverage, min_coverage=min_coverage)
    quality = None if competent is None else Competence(competent, 48, 0.3 if competent else 0.9, 0.6)
    shift = None
    if policy_shifted is not None:  # the policy-shift test (policy_match.py) rejecting or not
        shift = PolicyShift(p_value=0.001 if policy_shifted else 0.6, effect=1.0, checked_episodes=8, real_episodes=12)
    return CheckEvidence(div, gaps, dist, corrected, policy, power, quality, shift)


ALL_POWER = ("latency", "actuator", "sensor_noise", "sensor_bias")


def power(undetectable=(), reliable=True, measured=True, required=ALL_POWER) -> PowerEvidence:
    detectable = {g: g not in undetectable for g in ALL_POWER} if measured else {}
    return PowerEvidence(detectable, reliable, 6, tuple(required))


def no_blocks(**kwargs) -> CheckEvidence:
    """Every episode shorter than a block: no divergence evidence, only the ending test."""
    ev = evidence(**kwargs)
    ev.divergence = DivergenceEvidence([], PooledEvidence({s: math.nan for s in CALM}))
    ev.distribution = None
    return ev


def test_no_checked_block_is_inconclusive_unless_the_ending_fails():
    dec = decide(no_blocks(), LEVELS)
    assert (dec.verdict, dec.exit_code) == ("inconclusive", 3) and dec.missing_power
    dec = decide(no_blocks(fire=("ending",)), LEVELS)
    assert (dec.verdict, dec.failing, dec.top_gap) == ("fail", ("ending",), "ending")


POWER_CASES = [
    ("R7 power on every type: pass", dict(power=power()), "pass", 0, (), "none"),
    (
        "R7 a required type undetectable: inconclusive, not pass",
        dict(power=power(undetectable=("actuator",))),
        "inconclusive",
        3,
        (),
        "none",
    ),
    ("R7 power not measured: inconclusive", dict(power=power(measured=False)), "inconclusive", 3, (), "none"),
    ("R7 unreliable control: inconclusive", dict(power=power(reliable=False)), "inconclusive", 3, (), "none"),
    (
        "R7 the gate narrows the required types: a partial pass",
        dict(power=power(undetectable=("actuator",), required=("sensor_noise", "sensor_bias"))),
        "pass",
        0,
        (),
        "none",
    ),
    ("R7 never hides a failure", dict(divergent=1, power=power(measured=False)), "fail", 1, ("episodes",), "none"),
    ("R9 a competent model: pass", dict(power=power(), competent=True), "pass", 0, (), "none"),
    (
        "R9 a model no better than ARX: inconclusive, not pass",
        dict(power=power(), competent=False),
        "inconclusive",
        3,
        (),
        "none",
    ),
    ("R9 never hides a failure", dict(divergent=1, competent=False), "fail", 1, ("episodes",), "none"),
    (
        "R7 never turns unverifiable into inconclusive",
        dict(unverifiable=1, power=power(measured=False)),
        "unverifiable",
        1,
        (),
        "none",
    ),
]

CASES = [
    # (rule, evidence kwargs, verdict, exit code, failing reasons, top gap)
    ("R6 nothing found: pass", {}, "pass", 0, (), "none"),
    ("E1/R1 a divergent episode fails", dict(divergent=1), "fail", 1, ("episodes",), "none"),
    ("R1 the pooled test alone fails", dict(pooled=True), "fail", 1, ("pooled",), "none"),
    ("G3/R1 a present gap fails without divergence", dict(fire=("actuator",)), "fail", 1, ("actuator",), "actuator"),
    (
        "T1 two gaps, the bootstrap separates",
        dict(fire=("latency", "actuator"), boot={"latency": np.full(50, 5.0)}),
        "fail",
        1,
        ("latency", "actuator"),
        "latency",
    ),
    (
        "T1 two gaps the bootstrap cannot separate are confounded",
        dict(
            fire=("latency", "actuator"),
            boot={"latency": np.r_[np.full(25, 5.0), np.ones(25)], "actuator": np.full(50, 3.0)},
        ),
        "fail",
        1,
        ("latency", "actuator"),
        "none",
    ),
    ("R2 a tolerated gap alone passes", dict(fire=("latency",), tolerate=("latency",)), "pass", 0, (), "latency"),
    (
        "R2 tolerated, and its correction removes the divergence: pass",
        dict(divergent=2, pooled=True, fire=("latency",), tolerate=("latency",), corrected_clean=True),
        "pass",
        0,
        (),
        "latency",
    ),
    (
        "R2 tolerated, but the divergence remains after the correction: fail",
        dict(divergent=2, pooled=True, fire=("latency",), tolerate=("latency",), corrected_clean=False),
        "fail",
        1,
        ("episodes", "pooled"),
        "latency",
    ),
    (
        "R2 a tolerated gap does not excuse another present gap",
        dict(fire=("latency", "dynamics"), tolerate=("latency",), boot={"dynamics": np.full(50, 9.0)}),
        "fail",
        1,
        ("dynamics",),
        "dynamics",
    ),
    ("E2/R5 an episode outside competence: unverifiable", dict(unverifiable=1), "unverifiable", 1, (), "none"),
    (
        "E1 beats E2: divergent on its competent blocks fails",
        dict(divergent=1, unverifiable=1),
        "fail",
        1,
        ("episodes",),
        "none",
    ),
    ("R3/T3 a distribution gap alone is reported, not failing", dict(shifted=True), "pass", 0, (), "distribution"),
    (
        "R1 coverage below the gate's binding minimum fails",
        dict(min_coverage=0.9, coverage=0.5),
        "fail",
        1,
        ("coverage",),
        "distribution",
    ),
    (
        "R4/T1 residual gaps on shifted states: unverifiable, not fail, and no top gap but the shift",
        dict(shifted=True, fire=("sensor_noise",)),
        "unverifiable",
        1,
        (),
        "distribution",
    ),
    (
        "T1 an R4 row stays a cause when the run fails on divergence (a dynamics gap moves the states)",
        dict(shifted=True, pooled=True, fire=("dynamics",)),
        "fail",
        1,
        ("pooled",),
        "dynamics",
    ),
    (
        "R4 does not cover the searches: a latency gap on shifted states fails",
        dict(shifted=True, fire=("latency",)),
        "fail",
        1,
        ("latency",),
        "latency",
    ),
    (
        "R4b/T1 a latency gap under another policy than the logs': unverifiable, not fail, and not the top gap",
        dict(policy_shifted=True, fire=("latency",)),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4b actuator and latency under another policy, the states shifted too: unverifiable, no top gap",
        dict(policy_shifted=True, shifted=True, fire=("latency", "actuator"), boot={"latency": np.full(50, 5.0)}),
        "unverifiable",
        1,
        (),
        "distribution",
    ),
    (
        "T1 under another policy divergence does not fail the run (R4c), so an R4b row is not named",
        dict(
            policy_shifted=True,
            divergent=1,
            fire=("actuator", "dynamics"),
            boot={"actuator": np.full(50, 9.0), "dynamics": np.full(50, 4.0)},
        ),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4b covers the residual rows: a sensor-noise gap under another policy, on the logs' states, is unverifiable",
        dict(policy_shifted=True, fire=("sensor_noise",)),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4b covers the residual rows: a dynamics gap under another policy is unverifiable, not the top gap",
        dict(policy_shifted=True, fire=("dynamics",)),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4b needs the test to reject: a sensor-noise gap under the logs' policy fails",
        dict(policy_shifted=False, fire=("sensor_noise",)),
        "fail",
        1,
        ("sensor_noise",),
        "sensor_noise",
    ),
    (
        "R4b does not excuse a row the model does not score: a visual gap under another policy fails",
        dict(policy_shifted=True, fire=("visual",)),
        "fail",
        1,
        ("visual",),
        "visual",
    ),
    (
        "R4c a divergent episode under another policy on the logs' states: unverifiable, not fail",
        dict(policy_shifted=True, divergent=1, fire=("latency",)),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4c the pooled test under another policy on the logs' states: unverifiable, not fail",
        dict(policy_shifted=True, pooled=True),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4c excuses divergence only: an ending gap under another policy on the logs' states still fails",
        dict(policy_shifted=True, divergent=1, fire=("ending",)),
        "fail",
        1,
        ("ending",),
        "ending",
    ),
    (
        "R4c a divergent episode under another policy on other states: unverifiable, not fail",
        dict(policy_shifted=True, shifted=True, divergent=1),
        "unverifiable",
        1,
        (),
        "distribution",
    ),
    (
        "R4c the pooled test under another policy on other states: unverifiable, not fail",
        dict(policy_shifted=True, shifted=True, pooled=True),
        "unverifiable",
        1,
        (),
        "none",
    ),
    (
        "R4c needs the other policy: a divergent episode on shifted states under the logs' policy fails",
        dict(policy_shifted=False, shifted=True, divergent=1),
        "fail",
        1,
        ("episodes",),
        "distribution",
    ),
    (
        "R4c with R2: a tolerated gap whose correction leaves no divergence, under another policy: pass",
        dict(
            policy_shifted=True,
            shifted=True,
            divergent=1,
            fire=("visual",),
            tolerate=("visual",),
            corrected_clean=True,
        ),
        "pass",
        0,
        (),
        "visual",
    ),
    (
        "T1 on shifted states a run failing on another row (visual) names no R4 row as its top gap",
        dict(shifted=True, fire=("sensor_noise", "visual")),
        "fail",
        1,
        ("visual",),
        "visual",
    ),
    (
        "R4c excuses divergence only: a visual gap under another policy on other states still fails",
        dict(policy_shifted=True, shifted=True, pooled=True, fire=("visual",)),
        "fail",
        1,
        ("visual",),
        "visual",
    ),
    (
        "R4b needs the test to reject: a latency gap under the logs' policy fails",
        dict(policy_shifted=False, fire=("latency",)),
        "fail",
        1,
        ("latency",),
        "latency",
    ),
    ("R1 a visual gap fails", dict(fire=("visual",)), "fail", 1, ("visual",), "visual"),
    ("R1/T2 an ending gap fails", dict(fire=("ending",)), "fail", 1, ("ending",), "ending"),
    ("R1 a failed policy gate fails a consistent check", dict(policy=False), "fail", 1, ("policy_gate",), "none"),
    (
        "G1 tests that could not run neither pass nor fail a gap",
        dict(not_checked=("latency", "actuator")),
        "pass",
        0,
        (),
        "none",
    ),
]


@pytest.mark.parametrize(
    "rule,kwargs,verdict,code,failing,top", CASES + POWER_CASES, ids=[c[0] for c in CASES + POWER_CASES]
)
def test_decision_rules(rule, kwargs, verdict, code, failing, top):
    dec = decide(evidence(**kwargs), LEVELS)
    assert (dec.verdict, dec.exit_code, dec.failing, dec.top_gap) == (verdict, code, failing, top), dec


def test_r4c_names_the_divergence_it_excuses():
    dec = decide(evidence(policy_shifted=True, shifted=True, divergent=1, pooled=True), LEVELS)
    assert dec.divergence_confounded == ("episodes", "pooled") and dec.failing_without_tolerance == ()
    assert decide(evidence(policy_shifted=True, shifted=True), LEVELS).divergence_confounded == ()
    assert decide(evidence(policy_shifted=True, divergent=1), LEVELS).divergence_confounded == ("episodes",)
    assert decide(evidence(policy_shifted=False, shifted=True, divergent=1), LEVELS).divergence_confounded == ()
    # R2 first: the divergence R4c would excuse is judged after the tolerated corrections
    clean = evidence(
        policy_shifted=True, shifted=True, divergent=1, fire=("visual",), tolerate=("visual",), corrected_clean=True
    )
    assert decide(clean, LEVELS).divergence_confounded == ()


def test_r4c_message_says_what_diverged_and_why_it_does_not_fail():
    from wmcheck.checks.report_build import message

    ev = evidence(policy_shifted=True, shifted=True, divergent=1, pooled=True)
    text = message(decide(ev, LEVELS), ev, {}, {}, LEVELS)
    assert text.startswith("UNVERIFIABLE: 1 of 4 episode(s) diverge and the pooled divergence test rejects")
    assert "another policy" in text and "logs' policy" in text and "PASS" not in text and "FAIL" not in text


def test_allow_unverifiable_changes_the_exit_code_not_the_verdict():
    dec = decide(evidence(unverifiable=1), LEVELS, allow_unverifiable=True)
    assert dec.verdict == "unverifiable" and dec.exit_code == 0
    assert decide(evidence(divergent=1), LEVELS, allow_unverifiable=True).exit_code == 1


def test_an_incompetent_model_is_named_as_the_reason():
    dec = decide(evidence(power=power(), competent=False), LEVELS)
    assert dec.model_not_competent and dec.missing_power == ()
    assert not decide(evidence(power=power(undetectable=("actuator",)), competent=True), LEVELS).model_not_competent
    assert not decide(evidence(divergent=1, competent=False), LEVELS).model_not_competent  # a fail is a fail


def test_inconclusive_lists_what_the_check_could_not_have_seen():
    dec = decide(evidence(power=power(undetectable=("latency", "actuator"))), LEVELS)
    assert dec.missing_power == ("latency", "actuator")
    assert decide(evidence(power=power(measured=False)), LEVELS).missing_power == ALL_POWER
    assert decide(evidence(power=power()), LEVELS).missing_power == ()


def test_tolerated_pass_is_flagged_and_keeps_the_episode_verdicts_as_checked():
    dec = decide(evidence(divergent=2, fire=("latency",), tolerate=("latency",), corrected_clean=True), LEVELS)
    assert dec.verdict == "pass" and dec.tolerated_by_gate
    assert dec.count("divergent") == 2  # what the simulator does as it is
    assert dec.failing_without_tolerance == ("episodes", "latency")
    assert decide(evidence(), LEVELS).tolerated_by_gate is False


def test_gap_and_episode_rows():
    assert gap_verdict(GapEvidence("latency", 1.0)) == "present"  # evidence >= 1 fires
    assert gap_verdict(GapEvidence("latency", 0.999)) == "absent"
    assert gap_verdict(GapEvidence("latency", 2.0, within_tolerance=True)) == "tolerated"
    assert gap_verdict(GapEvidence("latency", math.nan)) == "absent"
    assert gap_verdict(GapEvidence.not_checked("latency", "x")) == "not_checked"
    nan_ep = EpisodeEvidence(0, {s: math.nan for s in CALM}, {}, 4, 4)  # no competent block
    assert episode_verdict(nan_ep, LEVELS) == "unverifiable"
    edge = EpisodeEvidence(0, dict(CALM, kl=LEVELS.episode * 1.01), {}, 0, 4)
    assert episode_verdict(edge, LEVELS) == "consistent"
    edge.divergence_p["kl"] = LEVELS.episode * 0.99
    assert episode_verdict(edge, LEVELS) == "divergent"


def test_levels_split_alpha_over_scores_episodes_and_gaps():
    lv = Levels.for_check(0.05, 5)
    assert lv.episode == pytest.approx(0.025 / (2 * 3 * 5))
    assert lv.pooled == pytest.approx(0.025 / 6)
    assert lv.gap == pytest.approx(0.05 / 10)  # half of alpha over the five gap tests
    assert lv.competence == pytest.approx(0.05 / 10)
    assert Levels.for_check(0.05, 50).episode < lv.episode  # more episodes, stricter per episode


def test_gate_rejects_unknown_misspelt_and_mistyped_keys(tmp_path):
    cases = {
        "latency: {max_step: 1}": "max_step",
        "sensor_noise: {max_ratioo: 2}": "max_ratioo",
        "lateny: {max_steps: 1}": "lateny",
        "latency: {max_steps: one}": "max_steps",
        "dynamics: {max_ratio: 2}": "max_ratio",
    }
    for body, name in cases.items():
        f = tmp_path / "gate.yaml"
        f.write_text(f"tolerances:\n  {body}\n")
        with pytest.raises(UserError) as err:
            Gate.load(f)
        assert name in str(err.value), (body, str(err.value))
    (tmp_path / "g2.yaml").write_text("allow_unverifiable: 'yes'\n")
    with pytest.raises(UserError, match="allow_unverifiable"):
        Gate.load(tmp_path / "g2.yaml")
    for name, body in {
        "dup.yaml": "alpha: 0.05\nalpha: 0.1\n",
        "dup_nested.yaml": "tolerances:\n  latency: {max_steps: 1, max_steps: 2}\n",
        "dup.json": '{"alpha": 0.05, "alpha": 0.1}',
        "loop.yaml": "require_power: &x [latency, *x]\n",
    }.items():
        (tmp_path / name).write_text(body)
        with pytest.raises(UserError, match="twice|refers to itself|recursive"):
            Gate.load(tmp_path / name)
    (tmp_path / "g3.yaml").write_text("alpah: 0.05\n")
    with pytest.raises(UserError, match="alpah"):
        Gate.load(tmp_path / "g3.yaml")
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        "alpha: 0.01\ntolerances:\n  latency: {max_steps: 1}\n  sensor_noise: {max_ratio: 1.5, max_bias: 0.1}\n"
    )
    gate = Gate.load(ok)
    assert gate.tolerances.latency.covers(-1) and not gate.tolerances.latency.covers(2)
    assert gate.tolerances.sensor_noise.covers(0.8, 0.05) and not gate.tolerances.sensor_noise.covers(1.2, 0.2)


def test_tolerances_cover_only_what_they_name():
    t = Tolerances(actuator=ActuatorTolerance(max_gain_error=0.1))
    assert t.actuator.covers("gain", 0.95) and not t.actuator.covers("gain", 0.8)
    assert not t.actuator.covers("offset", 0.0)  # no offset bound given: an offset is not tolerated
    assert not LatencyTolerance().covers(0)


def test_strength_ranks_runs_by_their_tests_ratios_to_the_thresholds():
    """decision.strength: below 1 when no test fires, at least 1 when any divergence or gap test
    does, and the largest ratio itself (not a count of fired tests)."""
    from wmcheck.checks.decision import strength

    calm = strength(evidence(), LEVELS)
    assert calm < 1.0
    # the calm run's largest ratio: the gap rows' 0.2 or a score's level / p (p = 0.4 .. 0.6)
    assert calm == pytest.approx(max(0.2, LEVELS.pooled / 0.4, LEVELS.episode / 0.4))
    assert strength(evidence(fire=("dynamics",)), LEVELS) == pytest.approx(3.0)
    assert strength(evidence(pooled=True), LEVELS) == pytest.approx(LEVELS.pooled / TINY)
    assert strength(evidence(divergent=1), LEVELS) == pytest.approx(LEVELS.episode / TINY)
    # a row that could not run adds nothing; a run where no test ran has no strength
    assert strength(
        evidence(not_checked=("latency", "actuator", "sensor_noise", "dynamics", "ending", "visual")), LEVELS
    ) == pytest.approx(max(LEVELS.pooled / 0.4, LEVELS.episode / 0.4))
    empty = CheckEvidence(
        DivergenceEvidence([], PooledEvidence({})),
        {
            g: GapEvidence.not_checked(g, "no block")
            for g in ("latency", "actuator", "sensor_noise", "dynamics", "ending", "visual")
        },
    )
    assert strength(empty, LEVELS) is None


def test_a_sub_step_delay_is_listed_with_dynamics_not_named():
    """T1: a latency finding whose fitted delay rounds to zero steps (gap_tests.sub_step) fails the
    run but is not the top gap: it is listed with dynamics. A whole-step delay is named; and when
    the dynamics row fires and the bootstrap separates it, dynamics is named."""
    from dataclasses import replace

    from wmcheck.checks.gap_tests import sub_step

    assert sub_step(0.23) and sub_step(-0.49) and not sub_step(-0.75) and not sub_step(1.01)
    ev = evidence(fire=("latency",))
    named = decide(ev, LEVELS)
    assert (named.verdict, named.top_gap) == ("fail", "latency")
    ev.gaps["latency"] = replace(ev.gaps["latency"], confounded_with=("dynamics",))
    d = decide(ev, LEVELS)
    assert d.verdict == "fail" and "latency" in d.failing
    assert d.top_gap == "none" and d.confounded == ["latency", "dynamics"]
    boot = {"latency": np.full(50, 2.0), "dynamics": np.full(50, 5.0)}
    both = evidence(fire=("latency", "dynamics"), boot=boot)
    both.gaps["latency"] = replace(both.gaps["latency"], confounded_with=("dynamics",))
    assert decide(both, LEVELS).top_gap == "dynamics"
    # the dynamics row fires on what the delay does not explain: dynamics is named even when the
    # latency row's evidence is the larger (damping x3 on HalfCheetah: latency 3.2, dynamics 2.0)
    both.gaps["latency"] = replace(both.gaps["latency"], boot=np.full(50, 5.0))
    both.gaps["dynamics"] = replace(both.gaps["dynamics"], boot=np.full(50, 2.0))
    d = decide(both, LEVELS)
    assert (d.verdict, d.top_gap) == ("fail", "dynamics") and {"latency", "dynamics"} <= set(d.failing)
    # without that look-alike flag, the larger latency evidence would be named
    both.gaps["latency"] = replace(both.gaps["latency"], confounded_with=())
    assert decide(both, LEVELS).top_gap == "latency"


def test_a_gain_that_comes_with_a_sub_step_lag_is_a_look_alike_of_dynamics():
    """gap_tests.bandwidth_lookalike: a fractional delay and fitted gains that move the response the
    same way (later and weaker, earlier and stronger) are a slower or faster plant's two halves; a
    gain against the delay's direction, a whole-step delay, or gains whose intervals hold 1 are
    not. T1 then names the dynamics row that fires beside them, however large the actuator's
    evidence."""
    from dataclasses import replace

    from wmcheck.checks.gap_tests import bandwidth_lookalike
    from wmcheck.checks.sysid import Estimate, Layout

    layout = Layout.of(n_actions=2, n_inputs=0, max_delay=4)
    p = {(q.kind, q.channel): q for q in layout.params}
    delay = {d: Estimate(p[("delay", None)], None, d, (d - 0.02, d + 0.02), 5.0) for d in (-0.28, 0.2, -1.01)}

    def est(kind, value, channel=0, half_width=0.05):
        return Estimate(p[(kind, channel)], f"act_{channel}", value, (value - half_width, value + half_width), 5.0)

    weaker = [est("gain", 0.83), est("gain", 0.86, 1), est("offset", 0.01), est("deadband", -0.008)]
    assert bandwidth_lookalike(delay[-0.28], weaker)  # damping x2 on HalfCheetah
    assert bandwidth_lookalike(delay[0.2], [est("gain", 1.15), est("gain", 1.02, 1)])  # a faster plant
    assert not bandwidth_lookalike(delay[-0.28], [est("gain", 1.15)])  # later but stronger
    assert not bandwidth_lookalike(delay[-0.28], [est("gain", 0.83), est("gain", 1.15, 1)])  # mixed
    assert not bandwidth_lookalike(delay[0.2], weaker)
    assert not bandwidth_lookalike(delay[-1.01], weaker)  # a whole step: latency
    assert not bandwidth_lookalike(delay[-0.28], [est("gain", 0.97, half_width=0.05), est("offset", -0.1)])
    assert not bandwidth_lookalike(None, weaker) and not bandwidth_lookalike(delay[-0.28], [])

    boot = {"latency": np.full(50, 3.0), "actuator": np.full(50, 6.0), "dynamics": np.full(50, 2.0)}
    ev = evidence(fire=("latency", "actuator", "dynamics"), boot=boot)
    ev.gaps["latency"] = replace(ev.gaps["latency"], confounded_with=("dynamics",))
    assert decide(ev, LEVELS).top_gap == "actuator"  # a gain of its own: the larger evidence is named
    ev.gaps["actuator"] = replace(ev.gaps["actuator"], confounded_with=("dynamics",))
    d = decide(ev, LEVELS)
    assert (d.verdict, d.top_gap) == ("fail", "dynamics") and {"latency", "actuator"} <= set(d.failing)
    # without the dynamics row the two look-alikes are listed with it, not named
    alone = evidence(fire=("latency", "actuator"), boot=boot)
    for g in ("latency", "actuator"):
        alone.gaps[g] = replace(alone.gaps[g], confounded_with=("dynamics",))
    d = decide(alone, LEVELS)
    assert d.top_gap == "none" and d.confounded == ["actuator", "latency", "dynamics"]
    # two look-alikes the bootstrap cannot separate: listed with their look-alike as well
    tangled = evidence(
        fire=("latency", "actuator"), boot={"latency": np.linspace(1, 5, 50), "actuator": np.full(50, 3.0)}
    )
    for g in ("latency", "actuator"):
        tangled.gaps[g] = replace(tangled.gaps[g], confounded_with=("dynamics",))
    d = decide(tangled, LEVELS)
    assert d.top_gap == "none" and set(d.confounded) == {"latency", "actuator", "dynamics"}, d.confounded


def test_a_residual_level_beside_a_dynamics_row_is_reported_with_dynamics():
    """gap_tests.SENSOR_LEVEL_EXPLAINED_BY: dynamics, latency and actuator gaps change the residuals'
    level as well, so the sensor-noise row, firing beside one of those rows, is reported and the
    other row is named, even when the sensor row's evidence is the larger or the bootstrap cannot
    rank them (damping x2 on HalfCheetah, deterministic and with reality's noise: both fired, top
    gap none). Alone the sensor row is named."""
    from dataclasses import replace

    from wmcheck.checks.gap_tests import SENSOR_LEVEL_EXPLAINED_BY

    tangled = {"sensor_noise": np.linspace(1.5, 4.5, 50), "dynamics": np.linspace(4.0, 2.0, 50)}
    ev = evidence(fire=("sensor_noise", "dynamics"), boot=tangled)
    before = decide(ev, LEVELS)
    assert before.top_gap == "none" and set(before.confounded) == {"sensor_noise", "dynamics"}
    ev.gaps["sensor_noise"] = replace(ev.gaps["sensor_noise"], explained_by=SENSOR_LEVEL_EXPLAINED_BY)
    d = decide(ev, LEVELS)
    assert (d.verdict, d.top_gap, d.confounded) == ("fail", "dynamics", [])
    assert {"sensor_noise", "dynamics"} <= set(d.failing)  # reported: both rows still fail the run
    larger = evidence(fire=("sensor_noise", "dynamics"), boot={"sensor_noise": np.full(50, 9.0)})
    larger.gaps["sensor_noise"] = replace(larger.gaps["sensor_noise"], explained_by=("dynamics",))
    assert decide(larger, LEVELS).top_gap == "dynamics"
    alone = evidence(fire=("sensor_noise",))
    alone.gaps["sensor_noise"] = replace(alone.gaps["sensor_noise"], explained_by=("dynamics",))
    assert decide(alone, LEVELS).top_gap == "sensor_noise"
    with_latency = evidence(fire=("sensor_noise", "latency"), boot={"latency": np.full(50, 1.5)})
    assert decide(with_latency, LEVELS).top_gap == "sensor_noise"  # without the rule: the larger evidence
    with_latency.gaps["sensor_noise"] = replace(
        with_latency.gaps["sensor_noise"], explained_by=SENSOR_LEVEL_EXPLAINED_BY
    )
    assert decide(with_latency, LEVELS).top_gap == "latency"


def test_a_sub_step_delay_is_applied_before_the_residual_tests():
    """The corrections applied before the residual and bias tests are those of the supported gaps,
    a sub-step delay included, so that the dynamics row sees only what the delay does not explain."""
    from wmcheck.checks.gap_tests import applied_columns
    from wmcheck.checks.sysid import Layout

    layout = Layout.of(n_actions=2, n_inputs=0, max_delay=4)
    delay = layout.index("delay")
    actuator = [int(j) for j in layout.columns("actuator")]
    assert applied_columns(layout, {"latency"}) == [delay]
    assert sorted(applied_columns(layout, {"latency", "actuator"})) == sorted([delay, *actuator])
    assert applied_columns(layout, {"actuator"}) == actuator
    assert applied_columns(layout, set()) == []


def test_the_check_geometry_fits_the_held_out_episodes():
    """CheckConfig.fitted_to: the horizon shrinks to the median held-out episode, never below
    MIN_HORIZON, then the context, never below MIN_CONTEXT; a geometry that fits is kept."""
    from wmcheck.checks.config import CheckConfig
    from wmcheck.datasets.windows import MIN_CONTEXT, MIN_HORIZON

    cfg = CheckConfig()
    assert cfg.fitted_to([201] * 10) == (cfg, None)
    short, note = cfg.fitted_to([51] * 9 + [201])
    assert (short.context, short.horizon) == (16, 35) and "35" in note and "51" in note
    assert cfg.fitted_to([40, 51, 51, 60, 201])[0].horizon == 35  # the median episode, not the shortest
    assert cfg.fitted_to([16 + MIN_HORIZON] * 5)[0].horizon == MIN_HORIZON
    # shorter still: the horizon stays at MIN_HORIZON and the context gives way (a hopper that falls)
    hop, note = cfg.fitted_to([9, 12, 16, 16, 16, 30, 40])
    assert (hop.context, hop.horizon) == (8, MIN_HORIZON) and "after 8 observed" in note and "16 steps" in note
    assert cfg.fitted_to([MIN_CONTEXT + MIN_HORIZON] * 5)[0].context == MIN_CONTEXT
    assert cfg.fitted_to([MIN_CONTEXT + MIN_HORIZON - 1] * 5) == (cfg, None)  # no block fits: make_blocks says so
    assert cfg.fitted_to([]) == (cfg, None)
    # an asked geometry below the floors is kept where it fits, and never grown
    small = CheckConfig(context=2, horizon=4)
    assert small.fitted_to([7] * 3) == (small, None) and small.fitted_to([5] * 3) == (small, None)


def test_a_pass_needs_the_ending_rows_power_where_it_is_required():
    """R7 covers the ending row through its best case (endings.EndingPower, PowerEvidence.ending)."""
    required = ALL_POWER + ("ending",)
    blind = PowerEvidence({g: True for g in ALL_POWER}, True, 6, required, ending=False)
    dec = decide(evidence(power=blind), LEVELS)
    assert (dec.verdict, dec.exit_code, dec.missing_power) == ("inconclusive", 3, ("ending",))
    seen = PowerEvidence({g: True for g in ALL_POWER}, True, 6, required, ending=True)
    assert decide(evidence(power=seen), LEVELS).verdict == "pass"
    partial = PowerEvidence({g: True for g in ALL_POWER}, True, 6, ALL_POWER, ending=False)
    assert decide(evidence(power=partial), LEVELS).verdict == "pass"  # the gate left the ending out
    unmeasured = PowerEvidence({}, True, 6, required, ending=True)
    assert decide(evidence(power=unmeasured), LEVELS).missing_power == ALL_POWER


def test_the_teams_policy_declaration_overrides_the_policy_shift_test():
    """R4b / R4c read PolicyShift.shifted, which follows `--checked-policy` over the test: a
    latency finding under the declared logs' controller fails even where the (approximate,
    closed-loop) test rejects; under a declared other policy it is unverifiable where it does not."""
    logs = evidence(fire=("latency",), divergent=1)
    logs.policy_shift = PolicyShift(p_value=0.001, effect=1.0, checked_episodes=8, real_episodes=12, declared="logs")
    dec = decide(logs, LEVELS)
    assert dec.verdict == "fail" and "latency" in dec.failing and not dec.policy_confounded
    other = evidence(fire=("latency",), divergent=1)
    other.policy_shift = PolicyShift(p_value=0.6, effect=0.1, checked_episodes=8, real_episodes=12, declared="other")
    dec = decide(other, LEVELS)
    assert dec.verdict == "unverifiable" and dec.policy_confounded == ("latency",)
    assert dec.divergence_confounded == ("episodes",)
    closed = evidence(fire=("latency",))
    closed.policy_shift = PolicyShift(p_value=0.6, effect=0.1, checked_episodes=8, real_episodes=12, closed_loop=True)
    dec = decide(closed, LEVELS)  # undeclared on a closed loop: the test cannot tell, so no fail
    assert closed.policy_shift.undetermined and dec.verdict == "unverifiable" and dec.policy_confounded == ("latency",)
