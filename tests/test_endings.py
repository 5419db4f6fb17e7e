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


def test_fisher_exact_matches_textbook_values():
    assert fisher_exact_p(3, 10, 1, 10) == pytest.approx(0.5820, abs=1e-4)  # scipy.stats.fisher_exact
    assert fisher_exact_p(8, 8, 0, 48) < 1e-8 and fisher_exact_p(0, 5, 0, 40) == 1.0
    assert fisher_exact_p(5, 10, 5, 10) == 1.0


def test_ending_test_finds_early_terminations_and_ignores_truncations():
    real = real_endings([_ep(i, 200, False) for i in range(40)])
    assert real == {"episodes": 40, "terminated": 0, "terminated_steps_mean": None, "held_out_end_probabilities": []}
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

    real = real_endings([_ep(i, 200, i < 10) for i in range(40)], {i: 0.9 for i in range(10)})
    assert real["held_out_end_probabilities"] == [0.9] * 10
    falls = [_ep(i, 30, True) for i in range(8)]
    level = 0.005
    sooner = ending_evidence(falls, real, level, None, {i: 0.8 for i in range(8)})
    assert sooner.fires and sooner.detail.checked_expected == 8 and sooner.detail.upstream
    assert sooner.confounded_with == ("latency", "actuator", "sensor_noise", "dynamics")
    tripped = ending_evidence(falls, real, level, None, {i: 0.01 for i in range(8)})
    assert tripped.fires and tripped.detail.checked_expected == 0 and not tripped.confounded_with
    # expected at 5 of 8 where real terminations are expected at 10 of 10: Fisher p 0.07 > level, upstream
    mixed = ending_evidence(falls, real, level, None, {i: 0.8 if i < 5 else 0.1 for i in range(8)})
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
