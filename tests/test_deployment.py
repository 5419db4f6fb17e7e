"""The guard's deployment test (runtime/deployment.py), model-free: blocks drawn from a
random-effects model (an episode effect as large as the block noise), so a test that took blocks
as independent units would over-reject. Under no gap a look rejects at its level; a shift of the
score in either direction is found, a divergence below reality's is not (one-sided)."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.runtime.deployment import DeploymentTest, bonferroni, look_level

REAL_EPISODES, BLOCKS, PARAMS = 18, 3, 2


def draw(rng, episodes: int, shift_log_div: float = 0.0, shift_score: float = 0.0):
    """(divergences (episodes, BLOCKS), scores (episodes, BLOCKS, PARAMS)): per episode an effect
    (sd 1) shared by its blocks plus block noise (sd 1); divergences are log-normal."""
    div = np.exp(rng.normal(0, 1, (episodes, 1)) + rng.normal(0, 1, (episodes, BLOCKS)) + shift_log_div)
    scores = rng.normal(0, 1, (episodes, 1, PARAMS)) + rng.normal(0, 1, (episodes, BLOCKS, PARAMS))
    scores[..., 0] += shift_score
    return div, scores


def look(rng, checked: int = 4, **shift) -> tuple[float, float]:
    """The p-values of the look after `checked` episodes, against a fresh real set."""
    real_div, real_scores = draw(rng, REAL_EPISODES)
    test = DeploymentTest(
        checked, real_div.reshape(-1), real_scores.reshape(-1, PARAMS), np.repeat(np.arange(REAL_EPISODES), BLOCKS)
    )
    div, scores = draw(rng, checked, **shift)
    for e in range(checked):
        out = test.add(list(div[e]), list(scores[e]))
    return out


def rates(p: np.ndarray, alpha: float) -> float:
    return float(np.mean(p <= alpha))


def test_a_look_rejects_at_its_level_under_no_gap():
    rng = np.random.default_rng(0)
    p = np.array([look(rng) for _ in range(1500)])  # (reps, 2): open loop, corrections
    for alpha in (0.05, 0.01):
        se = np.sqrt(alpha * (1 - alpha) / len(p))
        assert abs(rates(p[:, 0], alpha) - alpha) < 3 * se + 1e-3, (alpha, rates(p[:, 0], alpha))
        # Bonferroni over 2 independent parameters: at most alpha, at least alpha / 2
        assert alpha / 2 - 3 * se < rates(p[:, 1], alpha) < alpha + 3 * se, (alpha, rates(p[:, 1], alpha))


def test_shifts_are_found_in_the_direction_each_statistic_tests():
    rng = np.random.default_rng(1)
    up = np.array([look(rng, shift_log_div=3.0, shift_score=3.0) for _ in range(300)])
    down = np.array([look(rng, shift_log_div=-3.0, shift_score=-3.0) for _ in range(300)])
    assert rates(up[:, 0], 0.01) > 0.8 and rates(up[:, 1], 0.01) > 0.6, (rates(up[:, 0], 0.01), rates(up[:, 1], 0.01))
    assert rates(down[:, 1], 0.01) > 0.6  # a gain too weak or too strong: two-sided
    assert rates(down[:, 0], 0.05) < 0.01  # a divergence lower than reality's is no gap: one-sided


def test_more_episodes_pooled_give_more_power():
    rng = np.random.default_rng(2)
    two = np.array([look(rng, checked=2, shift_score=2.0)[1] for _ in range(400)])
    six = np.array([look(rng, checked=6, shift_score=2.0)[1] for _ in range(400)])
    assert rates(six, 0.01) > rates(two, 0.01) + 0.3, (rates(two, 0.01), rates(six, 0.01))


def test_a_look_needs_two_episodes_and_keeps_only_the_last_ones():
    rng = np.random.default_rng(3)
    real_div, real_scores = draw(rng, REAL_EPISODES)
    groups = np.repeat(np.arange(REAL_EPISODES), BLOCKS)
    test = DeploymentTest(3, real_div.reshape(-1), None, groups)
    assert test.add([], []) == (None, None) and not test.recent  # an episode without blocks
    assert test.add([1.0, 2.0], []) == (None, None)  # one episode: the in-episode tests' job
    block_p, score_p = test.add([1.0], [])
    assert 0 < block_p < 1 and score_p is None  # corrections off
    for _ in range(5):
        test.add([50.0, 60.0], [])
    assert len(test.recent) == 3 and test.add([50.0], [])[0] < 1e-3  # only the worse, latest episodes
    with pytest.raises(ValueError, match="at least 2"):
        DeploymentTest(1, None, None, groups)


def lifetime_flags(rng, episodes: int, levels) -> np.ndarray:
    """One guard's life under no gap: a fresh real set, then a look after every episode; for each
    rule in `levels` (look number -> level per statistic), whether any look was flagged."""
    real_div, real_scores = draw(rng, REAL_EPISODES)
    test = DeploymentTest(
        4, real_div.reshape(-1), real_scores.reshape(-1, PARAMS), np.repeat(np.arange(REAL_EPISODES), BLOCKS)
    )
    div, scores = draw(rng, episodes)
    flagged = np.zeros(len(levels), bool)
    for e in range(episodes):
        ps = test.add(list(div[e]), list(scores[e]))
        if ps[0] is not None:
            flagged |= [min(ps) <= level(test.looks) for level in levels]
    return flagged


def test_the_spent_levels_keep_a_guards_whole_life_within_alpha():
    """50 looks of overlapping 4-episode pools under no gap: with the spent levels, at most alpha
    of guards ever flag a look; a fixed level of 0.01 per look flags most of them."""
    rng = np.random.default_rng(4)
    alpha = 0.05
    spent = lambda k: look_level(alpha, k, 2)  # noqa: E731
    fixed = lambda k: 0.01  # noqa: E731
    flags = np.array([lifetime_flags(rng, 52, [spent, fixed]) for _ in range(300)])  # (guards, rules)
    se = np.sqrt(alpha * (1 - alpha) / len(flags))
    assert flags[:, 0].mean() <= alpha + 2 * se, flags.mean(0)
    assert flags[:, 1].mean() > 0.3, flags.mean(0)
    assert look_level(alpha, 1, 2) == alpha / 4 and look_level(alpha, 2, 1) == alpha / 6
    assert abs(sum(look_level(alpha, k, 2) for k in range(1, 10**5)) * 2 - alpha) < 1e-5
    with pytest.raises(ValueError):
        look_level(alpha, 0, 2)


def test_bonferroni():
    assert bonferroni([0.01, 0.5]) == 0.02 and bonferroni([0.6, 0.9]) == 1.0
    assert bonferroni([float("nan"), 0.1]) == 0.2 and np.isnan(bonferroni([float("nan")]))


def test_an_episode_without_steps_leaves_the_last_look_alone(pendulum_checked):
    """A reset straight after another (no step in between) ends an empty episode: it must not
    overwrite the previous episode's deployment look on its last step."""
    from wmcheck.runtime.guard import Guard

    guard = Guard(pendulum_checked[0])
    obs = np.array([1.0, 0.0, 0.0], np.float32)
    for _ in range(2):
        guard.reset(obs)
        for _ in range(64):
            guard.act(obs, np.zeros(1))
    guard.reset(obs)  # ends episode 2: its look
    look = (guard.decisions[-1].deployment_block_p, guard.decisions[-1].deployment_score_p)
    assert look[0] is not None and look[1] is not None
    guard.reset(obs)  # an empty episode
    guard.finish(obs)
    assert (guard.decisions[-1].deployment_block_p, guard.decisions[-1].deployment_score_p) == look
    assert guard.episodes_done == 4 and len(guard.deployment.recent) == 2
