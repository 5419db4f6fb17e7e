"""The statistics behind the verdicts: calibrated under the null, powerful under a shift."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.checks.attribution import evaluate_search, separate_top
from wmcheck.checks.stats import (
    block_mmd_test,
    cluster_bootstrap,
    cluster_resample,
    clustered_mann_whitney,
    conformal_p,
    episode_outlier_p,
    episode_t_greater,
    fourier_unit_sums,
    icc_of_ranks,
    mann_whitney_greater,
    median_bandwidth,
    mmd2_rbf,
    rank_auc,
    sign_flip_test,
    t_isf,
    t_sf,
    t_to_z,
)


def _episodes(rng, k: int, blocks: int, rho: float, shift: float = 0.0):
    """Block scores of k episodes with `blocks` blocks each: an episode effect (share rho of the
    variance) plus a block effect, as blocks of one real episode share its conditions."""
    u = rng.normal(size=k) * np.sqrt(rho)
    v = u[:, None] + rng.normal(size=(k, blocks)) * np.sqrt(1 - rho) + shift
    return v.ravel(), np.repeat(np.arange(k), blocks)


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


def test_t_tail_matches_tables():
    # two-sided table values halved: t_{0.95,4} = 2.132, t_{0.999,4} = 7.173, t_{0.995,15} = 2.947
    for t, df, p in [(2.132, 4, 0.05), (7.173, 4, 0.001), (2.947, 15, 0.005), (1.0, 1, 0.25), (0.0, 7, 0.5)]:
        assert abs(t_sf(t, df) - p) < 2e-4 * max(1.0, p / 1e-3)
    assert abs(t_sf(-1.5, 10) - (1 - t_sf(1.5, 10))) < 1e-12
    assert abs(t_isf(0.05, 4) - 2.132) < 1e-3 and abs(t_to_z(t_isf(0.01, 9), 9) - 2.3263) < 1e-3


def test_icc_of_ranks_recovers_episode_effect():
    rng = np.random.default_rng(3)
    est = [icc_of_ranks(*_episodes(rng, 30, 4, 0.5)) for _ in range(50)]
    assert 0.35 < np.mean(est) < 0.6
    assert np.mean([icc_of_ranks(*_episodes(rng, 30, 4, 0.0)) for _ in range(50)]) < 0.08
    assert icc_of_ranks(np.arange(5.0), np.zeros(5)) == 0.0  # one episode: nothing to estimate


def test_clustered_rank_test_is_calibrated_where_the_plain_one_is_not():
    """Blocks of one episode are dependent: the plain test over-rejects a faithful episode, the
    clustered one keeps alpha, with many held-out episodes or only five (weeks), and still detects
    a shifted episode."""
    rng = np.random.default_rng(4)
    for k_real, per_ep, k_checked, rho in [(16, 3, 8, 0.5), (5, 10, 1, 0.3)]:
        plain, clustered = [], []
        for _ in range(300):
            y, gy = _episodes(rng, k_real, per_ep, rho)
            x, gx = _episodes(rng, k_checked, per_ep, rho)
            plain.append(mann_whitney_greater(x, y, rng, 1000))
            clustered.append(clustered_mann_whitney(x, gx, y, gy, rng, 1000))
        assert np.mean(np.array(plain) < 0.05) > 0.1  # the dependence is real: ignoring it fails
        assert np.mean(np.array(clustered) < 0.05) <= 0.05 + 0.035  # alpha + ~3 binomial s.e.
    hits = []
    for _ in range(100):
        y, gy = _episodes(rng, 16, 3, 0.5)
        x, gx = _episodes(rng, 8, 3, 0.5, shift=1.5)
        hits.append(clustered_mann_whitney(x, gx, y, gy, rng, 1000) < 0.05)
    assert np.mean(hits) >= 0.8  # a test that never rejects fails here
    y, gy = _episodes(rng, 16, 3, 0.0)
    x, gx = _episodes(rng, 8, 3, 0.0, shift=1.0)
    # the same samples, more dependence assumed: a larger p (the plain test is the rho = 0 case)
    assert clustered_mann_whitney(x, gx, y, gy, rho=0.5) > clustered_mann_whitney(x, gx, y, gy, rho=0.0)


def test_cluster_resampling_keeps_episodes_whole():
    rng = np.random.default_rng(5)
    groups = np.repeat([7, 8, 9], [2, 3, 4])
    for idx in cluster_bootstrap(rng, groups, 20):
        for g in np.unique(groups[idx]):  # every drawn episode comes with all of its blocks
            assert np.sum(groups[idx] == g) % np.sum(groups == g) == 0
    assert len(cluster_resample(rng, groups, 7)) == 7


def test_block_mmd_permutes_episodes():
    rng = np.random.default_rng(6)

    def blocks(k, shift=0.0):  # 3 blocks per episode sharing the episode's offset
        out = []
        for _ in range(k):
            off = rng.normal(size=2) * 1.5
            out += [rng.normal(size=(8, 2)) * 0.3 + off + shift for _ in range(3)]
        return out, np.repeat(np.arange(k), 3)

    plain, grouped = [], []
    for _ in range(40):
        (x, gx), (y, gy) = blocks(6), blocks(12)
        plain.append(block_mmd_test(x, y, rng, permutations=100)[1])
        grouped.append(block_mmd_test(x, y, rng, permutations=100, x_groups=gx, y_groups=gy)[1])
    assert np.mean(np.array(plain) < 0.05) > np.mean(np.array(grouped) < 0.05)
    assert np.mean(np.array(grouped) < 0.05) <= 0.15
    (x, gx), (y, gy) = blocks(6, shift=4.0), blocks(12)
    assert block_mmd_test(x, y, rng, permutations=100, x_groups=gx, y_groups=gy)[1] < 0.05


def test_episode_level_tests_keep_alpha_and_grow_with_the_gap():
    """Episodes as units: the pooled t of episode means and the one-episode prediction test
    keep alpha on dependent, right-skewed block scores, and (unlike a rank test of a few episodes,
    which saturates once every checked block beats every real one) give smaller p for larger gaps."""
    rng = np.random.default_rng(7)

    def skewed(k, blocks, shift=0.0):  # log-normal block scores with an episode effect (rho 0.4)
        v, g = _episodes(rng, k, blocks, 0.4, shift)
        return np.exp(v), g

    pooled, single = [], []
    for _ in range(600):
        y, gy = skewed(12, 3)
        x, gx = skewed(8, 3)
        pooled.append(episode_t_greater(x, gx, y, gy, log=True))
        x1, _ = skewed(1, 3)
        single.append(episode_outlier_p(x1, y, gy, log=True))
    for ps in (pooled, single):
        assert np.mean(np.array(ps) < 0.05) <= 0.05 + 0.03
        assert np.mean(np.array(ps) < 0.05) >= 0.015  # not a test that never rejects
    y, gy = skewed(12, 3)
    p_small, p_large = (episode_t_greater(*skewed(8, 3, shift), y, gy, log=True) for shift in (3.0, 8.0))
    assert p_large < p_small < 1e-3
    # a rank test of the same blocks saturates: both shifts put every checked block above every real one
    x6, g6 = skewed(8, 3, 6.0)
    x9, g9 = skewed(8, 3, 9.0)
    assert min(x6.min(), x9.min()) > y.max()
    assert clustered_mann_whitney(x6, g6, y, gy) == clustered_mann_whitney(x9, g9, y, gy)
    assert episode_t_greater(x9, g9, y, gy, log=True) < episode_t_greater(x6, g6, y, gy, log=True)


def test_episode_t_holds_the_gap_tests_levels_with_four_checked_episodes():
    """The gap tests judge episode_t at 1e-5-1e-4 (Bonferroni over channels), with 4 checked
    episodes against some 27 real ones. On normal episode means its rejection rate at 1e-3 stays
    at the level, where Welch-Satterthwaite degrees of freedom rejected 6x as often (20x at
    1e-4): 4 episodes that agree by chance have a small variance, and that variance also takes the
    degrees of freedom up to the real side's. A shifted checked side is still found."""
    from wmcheck.checks.stats import episode_t

    rng = np.random.default_rng(5)
    gx, gy = np.arange(4), np.arange(27)
    R, level = 40_000, 1e-3
    hits = welch_hits = 0
    for _ in range(R):
        x, y = rng.normal(size=4), rng.normal(size=27)
        t, df = episode_t(x, gx, y, gy)
        hits += 2 * t_sf(abs(t), df) < level
        a, b = x.var(ddof=1) / 4, y.var(ddof=1) / 27  # Welch's t, what episode_t was
        tw, dfw = (x.mean() - y.mean()) / np.sqrt(a + b), (a + b) ** 2 / (a**2 / 3 + b**2 / 26)
        welch_hits += 2 * t_sf(abs(tw), dfw) < level
    expected = R * level  # 40
    assert hits <= expected + 3 * np.sqrt(expected), hits  # 59
    assert welch_hits > 3 * expected, welch_hits  # the test tells the two apart
    found = sum(
        2 * t_sf(abs(t), df) < level
        for t, df in (episode_t(rng.normal(3.0, size=4), gx, rng.normal(size=27), gy) for _ in range(200))
    )
    assert found >= 150, found  # a 3-sd shift of 4 episodes: power 0.9 at this level
    # one checked episode: against a new real episode (the real spread x (1 + 1/k), k - 1 df)
    y = rng.normal(size=27)
    t1, df1 = episode_t(np.array([2.0]), np.array([0]), y, gy)
    assert df1 == 26 and np.isclose(t1, (2.0 - y.mean()) / (y.std(ddof=1) * np.sqrt(1 + 1 / 27)))


