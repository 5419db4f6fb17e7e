"""The statistics behind the verdicts: calibrated under the null, powerful under a shift."""
from __future__ import annotations

import numpy as np

from wmcheck.checks.attribution import evaluate_search, separate_top
from wmcheck.checks.stats import block_mmd_test, conformal_p, mann_whitney_greater, rank_auc, sign_flip_test


def test_mann_whitney_false_alarm_rate_and_power():
    rng = np.random.default_rng(0)
    null = np.array([mann_whitney_greater(rng.gamma(2, size=25), rng.gamma(2, size=40), rng) for _ in range(400)])
    assert 0.02 <= (null < 0.05).mean() <= 0.09  # calibrated (skewed scores, normal approximation)
    small = np.array([mann_whitney_greater(rng.normal(size=4), rng.normal(size=30), rng, 2000) for _ in range(200)])
    assert (small < 0.05).mean() <= 0.09  # exact permutation branch
    shifted = np.array([mann_whitney_greater(rng.normal(1.0, size=25), rng.normal(size=40), rng) for _ in range(100)])
    assert (shifted < 0.05).mean() >= 0.9  # a detector that flags nothing fails here
    assert rank_auc(np.ones(5), np.zeros(5)) == 1.0 and rank_auc(np.zeros(5), np.zeros(5)) == 0.5


def test_conformal_p():
    ref = np.arange(99.0)
    assert conformal_p(1000.0, ref)[0] == 0.01
    assert conformal_p(-1.0, ref)[0] == 1.0
    assert abs(conformal_p(49.5, ref)[0] - 0.5) < 0.02


def test_block_mmd_respects_blocks():
    rng = np.random.default_rng(1)
    # autocorrelated blocks from the same distribution: a per-step test would reject, the block test must not
    def blocks(n, shift=0.0):
        return [np.cumsum(rng.normal(size=(8, 2)), 0) * 0.3 + rng.normal(size=2) + shift for _ in range(n)]
    ps = [block_mmd_test(blocks(15), blocks(15), rng, permutations=100)[1] for _ in range(40)]
    assert np.mean(np.array(ps) < 0.05) <= 0.15
    assert block_mmd_test(blocks(15, shift=3.0), blocks(15), rng, permutations=100)[1] < 0.05


def test_search_evidence_null_and_effect():
    rng = np.random.default_rng(2)
    grid = np.arange(-2, 3)
    real = rng.normal(size=(5, 40)) * 0.1 + np.array([0.3, 0.1, 0.0, 0.1, 0.3])[:, None]  # identity (index 2) best
    boot = rng.integers(0, 30, size=(200, 30))
    same = rng.normal(size=(5, 30)) * 0.1 + np.array([0.3, 0.1, 0.0, 0.1, 0.3])[:, None]
    res = evaluate_search(same, real, grid, 2, 0.05, rng, 200, boot)
    assert res.evidence < 1.0
    shifted = rng.normal(size=(5, 30)) * 0.1 + np.array([0.4, 0.3, 0.2, 0.0, 0.2])[:, None]  # best at +1
    res = evaluate_search(shifted, real, grid, 2, 0.05, rng, 200, boot)
    assert res.evidence > 1.0 and grid[res.best] == 1 and res.interval == (1.0, 1.0)


def test_separate_top():
    b = {"a": np.full(100, 5.0), "b": np.full(100, 1.0)}
    assert separate_top(b, ["a", "b"]) == ("a", [])
    rng = np.random.default_rng(0)
    b = {"a": rng.normal(3, 1, 100), "b": rng.normal(3, 1, 100)}
    top, conf = separate_top(b, ["a", "b"])
    assert top == "none" and set(conf) == {"a", "b"}
    assert separate_top(b, []) == ("none", [])


def test_sign_flip_false_alarm_rate_and_power():
    # Paired differences centred on 0 (symmetric, heavy-tailed) are rejected about alpha of the time,
    # in the sign-flip branch (n < 30) and the normal branch; a shift of half a standard deviation is
    # found; the wrong direction is not evidence.
    rng = np.random.default_rng(0)
    for n in (12, 60):
        null_p = np.array([sign_flip_test(rng.standard_t(3, size=n), rng, flips=2000) for _ in range(300)])
        assert 0.02 <= np.mean(null_p < 0.05) <= 0.09, (n, np.mean(null_p < 0.05))
    shifted = np.array([sign_flip_test(rng.normal(0.5, 1, size=60), rng) for _ in range(50)])
    assert np.mean(shifted < 0.05) > 0.9
    few = np.array([sign_flip_test(rng.normal(1.5, 1, size=12), rng, flips=2000) for _ in range(50)])
    assert np.mean(few < 0.05) > 0.9
    assert sign_flip_test(rng.normal(-1, 1, size=30), rng) > 0.5
    assert sign_flip_test(np.zeros(5)) == 1.0
