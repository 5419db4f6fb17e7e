"""The ending test (checks/endings.py) and Fisher's exact test, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.checks.endings import ending_evidence, real_endings
from wmcheck.checks.stats import fisher_exact_p
from wmcheck.datasets.episode import Episode


def _ep(i, steps, terminated, last=0.0):
    obs = np.zeros((steps + 1, 1), np.float32)
    obs[-1] = last
    term = np.zeros(steps, bool)
    term[-1] = terminated
    return Episode(obs, np.zeros((steps, 1), np.float32), terminations=term, id=i)


def _profile(steps, last=0.0, expected_from=None, value=0.9):
    """An end profile (steps + 1,): 0.01 everywhere, `value` from row `expected_from` on, `last` at the end."""
    p = np.full(steps + 1, 0.01)
    if expected_from is not None:
        p[expected_from:] = value
    p[-1] = last
    return p


def test_fisher_exact_matches_textbook_values():
    assert fisher_exact_p(3, 10, 1, 10) == pytest.approx(0.5820, abs=1e-4)  # scipy.stats.fisher_exact
    assert fisher_exact_p(8, 8, 0, 48) < 1e-8 and fisher_exact_p(0, 5, 0, 40) == 1.0
    assert fisher_exact_p(5, 10, 5, 10) == 1.0


def test_fisher_exact_in_log_space_equals_the_exact_sum():
    """The log-space sum (stats.fisher_exact_p) against exact integer hypergeometric sums."""
    import math
    from fractions import Fraction

    def exact(k1, n1, k2, n2):
        K, N = k1 + k2, n1 + n2
        pmf = [Fraction(math.comb(K, x) * math.comb(N - K, n1 - x), math.comb(N, n1)) for x in range(0, n1 + 1)]
        return float(min(1, sum(q for q in pmf if q <= pmf[k1])))

    rng = np.random.default_rng(0)
    for _ in range(60):
        n1, n2 = int(rng.integers(1, 40)), int(rng.integers(1, 200))
        k1, k2 = int(rng.integers(0, n1 + 1)), int(rng.integers(0, n2 + 1))
        assert fisher_exact_p(k1, n1, k2, n2) == pytest.approx(exact(k1, n1, k2, n2), rel=1e-6, abs=1e-300)


def test_ending_test_finds_early_terminations_and_ignores_truncations():
    real = real_endings([_ep(i, 200, False) for i in range(40)])
    assert real == {
        "episodes": 40,
        "terminated": 0,
        "terminated_steps_mean": None,
        "held_out_end_probabilities": [],
        "held_out_probed": 0,
        "held_out_run_on": [],
    }
    level = 0.005
    early = ending_evidence([_ep(i, 30, True) for i in range(8)], real, level, (np.array([-1.0]), np.array([1.0])))
    assert early.fires and early.detail.checked_terminated == 8 and early.detail.checked_steps == 30
    cut = ending_evidence([_ep(i, 30, False) for i in range(8)], real, level)  # a time limit, not an ending
    assert not cut.fires and cut.checked
    # terminations outside the real logs' range are not judged (a goal no real log reached)
    far = ending_evidence(
        [_ep(i, 30, True, last=5.0) for i in range(8)], real, level, (np.array([-1.0]), np.array([1.0]))
    )
    assert not far.checked and "outside" in far.reason
    assert not ending_evidence([_ep(0, 30, True)], None, level).checked  # an older calibration


# ---- blocks that end at a termination (blocks.py, divergence.py) -----------------------------------------


def test_blocks_of_a_terminated_episode_run_back_from_its_end():
    from wmcheck.checks.blocks import block_starts

    assert block_starts(101, 32, 32, terminated=False) == [0, 32, 64]  # the last 5 steps are not scored
    assert block_starts(101, 32, 32, terminated=True) == [5, 37, 69]  # the last block ends at the fall
    assert block_starts(31, 32, 32, terminated=True) == []


def test_the_block_that_ends_at_a_termination_is_marked_and_keeps_its_mark():
    from wmcheck.checks.blocks import make_blocks
    from wmcheck.datasets.normalize import Normalizer

    eps = [_ep(0, 100, True), _ep(1, 100, False), _ep(2, 40, True)]
    for e in eps:
        e.observations[:] = np.random.default_rng(e.id).normal(size=e.observations.shape)
    norm = Normalizer.fit(eps)
    b = make_blocks(eps, norm, 8, 24)  # L = 32 of the 101- and 41-step views
    assert b.episode.tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert b.start.tolist() == [5, 37, 69, 0, 32, 64, 9]
    assert b.ending.tolist() == [False, False, True, False, False, False, True]
    assert b.subset([2, 3]).ending.tolist() == [True, False]
    w, parent = b.windows(8)  # 8 + 8: windows at 0, 8, 16 of each block; only the last one ends there
    assert w.ending.sum() == 2 and set(parent[w.ending]) == {2, 6}


def _scores(rng, n, shift=0.0):
    return {s: np.exp(rng.normal(shift, 0.3, n)) for s in ("divergence", "kl", "support")} | {
        "nll": rng.normal(shift, 0.3, n)
    }


def test_a_fall_the_held_out_set_never_shows_is_left_to_the_ending_test():
    """The checked episodes are the real ones, except that each ends in a fall whose last block
    scores far above every real block, its latent distance too (the held-out set holds no fall).
    Judged with that block, every episode diverges and would be unverifiable; left to the ending
    test, none is either, on the per-episode and the pooled tests. A checked episode that is worse
    before its fall is still found."""
    from wmcheck.checks.decision import Levels, episode_verdict, pooled_rejects
    from wmcheck.checks.divergence import divergence_evidence

    rng = np.random.default_rng(0)
    real_ep = np.repeat(np.arange(24), 3)  # 24 held-out episodes of 3 blocks, none of them a fall
    real = _scores(rng, len(real_ep))
    ep = np.repeat(np.arange(8), 3)  # 8 checked episodes of 3 blocks, the last one a fall
    ending = np.tile([False, False, True], 8)
    checked = _scores(rng, len(ep))
    for s in checked:
        checked[s][ending] += 4.0 if s == "nll" else 0.0
        checked[s][ending] *= 1.0 if s == "nll" else np.e**4
    levels = Levels.for_check(0.05, 8)

    def divergent(div):
        return sum(any(p < levels.episode for p in e.divergence_p.values()) for e in div.episodes)

    blind = divergence_evidence(checked, real, real_ep, ep)
    assert divergent(blind) == 8 and pooled_rejects(blind, levels)
    judged = divergence_evidence(checked, real, real_ep, ep, ending=ending, real_ending=np.zeros(len(real_ep), bool))
    assert divergent(judged) == 0 and not pooled_rejects(judged, levels)
    assert all(episode_verdict(e, levels) == "consistent" for e in judged.episodes)
    assert all(e.competence_p["support"] < levels.competence for e in blind.episodes)
    # the real side's falls are left out too: real blocks that end at a fall do not widen the null
    real_fall = np.tile([False, False, True], 24)
    real_with_falls = {s: v.copy() for s, v in real.items()}
    for s in real_with_falls:
        real_with_falls[s][real_fall] += 4.0 if s == "nll" else 0.0
        real_with_falls[s][real_fall] *= 1.0 if s == "nll" else np.e**4
    worse = {s: v.copy() for s, v in checked.items()}
    for s in worse:  # every block before the fall 1.5 std (log scale) worse than reality
        worse[s][~ending] += 0.45 if s == "nll" else 0.0
        worse[s][~ending] *= 1.0 if s == "nll" else np.exp(0.45)
    found = divergence_evidence(worse, real_with_falls, real_ep, ep, ending=ending, real_ending=real_fall)
    assert pooled_rejects(found, levels)
    widened = divergence_evidence(worse, real_with_falls, real_ep, ep, ending=ending)
    assert not pooled_rejects(widened, levels)  # with the real falls in the null, the same gap hides


def test_a_twin_that_ends_at_a_fall_is_no_twin():
    from wmcheck.checks.divergence import divergence_evidence

    rng = np.random.default_rng(1)
    real_ep = np.repeat(np.arange(6), 2)
    real = _scores(rng, 12)
    ep = np.repeat(np.arange(6), 2)
    checked = {s: v + 0.0 for s, v in real.items()}
    twin = np.arange(12)  # each checked block replays its real block
    real_fall = np.tile([False, True], 6)
    none_end = np.zeros(12, bool)  # the checked blocks do not end; half of the real ones do
    kept = divergence_evidence(checked, real, real_ep, ep, None, twin, none_end, real_fall, leave_out=True).pooled
    assert kept.paired and kept.paired_blocks == 6  # the 6 twins that are not falls, re-indexed
    assert all(p > 0.4 for p in kept.p_values.values())  # each block against itself: no difference


def test_endings_where_the_model_expects_reality_to_end_too_are_confounded_with_their_causes():
    """The continue head's end probability at the checked terminations: expected as often as at
    the real ones -> the ending is what a latency, actuator or dynamics gap gives a controlled
    system (listed, not named); not expected -> the ending row is named."""
    from wmcheck.checks.decision import top_gap
    from wmcheck.checks.evidence import CheckEvidence, DivergenceEvidence, GapEvidence, PooledEvidence

    eps = [_ep(i, 200, i < 10) for i in range(40)]
    real = real_endings(eps, eps[:10], {i: _profile(200, last=0.9) for i in range(10)})
    assert real["held_out_end_probabilities"] == [0.9] * 10 and real["held_out_run_on"] == [0] * 10
    falls = [_ep(i, 30, True) for i in range(8)]
    level = 0.005

    def last(ps):
        return {i: _profile(30, last=q) for i, q in ps.items()}

    sooner = ending_evidence(falls, real, level, None, last({i: 0.8 for i in range(8)}))
    assert sooner.fires and sooner.detail.checked_expected == 8 and sooner.detail.upstream
    assert sooner.confounded_with == ("latency", "actuator", "sensor_noise", "dynamics")
    tripped = ending_evidence(falls, real, level, None, last({i: 0.01 for i in range(8)}))
    assert tripped.fires and tripped.detail.checked_expected == 0 and not tripped.confounded_with
    # expected at 5 of 8 where real terminations are expected at 10 of 10: Fisher p 0.07 > level, upstream
    mixed = ending_evidence(falls, real, level, None, last({i: 0.8 if i < 5 else 0.1 for i in range(8)}))
    assert mixed.detail.expected_p > level and mixed.confounded_with
    # no end probabilities (an older calibration has no real ones; the check always probes its own)
    assert not ending_evidence(falls, real, level).confounded_with

    quiet = {g: GapEvidence(g, 0.1) for g in ("latency", "actuator", "sensor_noise", "dynamics")}
    none = DivergenceEvidence([], PooledEvidence({"nll": 1.0}))
    for ending, top, confounded in ((sooner, "none", ["ending", *sooner.confounded_with]), (tripped, "ending", [])):
        ev = CheckEvidence(none, {**quiet, "ending": ending, "visual": GapEvidence.not_checked("visual", "")})
        gaps = {g: ("present" if e.fires else "absent") for g, e in ev.gaps.items()} | {"distribution": "absent"}
        assert top_gap(ev, gaps, False) == (top, confounded)


def test_where_most_real_blocks_end_at_a_fall_they_are_the_null_and_are_judged():
    """Every episode falls within a block (Hopper under random commands): the real blocks that end
    at a fall are the null itself, so the checked ones are judged against them, not left out."""
    from wmcheck.checks.decision import Levels, pooled_rejects
    from wmcheck.checks.divergence import divergence_evidence, endings_left_out

    rng = np.random.default_rng(2)
    real_ep, ep = np.arange(30), np.arange(8)  # one block per episode, each ending at its fall
    real, real_end = _scores(rng, 30), np.ones(30, bool)
    worse = _scores(rng, 8, shift=0.6)  # the checked falls 2 std (log scale) worse than reality's
    assert not endings_left_out(real_end) and endings_left_out(np.tile([False, False, True], 10))
    div = divergence_evidence(worse, real, real_ep, ep, ending=np.ones(8, bool), real_ending=real_end)
    assert div.pooled.competent_blocks == 8 and pooled_rejects(div, Levels.for_check(0.05, 8))


def test_a_check_whose_every_block_is_left_to_the_ending_test_is_not_a_pass():
    """Short falling episodes whose one block each ends at the fall (left out, rare in the null):
    the divergence tests judge nothing, so what would pass is inconclusive (R8), not pass."""
    from wmcheck.checks.decision import Levels, decide
    from wmcheck.checks.divergence import divergence_evidence
    from wmcheck.checks.evidence import CheckEvidence, GapEvidence

    rng = np.random.default_rng(3)
    real_ep = np.arange(60)  # 60 held-out episodes of one block, a third of them ending at a fall
    real, real_end = _scores(rng, 60), np.tile([False, False, True], 20)
    ep = np.arange(6)  # 6 checked episodes, one block each, every one ending at its fall
    div = divergence_evidence(_scores(rng, 6), real, real_ep, ep, ending=np.ones(6, bool), real_ending=real_end)
    assert all(all(np.isnan(p) for p in e.divergence_p.values()) for e in div.episodes)
    quiet = {g: GapEvidence(g, 0.1) for g in ("latency", "actuator", "sensor_noise", "dynamics", "ending")}
    ev = CheckEvidence(div, {**quiet, "visual": GapEvidence.not_checked("visual", "")})
    assert decide(ev, Levels.for_check(0.05, 6)).verdict == "inconclusive"
    judged = divergence_evidence(_scores(rng, 6), real, real_ep, ep)  # the same blocks, judged: a pass
    assert decide(CheckEvidence(judged, ev.gaps), Levels.for_check(0.05, 6)).verdict == "pass"


# ---- episodes that run on where reality ends (endings.py, the run-on test) ----------------------------


def _real_with_early_heads():
    """40 real episodes, 16 falling at step 30; of the 20 held out, 8 fall, and the head expects
    each fall 1-5 steps early (as the double pendulum's does)."""
    eps = [_ep(i, 30, True) if i % 5 < 2 else _ep(i, 200, False) for i in range(40)]
    held = eps[:20]
    falls = [e.id for e in held if e.num_steps == 30]
    profiles = {e.id: _profile(200) for e in held} | {
        i: _profile(30, last=0.9, expected_from=29 - (j % 5)) for j, i in enumerate(falls)
    }
    return real_endings(eps, held, profiles, (np.array([-1.0]), np.array([1.0])))


def test_steps_run_on_count_from_the_first_expected_end_inside_the_range():
    from wmcheck.checks.endings import run_on_steps

    e = _ep(0, 200, False)
    assert run_on_steps(e, _profile(200, expected_from=30)) == 170
    assert run_on_steps(e, _profile(200)) is None
    assert run_on_steps(_ep(1, 30, True), _profile(30, last=0.95)) == 0  # it ends where it is expected to
    far = _ep(2, 200, False)
    far.observations[:60] = 5.0  # the first expected ends lie outside the real logs' range: not judged there
    assert run_on_steps(far, _profile(200, expected_from=30), (np.array([-1.0]), np.array([1.0]))) == 140
    real = _real_with_early_heads()
    assert real["held_out_probed"] == 20 and real["held_out_run_on"] == [1, 1, 2, 2, 3, 3, 4, 5]


def test_a_run_that_goes_on_where_reality_ends_fails_on_the_ending_row_and_names_it():
    """A simulator without reality's fall detection: its episodes go on past the states where the
    model expects the real plant to end. Where they run on into states no real log holds, the
    count test judges none of them and the steps run on against the held-out real ones' decide;
    where the counts judge them, the run-on test says what a firing row means (named, not
    confounded)."""
    from wmcheck.checks.report_build import ending_cause_sentence, ending_row

    real, level, box = _real_with_early_heads(), 0.005, (np.array([-1.0]), np.array([1.0]))
    runs = [_ep(i, 200, False, last=5.0) for i in range(8)]  # every one ends outside the real range
    profiles = {i: _profile(200, expected_from=30) if i < 6 else _profile(200) for i in range(8)}
    ev = ending_evidence(runs, real, level, box, profiles)
    d = ev.detail
    assert d.count_p is None and d.run_on.checked == [170] * 6 and d.run_on.fires
    assert ev.fires and not ev.confounded_with and d.p_value == d.run_on.p_value
    calm = [_ep(i, 200, False) for i in range(24)]  # 0 of 24 terminate: the counts fire, the run-on names it
    named = ending_evidence(calm, real, level, box, {i: _profile(200, expected_from=30) for i in range(24)})
    assert named.detail.count_p < level and named.detail.run_on.fires and not named.confounded_with
    row = ending_row(ev, "present")
    assert "6 of 8 checked episodes go on past a state" in row["explanation"]
    assert row["estimate"]["run_on"]["runs_on"] and "lacks a termination" in ending_cause_sentence(ev, _no_blocks())
    # the same runs with their expected ends outside the real logs' range: the model cannot judge them
    for e in runs:
        e.observations[:] = 5.0
    assert not ending_evidence(runs, real, level, box, profiles).fires
    # faithful runs: falls the head expects a few steps early, as reality's
    like = [_ep(i, 30, True) if i < 3 else _ep(i, 200, False) for i in range(8)]
    same = {i: _profile(30, last=0.9, expected_from=27) if i < 3 else _profile(200) for i in range(8)}
    ok = ending_evidence(like, real, level, box, same)
    assert ok.detail.run_on.checked == [3, 3, 3] and not ok.detail.run_on.fires and not ok.fires
    # where no real episode terminates the head has learned no end: the run-on test does not apply
    calm = real_endings([_ep(i, 200, False) for i in range(40)], [], {}, box)
    assert ending_evidence(runs, calm, level, None, profiles).detail.run_on is None


def test_a_run_that_ends_less_often_without_going_on_past_an_expected_end_is_confounded():
    """Fewer falls than reality's and no expected end passed: the simulator never reaches the
    failing states, which a friendlier latency, actuator, sensor-noise or dynamics does under a
    controller; the ending is listed with them, not named. Without the run-on test's null (an older
    calibration) it is named as before."""
    from wmcheck.checks.report_build import ending_cause_sentence

    real, level = _real_with_early_heads(), 0.005
    calm = [_ep(i, 200, False) for i in range(24)]
    ev = ending_evidence(calm, real, level, None, {i: _profile(200) for i in range(24)})
    assert ev.fires and ev.detail.run_on.checked == [] and ev.detail.run_on.p_value == 1.0
    assert ev.confounded_with == ("latency", "actuator", "sensor_noise", "dynamics")
    assert "do not reach the failing states" in ending_cause_sentence(ev, _no_blocks())
    older = {k: v for k, v in real.items() if k != "held_out_run_on"}
    named = ending_evidence(calm, older, level, None, {i: _profile(200) for i in range(24)})
    assert named.fires and not named.confounded_with and named.detail.p_value == named.detail.count_p


def _no_blocks():
    from wmcheck.checks.config import ROW_GAPS
    from wmcheck.checks.evidence import CheckEvidence, DivergenceEvidence, GapEvidence, PooledEvidence

    gaps = {g: GapEvidence.not_checked(g, "") for g in ROW_GAPS}
    return CheckEvidence(DivergenceEvidence([], PooledEvidence({"nll": 1.0})), gaps)


# ---- what the ending row could have seen (R7) ------------------------------------------------------------


def test_ending_power_names_the_direction_no_outcome_of_the_check_could_show():
    """16 of 40 real episodes fall. Against them 8 checked episodes that all fall would be seen
    (Fisher p 0.0039 < 0.005), 8 that never fall would not (p 0.039): a simulator without the
    fall could pass unseen. The run-on test does not help where the count test judges episodes
    (it does not decide the row there); where it judges none (every episode runs on outside the
    logs' range), the run-on test decides, and its best case counts the checked episodes with an
    expected end: 6 beyond all 8 real ones give p ~ 0.0002, 1 gives 0.11. The fewest judged
    episodes that give the count test power both ways is minimal."""
    from wmcheck.checks.endings import _episodes_needed
    from wmcheck.checks.report_build import ending_pass_sentence, ending_power_words

    real, level, box = _real_with_early_heads(), 0.005, (np.array([-1.0]), np.array([1.0]))
    runs = [_ep(i, 200, False) for i in range(8)]
    six = {i: _profile(200, expected_from=199) if i < 6 else _profile(200) for i in range(8)}
    for profiles in ({i: _profile(200) for i in range(8)}, six):
        ev = ending_evidence(runs, real, level, box, profiles)
        pw = ev.detail.power
        assert pw.sooner_p == pytest.approx(fisher_exact_p(8, 8, 16, 40)) and pw.sooner_p < level
        assert pw.later_p == pytest.approx(fisher_exact_p(0, 8, 16, 40)) and pw.later_p >= level
        assert pw.blind == ("later",) and not pw.detectable and not ev.fires
    n = pw.episodes_needed
    assert max(fisher_exact_p(n, n, 16, 40), fisher_exact_p(0, n, 16, 40)) < level
    assert max(fisher_exact_p(n - 1, n - 1, 16, 40), fisher_exact_p(0, n - 1, 16, 40)) >= level
    assert n == _episodes_needed(16, 40, level) == 14
    words = ending_power_words(ev)
    assert "had none of the 8 judged checked episodes" in words and "about 14 checked episodes" in words
    assert "0.0394" in words and "run on" not in words

    away = [_ep(i, 200, False, last=5.0) for i in range(8)]  # every one ends outside the logs' range
    reach = ending_evidence(away, real, level, box, six)
    pw = reach.detail.power
    assert pw.judged == 0 and pw.run_on_checked == 6 and reach.detail.run_on.checked == [1] * 6
    assert pw.later_p < 1e-3 and pw.blind == ("sooner",) and not reach.fires  # 1 step on: as real falls do
    assert "the count test judges no episode" in ending_power_words(reach)
    one = {i: _profile(200, expected_from=199) if i < 1 else _profile(200) for i in range(8)}
    pw = ending_evidence(away, real, level, box, one).detail.power
    assert pw.blind == ("sooner", "later") and pw.later_p > 0.1
    assert "had the 1 checked episode with an expected end run on" in ending_power_words(
        ending_evidence(away, real, level, box, one)
    )
    many = [_ep(i, 200, False) for i in range(16)]
    seen = ending_evidence(many, real, level, box, {i: _profile(200) for i in range(16)})
    assert seen.detail.power.detectable
    assert ending_pass_sentence(seen) == (
        "The ending test would have caught all 16 judged checked episodes terminating or none of them terminating."
    )


def test_where_reality_never_ends_only_sooner_endings_need_power():
    never = real_endings([_ep(i, 200, False) for i in range(3)])
    level, box = 0.005, (np.array([-1.0]), np.array([1.0]))
    one = ending_evidence([_ep(0, 200, False)], never, level, box).detail.power
    assert one.later_p is None and one.sooner_p == pytest.approx(0.25) and one.blind == ("sooner",)
    assert one.episodes_needed == 9  # 1 / C(9 + 3, 3) < 0.005 <= 1 / C(8 + 3, 3)
    many = real_endings([_ep(i, 200, False) for i in range(40)])
    assert ending_evidence([_ep(i, 200, False) for i in range(8)], many, level, box).detail.power.detectable
    # no judged episode and no run-on test: the row does not run, so it has no power
    far = ending_evidence([_ep(0, 30, True, last=5.0)], many, level, box)
    assert not far.checked and far.detail is None


def test_another_controller_explains_endings_sooner_where_expected_or_fewer_not_a_termination_rule():
    """R4b for the ending row (`GapEvidence.policy_may_cause`): a controller that differs lets the
    plant fail sooner where the model expects reality to fail too, or keeps it from failing; it
    does not change where the plant's own rule ends an episode (terminations the model does not
    expect) nor make a simulator run on past expected ends. Under another policy the decision
    makes the first two unverifiable and keeps the others failing."""
    from wmcheck.checks.decision import Levels, decide
    from wmcheck.checks.evidence import CheckEvidence, DivergenceEvidence, GapEvidence, PooledEvidence
    from wmcheck.checks.policy_match import PolicyShift

    eps = [_ep(i, 200, i < 10) for i in range(40)]
    real = real_endings(eps, eps[:10], {i: _profile(200, last=0.9) for i in range(10)})
    falls, level = [_ep(i, 30, True) for i in range(8)], 0.005
    sooner = ending_evidence(falls, real, level, None, {i: _profile(30, last=0.8) for i in range(8)})
    tripped = ending_evidence(falls, real, level, None, {i: _profile(30, last=0.01) for i in range(8)})
    heads, box = _real_with_early_heads(), (np.array([-1.0]), np.array([1.0]))
    calm = [_ep(i, 200, False) for i in range(24)]
    fewer = ending_evidence(calm, heads, level, None, {i: _profile(200) for i in range(24)})
    runs = [_ep(i, 200, False, last=5.0) for i in range(8)]
    ran_on = ending_evidence(runs, heads, level, box, {i: _profile(200, expected_from=30) for i in range(8)})
    assert all(e.fires for e in (sooner, tripped, fewer, ran_on)) and ran_on.detail.run_on.fires
    assert sooner.policy_may_cause and fewer.policy_may_cause
    assert not tripped.policy_may_cause and not ran_on.policy_may_cause

    quiet = {g: GapEvidence(g, 0.1) for g in ("latency", "actuator", "sensor_noise", "dynamics")}
    other = PolicyShift(p_value=0.5, effect=0.1, checked_episodes=8, real_episodes=12, declared="other")
    for ending, verdict in ((sooner, "unverifiable"), (fewer, "unverifiable"), (tripped, "fail"), (ran_on, "fail")):
        ev = CheckEvidence(
            DivergenceEvidence([], PooledEvidence({"nll": float("nan")})),
            {**quiet, "ending": ending, "visual": GapEvidence.not_checked("visual", "")},
            policy_shift=other,
        )
        dec = decide(ev, Levels.for_check(0.05, 8))
        assert dec.verdict == verdict and (dec.policy_confounded == ("ending",)) == (verdict == "unverifiable")
        assert dec.top_gap == ("ending" if verdict == "fail" and not ending.confounded_with else "none")