def test_smoothness_finds_a_simulator_less_surprising_than_reality_and_holds_alpha():
    """The lower tail of KL / NLL: a noise-free simulator's transitions surprise the model less than
    reality's; faithful draws stay below the threshold at about the level."""
    from wmcheck.checks.attribution import smoothness_evidence

    rng = np.random.default_rng(0)

    def episodes(n, kl_scale, nll_shift, blocks=4):
        eff = rng.normal(0, 0.1, n)  # an episode effect: blocks of one episode are alike
        g = np.repeat(np.arange(n), blocks)
        kl = np.exp(np.log(0.5 * kl_scale) + eff[g] + rng.normal(0, 0.1, n * blocks))
        nll = -1.4 + nll_shift + eff[g] + rng.normal(0, 0.05, n * blocks)
        return {"kl": kl, "nll": nll}, g

    real, rg = episodes(16, 1.0, 0.0)
    smooth, sg = episodes(8, 0.6, -0.2)
    assert smoothness_evidence(smooth, sg, real, rg, 0.005).evidence >= 1
    noisier, ng = episodes(8, 1.6, 0.2)
    assert smoothness_evidence(noisier, ng, real, rg, 0.005).evidence == 0.0  # one-sided: smoother only
    fired = sum(smoothness_evidence(*episodes(8, 1.0, 0.0), real, rg, 0.05).evidence >= 1 for _ in range(200))
    assert fired <= 0.05 * 200 + 3 * np.sqrt(0.05 * 0.95 * 200), fired  # holds its level (binomial margin)


def test_the_welch_interval_of_episode_means_covers_the_difference():
    """episode_welch / welch_interval: the 95 % interval of a difference of episode means covers the
    true difference in about 95 % of draws when blocks share an episode effect (and falls far short
    when blocks are taken as the units)."""
    from wmcheck.checks.stats import episode_welch, welch_interval

    rng = np.random.default_rng(7)
    covered, naive = 0, 0
    reps = 400
    for _ in range(reps):
        gx, gy = np.repeat(np.arange(6), 4), np.repeat(np.arange(10), 4)
        x = 0.3 + rng.normal(0, 1, 6)[gx] + rng.normal(0, 0.3, len(gx))
        y = rng.normal(0, 1, 10)[gy] + rng.normal(0, 0.3, len(gy))
        lo, hi = welch_interval(*episode_welch(x, gx, y, gy))
        covered += lo <= 0.3 <= hi
        lo, hi = welch_interval(*episode_welch(x, np.arange(len(gx)), y, np.arange(len(gy))))
        naive += lo <= 0.3 <= hi
    assert 0.91 <= covered / reps <= 0.99, covered / reps
    assert naive / reps < 0.85, naive / reps


def test_fourier_mmd_estimates_the_exact_kernel_statistic():
    # the random-feature statistic must track the exact biased MMD^2 of the same bandwidth; a wrong
    # frequency scale (W ~ N(0, 1 / (2 bw)^2)) or feature normalisation would be off by a factor
    rng = np.random.default_rng(3)
    x = [rng.normal(size=(40, 3)) for _ in range(10)]
    for shift in (0.0, 0.5, 2.0):
        y = [rng.normal(size=(40, 3)) + shift for _ in range(10)]
        bw = median_bandwidth(np.concatenate(x + y), np.random.default_rng(0))
        exact = mmd2_rbf(np.concatenate(x), np.concatenate(y), bw)
        sums = fourier_unit_sums([np.concatenate(x), np.concatenate(y)], bw, np.random.default_rng(1), 4096)
        approx = float(((sums[0] / 400 - sums[1] / 400) ** 2).sum())
        assert abs(approx - exact) < 0.1 * exact + 0.01, (shift, approx, exact)
    # per-unit sums are the sums of each unit's own rows
    units = [rng.normal(size=(n, 2)) for n in (3, 1, 5)]
    one = fourier_unit_sums(units, 1.0, np.random.default_rng(2), 8)
    W_rng = np.random.default_rng(2)
    W, b = W_rng.normal(size=(2, 8)), W_rng.uniform(0, 2 * np.pi, size=8)
    want = [np.sqrt(2 / 8) * np.cos(u @ W + b).sum(0) for u in units]
    assert np.allclose(one, want)


def test_group_index_matches_unique_and_is_not_fooled_by_equal_lengths():
    from wmcheck.checks.stats import episode_means, group_index

    a, b = np.array([3, 3, 1, 2, 2, 2]), np.array([1, 1, 1, 2, 3, 3])  # same length, other labels
    for g in (a, b, a):
        labels, inv, sizes = group_index(g)
        want = np.unique(g, return_inverse=True, return_counts=True)
        assert all(np.array_equal(x, y) for x, y in zip((labels, inv, sizes), want))
    assert np.allclose(episode_means(np.arange(6.0), a), [2.0, 4.0, 0.5])
    assert np.allclose(episode_means(np.arange(6.0), b), [1.0, 3.0, 4.5])
    assert np.array_equal(group_index(np.array(["x", "y", "x"], object))[2], [2, 1])


def test_rank_permutation_with_few_real_blocks_against_many_checked():
    # the drawn subsets are uniform (every position equally often) and the p-value is the one the
    # full permutation gives: the same tail under both draws, and a shift found with 5 real blocks
    from wmcheck.checks.stats import _random_subsets

    rng = np.random.default_rng(4)
    sub = _random_subsets(rng, 20000, 5000, 5)
    assert all(len(set(r)) == 5 for r in sub[:2000])
    counts = np.bincount(sub.ravel(), minlength=5000)
    assert abs(counts.mean() - 20.0) < 1e-9 and counts.std() < 1.3 * np.sqrt(20.0)
    x, y = rng.normal(size=3000), rng.normal(size=5)
    small = _random_subsets(np.random.default_rng(0), 20000, 20, 5)  # k^2 > n: the k smallest uniforms
    assert small.shape == (20000, 5) and all(len(set(r)) == 5 for r in small[:2000])
    counts = np.bincount(small.ravel(), minlength=20)  # every position in 1/4 of the subsets
    assert abs(counts.mean() - 5000.0) < 1e-9 and counts.std() < 3 * np.sqrt(5000 * 0.75)
    pairs = np.bincount((small[:, :, None] * 20 + small[:, None, :]).ravel(), minlength=400).reshape(20, 20)
    off = pairs[~np.eye(20, dtype=bool)]  # each ordered pair of distinct positions equally often
    assert off.std() < 3 * np.sqrt(off.mean())
    assert all(sorted(r) == [0, 1, 2, 3] for r in _random_subsets(np.random.default_rng(0), 3, 4, 4))  # k = n
    ps = [mann_whitney_greater(rng.normal(size=3000), rng.normal(size=5), rng, 2000) for _ in range(200)]
    assert 0.35 < np.mean(ps) < 0.65 and np.mean(np.array(ps) < 0.1) < 0.18
    assert mann_whitney_greater(x + 2.0, y, rng) < 0.01
    assert mann_whitney_greater(x - 2.0, y, rng) > 0.9


@pytest.mark.parametrize("queries", [1, 40, 300])
def test_support_distance_is_the_exact_nearest_neighbour_distance(queries):
    """scoring.support_distance (a matrix product, then the nearest candidates re-measured): the
    float64 brute-force nearest-neighbour distance, for one query (the guard), a few and a batch;
    a query that is a reference point is at 0."""
    from wmcheck.checks.scoring import support_distance

    rng = np.random.default_rng(queries)
    ref = (rng.normal(0, 1, (500, 64)) + 30.0).astype(np.float32)  # large norms: the product's cancellation
    q = (ref[rng.integers(0, 500, queries)] + rng.normal(0, 0.3, (queries, 64))).astype(np.float32)
    q[0] = ref[7]
    want = np.sqrt(((q[:, None, :].astype(float) - ref[None].astype(float)) ** 2).sum(-1)).min(1) / 2.0
    got = support_distance(q.reshape(1, queries, 64), ref, 2.0)
    assert got.shape == (1, queries)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    assert got[0, 0] == 0.0


def test_the_column_forms_give_each_columns_lone_statistic_to_the_last_bit():
    """episode_t_columns, t_sf_many and t_to_z_many serve the residual tests' thousands of cells
    per check at once; each value must be the one a lone computation gives, to the last bit: the
    pooled t of episode means as the scalar code computed it before the column form (kept here:
    bincount means, then 1-D means and variances), the scalar tail, including one checked
    episode, no spread, signs, infinities and NaN. A column form that sums in another order, a
    fraction stopped at a common step, or a NaN spread taken for no spread fails."""
    from wmcheck.checks.stats import episode_t_columns, t_sf_many, t_to_z_many

    def lone_t(x, gx, y, gy):  # the scalar episode_t before the column form, verbatim in its arithmetic
        means = []
        for v, g in ((x, gx), (y, gy)):
            _, inv, sizes = np.unique(g, return_inverse=True, return_counts=True)
            means.append(np.bincount(inv, weights=v) / sizes)
        mx, my = means
        kx, ky = len(mx), len(my)
        diff = float(mx.mean() - my.mean())
        if kx >= 2:
            pooled = ((kx - 1) * mx.var(ddof=1) + (ky - 1) * my.var(ddof=1)) / (kx + ky - 2)
            se2, df = pooled * (1.0 / kx + 1.0 / ky), float(kx + ky - 2)
        else:
            se2, df = float(my.var(ddof=1) * (1.0 + 1.0 / ky)), float(ky - 1)
        se = np.sqrt(max(se2, 0.0))
        if se <= 0:
            return (np.copysign(np.inf, diff) if diff else 0.0), df
        return diff / se, df

    rng = np.random.default_rng(3)
    for kx, ky in ((1, 13), (2, 13), (4, 27), (8, 13), (40, 300)):  # 40 and 300 episodes: pairwise sums
        gx, gy = rng.permutation(np.repeat(np.arange(kx), 3)), rng.permutation(np.repeat(np.arange(20, 20 + ky), 2))
        x, y = rng.normal(0.4, 1.0, (len(gx), 6)), rng.normal(0.0, 1.0, (len(gy), 6))
        t, df = episode_t_columns(x, gx, y, gy)
        for j in range(6):
            assert (t[j], df) == lone_t(x[:, j], gx, y[:, j], gy)
    x = np.ones((6, 3))
    x[:, 1] = 2.0
    x[0, 2] = np.nan  # a NaN residual: no statistic, not an infinitely significant one
    t, _ = episode_t_columns(x, np.repeat(np.arange(3), 2), np.ones((8, 3)), np.repeat(np.arange(4), 2))
    assert t[0] == 0.0 and t[1] == np.inf and np.isnan(t[2])
    assert t_to_z_many(t, 4.0)[2] == 0.0
    ts = np.concatenate(
        [rng.normal(0, 4, 500), [0.0, 1e-12, -3.0, 40.0, -40.0, np.inf]]
    )  # both sides of the swap point
    dfs = rng.choice([1.0, 2.5, 7.0, 26.0, 300.0, 5e7, 0.0], len(ts))
    assert np.array_equal(t_sf_many(ts, dfs), [t_sf(float(a), float(d)) for a, d in zip(ts, dfs)])
    assert np.array_equal(t_sf_many(ts, 9.0), [t_sf(float(a), 9.0) for a in ts])
    assert np.array_equal(t_sf_many(ts, None), [t_sf(float(a), None) for a in ts])
    assert np.isnan(t_sf_many(np.array([np.nan, 2.0]), np.array([5.0, np.nan]))).all()  # NaN in, NaN out
    z = t_to_z_many(np.array([np.nan, np.inf, -np.inf, 2.0, 2.0]), np.array([9.0, 9.0, 9.0, 9.0, 1e8]))
    assert z[0] == 0.0 and z[1] == -z[2] > 30 and z[3] == t_to_z(2.0, 9.0) and z[4] == t_to_z(2.0, None)
