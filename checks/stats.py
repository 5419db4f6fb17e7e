"""Statistics for the checks: blocks of consecutive steps are the sample units, episodes the clusters.

Owns: the one-sided Mann-Whitney U test (checked blocks vs held-out real blocks) and its effect size
(the probability that a checked block scores higher than a real one, 0.5 = indistinguishable);
the episode-level tests the verdicts use (Welch's t of episode means, its paired version for
replays of logged conditions, and the random-effects prediction test of one episode against a new
real one), with an exact Student-t tail; the clustered rank test (design effect of the episodes,
Kish, with the rank intra-class correlation of the real episodes, after Rosner, Glynn & Lee,
Biometrics 2003) for block samples that are cut further (operating-regime bins); conformal
p-values of single blocks; the episode (cluster) bootstrap and resampling used for intervals and
for the null distribution of search statistics; the MMD two-sample test (random Fourier features) whose
permutations exchange whole episodes.

Steps inside a trajectory are autocorrelated, so nothing here treats steps as i.i.d.: every
sample unit is a block of consecutive steps (calibration and checks cut the same blocks). Blocks
of one episode are not independent either (they share its initial conditions, weather, operator):
a test that counts them as independent units is anti-conservative (its false-alarm rate exceeds
alpha), so the checks pass episode labels, and episodes are the units of every verdict test.
"""

from __future__ import annotations

import functools
import math

import numpy as np


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def t_sf(t: float, df: float) -> float:
    """Upper tail P(T > t) of Student's t with df degrees of freedom (exact, through the
    regularised incomplete beta function); the normal tail when df is unknown or huge."""
    if df is None or df <= 0 or df > 1e7:
        return _norm_sf(t)
    tail = 0.5 * _betainc(0.5 * df, 0.5, df / (df + t * t))  # P(|T| > |t|) / 2
    return tail if t > 0 else 1.0 - tail


def t_sf_many(t: np.ndarray, df) -> np.ndarray:
    """`t_sf(t, df)` of every element of t (n,), to the last bit; df a number, (n,) or None."""
    t = np.asarray(t, float)
    if df is not None:
        df = np.broadcast_to(np.asarray(df, float), t.shape)
    # t_sf's normal tail where df is unknown or huge (a NaN df gives NaN, as there)
    normal = np.ones(t.shape, bool) if df is None else (df <= 0) | (df > 1e7)
    out = np.zeros(t.shape)
    for i in np.flatnonzero(normal):
        out[i] = _norm_sf(float(t[i]))
    st = ~normal
    if st.any():
        v, k = t[st], df[st]
        tail = 0.5 * _betainc_many(0.5 * k, np.full(len(k), 0.5), k / (k + v * v))  # P(|T| > |t|) / 2
        out[st] = np.where(v > 0, tail, 1.0 - tail)
    return out


def t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = p (Student, df degrees of freedom), by bisection on t_sf."""
    lo, hi = -1.0, 1.0
    while t_sf(hi, df) > p:
        hi *= 2.0
    while t_sf(lo, df) < p:
        lo *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_sf(mid, df) > p else (lo, mid)
    return 0.5 * (lo + hi)


def half_steps(df: np.ndarray) -> np.ndarray:
    """Degrees of freedom (> 0) rounded down to half steps, as twice their value (>= 1; capped at
    2000, where t is normal): the keys of `t_critical`'s cached quantiles."""
    return np.maximum(np.floor(np.minimum(df, 2000.0) * 2.0).astype(int), 1)


@functools.lru_cache(maxsize=8192)
def _t_critical_half(p: float, half_df: int) -> float:
    return t_isf(p, half_df / 2.0)


def t_critical(p: float, df: float) -> float:
    """`t_isf(p, df)` with df rounded down to a half step (a slightly larger, i.e. conservative,
    quantile), cached: the few distinct values are bisected once, not per cell and call."""
    return _t_critical_half(float(p), int(half_steps(np.array([df]))[0]))


_TINY = 1e-300  # the modified Lentz method's guard against a zero denominator
_CF_TOL = 1e-14  # the continued fraction ends when a step changes it by less than this share
_CF_STEPS = 500


def _cf_numerators(a: float, b: float, x, m: int):
    """The two numerators of step m of the continued fraction of I_x(a, b) (x a float or an array)."""
    return (
        m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
        -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
    )


def _log_front(a: float, b: float, x: float) -> float:
    return math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    f = d
    for m in range(1, _CF_STEPS):
        for num in _cf_numerators(a, b, x, m):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            f *= c * d
        if abs(c * d - 1.0) < _CF_TOL:
            break
    return math.exp(_log_front(a, b, x)) * f / a


def _betainc_many(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`_betainc(a, b, x)` of every element (a, b, x each (n,)), to the last bit: the same
    operations in the same order per element, each element's fraction ending at its own step (the
    residual tests evaluate thousands of them per check)."""
    x = np.asarray(x, float)
    out = np.full_like(x, np.nan)  # NaN stays NaN
    out[x <= 0.0], out[x >= 1.0] = 0.0, 1.0
    idx = np.flatnonzero((x > 0.0) & (x < 1.0))
    if not len(idx):
        return out
    v, a, b = x[idx], np.asarray(a, float)[idx], np.asarray(b, float)[idx]
    # the fraction converges fast only below (a + 1) / (a + b + 2); above it I_x(a, b) = 1 - I_1-x(b, a)
    swap = v > (a + 1.0) / (a + b + 2.0)
    p, q, v = np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1.0 - v, v)
    value = np.ones_like(v)  # where 1 - x rounds to 1: I_1(b, a) = 1, as the scalar recursion returns
    frac = v < 1.0
    if frac.any():
        pf, qf, vf = p[frac], q[frac], v[frac]
        front = np.array([math.exp(_log_front(float(pi), float(qi), float(vi))) for pi, qi, vi in zip(pf, qf, vf)])
        value[frac] = front * _continued_fraction(pf, qf, vf) / pf
    out[idx] = np.where(swap, 1.0 - value, value)
    return out


def _continued_fraction(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The modified Lentz fraction of `_betainc` for every element (a, b, x each (n,)), each
    element's value taken at the step where it converges."""
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / np.where(np.abs(d) > _TINY, d, _TINY)
    c, f = np.ones_like(x), d.copy()
    out = np.empty_like(x)
    live = np.arange(len(x))  # positions still iterating
    for m in range(1, _CF_STEPS):
        for num in _cf_numerators(a, b, x, m):
            d = 1.0 + num * d
            d = 1.0 / np.where(np.abs(d) > _TINY, d, _TINY)
            c = 1.0 + num / c
            c = np.where(np.abs(c) > _TINY, c, _TINY)
            f = f * (c * d)
        done = np.abs(c * d - 1.0) < _CF_TOL
        if done.any():
            out[live[done]] = f[done]
            keep = ~done
            live, a, b, x, c, d, f = live[keep], a[keep], b[keep], x[keep], c[keep], d[keep], f[keep]
            if not len(live):
                return out
    out[live] = f
    return out


def rank_auc(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) for samples x (checked) and y (real)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    ranks = _ranks(np.concatenate([x, y]))
    u = ranks[: len(x)].sum() - len(x) * (len(x) + 1) / 2.0
    return float(u / (len(x) * len(y)))


def separation(x: np.ndarray, y: np.ndarray) -> float:
    """max(AUC, 1 - AUC) of `rank_auc`: how well a score tells the checked blocks from the real ones
    in either direction (a simulator smoother than reality scores *lower* than real data)."""
    a = rank_auc(x, y)
    return a if math.isnan(a) else max(a, 1.0 - a)


def _ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 1..n of v (n,), ties given their average rank."""
    return _ranks_and_ties(v)[0]


def _ranks_and_ties(v: np.ndarray) -> tuple[np.ndarray, float]:
    """(average ranks (n,), sum over tied groups of t^3 - t) from one sort of v (n,)."""
    _, inv, counts = np.unique(np.asarray(v), return_inverse=True, return_counts=True)
    average = np.cumsum(counts) - 0.5 * (counts - 1)  # (k,) the mean rank of each distinct value
    return average[inv.ravel()].astype(float), float((counts.astype(float) ** 3 - counts).sum())


def _rank_sum_z(x: np.ndarray, y: np.ndarray, continuity: bool) -> float | None:
    """Normal-approximation z of the Mann-Whitney U of x (n,) over y (m,), tie-corrected; None
    when its variance is 0 (every value tied)."""
    n, m = len(x), len(y)
    ranks, tie = _ranks_and_ties(np.concatenate([x, y]))
    u = ranks[:n].sum() - n * (n + 1) / 2.0
    var = n * m / 12.0 * ((n + m + 1) - tie / ((n + m) * (n + m - 1)))
    if var <= 0:
        return None
    return float((u - n * m / 2.0 - (0.5 if continuity else 0.0)) / math.sqrt(var))


def mann_whitney_z(x: np.ndarray, y: np.ndarray, continuity: bool = False) -> float:
    """Normal-approximation z of the one-sided Mann-Whitney statistic (x larger than y), with the
    tie correction (and the continuity correction if asked); cheap enough for bootstrap replicates."""
    z = _rank_sum_z(np.asarray(x, float), np.asarray(y, float), continuity)
    return 0.0 if z is None else z


def mann_whitney_greater(
    x: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None, permutations: int = 20000
) -> float:
    """One-sided p-value for "x tends to be larger than y" (x checked blocks, y real blocks).

    Exact by Monte-Carlo permutation when either sample is small (< 12), otherwise the normal
    approximation with tie and continuity corrections.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return float("nan")
    if min(n, m) < 12:
        rng = rng or np.random.default_rng(0)
        ranks = _ranks(np.concatenate([x, y]))
        observed, total = ranks[:n].sum(), ranks.sum()
        k = min(n, m)  # draw the smaller side's positions: sum_x = total - sum_y
        sums = ranks[_random_subsets(rng, permutations, n + m, k)].sum(1)  # (P,)
        if k < n:
            sums = total - sums
        return float((1 + np.sum(sums >= observed - 1e-9)) / (permutations + 1))
    z = _rank_sum_z(x, y, continuity=True)
    return 1.0 if z is None else float(_norm_sf(z))


def _random_subsets(rng: np.random.Generator, draws: int, n: int, k: int) -> np.ndarray:
    """`draws` uniform k-subsets of range(n), as (draws, k) indices. k large against n: the
    positions of the k smallest of n uniforms per draw. Small k (a few real blocks against
    hundreds of checked ones): k independent draws per row, rows with a repeat drawn again
    (ordered distinct k-tuples are uniform, so their sets are uniform k-subsets), without the
    (draws, n) uniforms; at k^2 <= n fewer than 40 % of rows repeat."""
    if k * k > n:
        return (
            np.argpartition(rng.random((draws, n)), k - 1, axis=1)[:, :k]
            if k < n
            else np.tile(np.arange(n), (draws, 1))
        )
    out = rng.integers(0, n, size=(draws, k))
    while True:
        srt = np.sort(out, axis=1)
        bad = np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(1))
        if not len(bad):
            return out
        out[bad] = rng.integers(0, n, size=(len(bad), k))


def icc_of_ranks(values: np.ndarray, groups: np.ndarray) -> float:
    """Intra-class correlation of the ranks of `values` (n,) within `groups` (n,), one-way ANOVA
    estimator for unequal group sizes, clipped to [0, 1]; 0 with fewer than 2 groups or no group
    of 2 or more (no within-group information: nothing to inflate by)."""
    v = np.asarray(values, float)
    g = np.asarray(groups)
    labels, inv, sizes = np.unique(g, return_inverse=True, return_counts=True)
    k, n = len(labels), len(v)
    if k < 2 or n <= k:
        return 0.0
    r = _ranks(v)
    means = np.bincount(inv, weights=r) / sizes
    grand = r.mean()
    ssb = float((sizes * (means - grand) ** 2).sum())
    ssw = float(((r - means[inv]) ** 2).sum())
    msb, msw = ssb / (k - 1), ssw / (n - k)
    n0 = (n - (sizes**2).sum() / n) / (k - 1)  # effective group size
    den = msb + (n0 - 1) * msw
    return float(np.clip((msb - msw) / den, 0.0, 1.0)) if den > 0 else 0.0


def design_effect(groups: np.ndarray, rho: float) -> float:
    """Kish's design effect 1 + rho (sum n_c^2 / N - 1) of a sample in clusters of sizes n_c: how
    much the variance of its mean exceeds that of N independent units."""
    _, sizes = np.unique(np.asarray(groups), return_counts=True)
    N = sizes.sum()
    return float(1.0 + rho * ((sizes**2).sum() / N - 1.0)) if N else 1.0


def clustered_mann_whitney(
    x: np.ndarray,
    x_groups: np.ndarray,
    y: np.ndarray,
    y_groups: np.ndarray,
    rng: np.random.Generator | None = None,
    permutations: int = 20000,
    rho: float | None = None,
) -> float:
    """One-sided p-value for "x tends to be larger than y" when both samples come in clusters
    (x: checked blocks by checked episode, y: held-out real blocks by real episode).

    The Mann-Whitney statistic's variance is the sum of an x part and a y part (its Hajek
    projection); clustering inflates each by its design effect, with rho the intra-class
    correlation of the ranks within the real episodes (under the null the checked episodes are
    like real ones, so one rho serves both). The normal approximation with the inflated variance
    gives the p-value, never below the unclustered test's (exact on small samples): with rho = 0
    the test is the ordinary one.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    p_plain = mann_whitney_greater(x, y, rng, permutations)
    if n == 0 or m == 0:
        return p_plain
    rho = icc_of_ranks(y, y_groups) if rho is None else float(rho)
    if rho <= 0:
        return p_plain
    t = mann_whitney_z(x, y, continuity=True) / math.sqrt(
        variance_inflation(design_effect(x_groups, rho), design_effect(y_groups, rho), n, m)
    )
    # rho comes from the real episodes alone: with k of them the statistic is Student-t-like with
    # k - 1 degrees of freedom, not normal (with 5 held-out weeks the normal tail would be too thin)
    return float(max(p_plain, t_sf(t, len(np.unique(y_groups)) - 1)))


def episode_outlier_p(x: np.ndarray, y: np.ndarray, y_groups: np.ndarray, log: bool = True) -> float:
    """One-sided p-value that one checked episode, with block scores x (n,), scores higher than a
    new real episode would: a prediction test against the real episodes (y (m,) blocks labelled by
    y_groups), not a comparison of blocks.

    Real block scores follow a one-way random-effects model (episode effect, variance s_b^2, plus
    block noise, s_w^2, ANOVA estimates). A new episode's mean over n blocks varies by
    s_b^2 + s_w^2 / n around the real grand mean (the mean of the k episode means, itself
    uncertain by (s_b^2 + s_w^2 mean(1 / n_c)) / k); t = (mean(x) - grand) / sd, Student-t with
    k - 1 degrees of freedom. Unlike a rank test of one episode's few blocks against the real
    blocks, it neither treats the episode's blocks as independent nor saturates when every block
    is worse than every real one (a larger gap gives a smaller p). Scores are compared on a log
    scale (`log`: divergence z^2, KL, latent distances are positive and right-skewed); NaN with
    fewer than 2 real episodes.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if log:
        x, y = log_pair(x, y)
    labels, inv, sizes = group_index(y_groups)
    k, N = len(labels), len(y)
    if k < 2 or len(x) == 0:
        return float("nan")
    means = np.bincount(inv, weights=y) / sizes
    msw = float(((y - means[inv]) ** 2).sum() / (N - k)) if N > k else 0.0
    msb = float((sizes * (means - means.mean()) ** 2).sum() / (k - 1))
    n0 = (N - (sizes**2).sum() / N) / (k - 1) if N > k else 1.0
    s_b2 = max((msb - msw) / max(n0, 1e-12), 0.0)
    var = s_b2 + msw / len(x) + (s_b2 + msw * float(np.mean(1.0 / sizes))) / k
    if var <= 0:
        return 0.0 if x.mean() > means.mean() else 1.0
    return t_sf(float((x.mean() - means.mean()) / math.sqrt(var)), k - 1)


def group_index(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels (k,), inverse (n,), sizes (k,)) of np.unique(groups), cached by the labels' bytes:
    the same few label arrays (the held-out episodes, a check's episodes) are grouped tens of
    thousands of times by the power table and the tests. Returned arrays are read-only."""
    g = np.ascontiguousarray(groups)
    if g.dtype.hasobject:  # the bytes of object arrays are pointers, not labels
        return np.unique(g, return_inverse=True, return_counts=True)
    return _group_index(g.tobytes(), g.dtype.str, g.shape)


@functools.lru_cache(maxsize=512)
def _group_index(raw: bytes, dtype: str, shape: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = np.unique(np.frombuffer(raw, dtype).reshape(shape), return_inverse=True, return_counts=True)
    for a in out:
        a.flags.writeable = False
    return out


def episode_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Mean of `values` (n,) within each group (sorted group order): (k,)."""
    _, inv, sizes = group_index(groups)
    return np.bincount(inv.ravel(), weights=np.asarray(values, float)) / sizes


def left_out_quantiles(values: np.ndarray, groups: np.ndarray, q: float) -> np.ndarray:
    """(n,) per row of values (n, T): the q quantile of the other groups' values (all of them when
    there is one group). A reference's own rows are then not in-sample for their bound."""
    values, groups = np.asarray(values, float), np.asarray(groups)
    ids = np.unique(groups)
    if len(ids) < 2:
        return np.full(len(values), float(np.quantile(values, q)))
    out = np.empty(len(values))
    for g in ids:
        m = groups == g
        out[m] = np.quantile(values[~m], q)
    return out


def log_pair(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log of positive, right-skewed scores, with a floor 1000x below the smallest positive real value."""
    floor = max(float(np.min(y[y > 0])) if np.any(y > 0) else 1e-12, 1e-12) * 1e-3
    return np.log(np.maximum(x, floor)), np.log(np.maximum(y, floor))


def episode_t(
    x: np.ndarray, x_groups: np.ndarray, y: np.ndarray, y_groups: np.ndarray, log: bool = False
) -> tuple[float, float]:
    """Two-sample t of checked vs real with episodes as the units, under the null every test that
    uses it has: the checked episodes are real episodes (exchangeable with the held-out ones).
    Student's t of the episode means with the pooled variance and kx + ky - 2 degrees of freedom;
    with a single checked episode, its mean against a new real episode's (variance of the real
    episode means x (1 + 1/k), k - 1 degrees of freedom, the same test). Blocks of one episode are
    dependent and enter only through their episode's mean, and unlike a rank test the statistic
    keeps growing with the gap (a rank test of few episodes saturates once every checked block is
    worse than every real one).

    Why not Welch's t (as until calibration v11): the gap tests judge it at levels of 1e-5-1e-4
    (Bonferroni over channels), and with 4 checked episodes Welch-Satterthwaite degrees of freedom
    fail there. When the 4 episodes agree by chance, the small variance also takes the degrees of
    freedom up to the real side's. On normal episode means (4 against 27) it rejected at 20x the
    level at 1e-4 and 6x at 1e-3; the pooled t is exact at every level (docs/benchmarks.md,
    nineteenth session). Intervals keep Welch's form (`episode_welch`): they are read under the alternative.
    `log`: compare log scores (positive, right-skewed statistics). Returns (t, df); (nan, nan) with
    no checked or fewer than 2 real episodes."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if log:
        x, y = log_pair(x, y)
    t, df = episode_t_columns(x[:, None], x_groups, y[:, None], y_groups)
    return float(t[0]), df


def episode_t_columns(
    x: np.ndarray, x_groups: np.ndarray, y: np.ndarray, y_groups: np.ndarray
) -> tuple[np.ndarray, float]:
    """`episode_t` of every column of x (n, K) against the same column of y (m, K) at once: (t (K,),
    df); every column gets the arithmetic of a lone call, to the last bit (each column's episode
    means are a contiguous row, so every mean and variance sums in the same order)."""
    return pooled_t_of_means(episode_means_columns(x, x_groups), episode_means_columns(y, y_groups))


def pooled_t_of_means(mx: np.ndarray, my: np.ndarray) -> tuple[np.ndarray, float]:
    """`episode_t_columns` from the episode means (K, kx) and (K, ky) (`episode_means_columns`), so
    a caller that tests many resamples of one side against the same other side computes that
    side's means once."""
    K, kx, ky = mx.shape[0], mx.shape[1], my.shape[1]
    if kx == 0 or ky < 2:
        return np.full(K, float("nan")), float("nan")
    diff = mx.mean(1) - my.mean(1)
    if kx >= 2:
        pooled = ((kx - 1) * mx.var(1, ddof=1) + (ky - 1) * my.var(1, ddof=1)) / (kx + ky - 2)
        se2, df = pooled * (1.0 / kx + 1.0 / ky), float(kx + ky - 2)
    else:
        se2, df = _against_a_new_episode(my)
    se = np.sqrt(np.maximum(se2, 0.0))
    flat = se <= 0  # no spread: a difference is infinitely significant, none is 0 (a NaN spread gives NaN)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(flat, np.where(diff != 0, np.copysign(np.inf, diff), 0.0), diff / np.where(flat, 1.0, se))
    return t, df


def episode_means_columns(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(K, k): `episode_means` of every column of values (n, K), one C-contiguous row per column,
    from one bincount whose bins are (column, episode): each bin sums its values in row order, as
    a bincount of the column alone does."""
    values = np.asarray(values, float)
    n, K = values.shape
    if not n:
        return np.zeros((K, 0))
    _, inv, sizes = group_index(groups)
    k = len(sizes)
    bins = (inv.ravel()[None, :] + k * np.arange(K)[:, None]).ravel()  # (K n,) column-major
    return np.bincount(bins, weights=values.T.ravel(), minlength=K * k).reshape(K, k) / sizes


def _episode_mean_pair(x, x_groups, y, y_groups, log: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(checked, real) episode means (on log scores with `log`); None with no checked or fewer than
    2 real episodes."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if log:
        x, y = log_pair(x, y)
    mx, my = episode_means(x, x_groups), episode_means(y, y_groups)
    return None if len(mx) == 0 or len(my) < 2 else (mx, my)


def _against_a_new_episode(my: np.ndarray):
    """(variance, df) of one checked episode's mean minus the real episodes' mean under the null that
    it is a new real episode: var(real episode means) x (1 + 1/k), k - 1 degrees of freedom. my:
    (k,) real episode means, or (K, k) one row per statistic (then the variance is (K,))."""
    k = my.shape[-1]
    return my.var(-1, ddof=1) * (1.0 + 1.0 / k), float(k - 1)


def episode_welch(
    x: np.ndarray, x_groups: np.ndarray, y: np.ndarray, y_groups: np.ndarray, log: bool = False
) -> tuple[float, float, float]:
    """The difference of episode means (checked - real), its Welch standard error and degrees of
    freedom (one checked episode: against a new real episode), for intervals of the difference
    (the tests use `episode_t`'s pooled form). (nan, nan, nan) with no checked or fewer than 2 real
    episodes."""
    pair = _episode_mean_pair(x, x_groups, y, y_groups, log)
    if pair is None:
        return float("nan"), float("nan"), float("nan")
    mx, my = pair
    kx, ky = len(mx), len(my)
    if kx >= 2:
        a, b = mx.var(ddof=1) / kx, my.var(ddof=1) / ky
        se2 = a + b
        den = (a**2 / (kx - 1) if a > 0 else 0.0) + b**2 / (ky - 1)
        df = se2**2 / den if den > 0 else float(kx + ky - 2)
    else:
        se2, df = _against_a_new_episode(my)
    return float(mx.mean() - my.mean()), math.sqrt(max(se2, 0.0)), float(df)


def welch_interval(diff: float, se: float, df: float, level: float = 0.95) -> tuple[float, float]:
    """The Student interval diff -/+ t_{df, (1 + level) / 2} se ((nan, nan) where undefined)."""
    if any(math.isnan(v) for v in (diff, se, df)) or df <= 0:
        return float("nan"), float("nan")
    q = t_critical((1 - level) / 2, df)  # df rounded down to a half step: at most a little wider
    return diff - q * se, diff + q * se


def t_to_z(t: float, df: float) -> float:
    """The standard-normal quantile with the same tail probability as Student's t (sign kept), so
    statistics with different degrees of freedom share one scale of critical values."""
    return float(t_to_z_many(np.array([t], float), df)[0])


def t_to_z_many(t: np.ndarray, df) -> np.ndarray:
    """`t_to_z` of every element of t (n,) (0 where t is NaN); df a number or (n,)."""
    from statistics import NormalDist

    t = np.asarray(t, float)
    finite = np.isfinite(t)
    p = np.zeros(len(t))  # an infinite t: tail 0, floored below
    if finite.any():
        dfs = None if df is None else np.broadcast_to(np.asarray(df, float), t.shape)[finite]
        p[finite] = t_sf_many(np.abs(t[finite]), dfs)
    inv = NormalDist().inv_cdf
    z = np.array([-inv(min(max(float(q), 1e-300), 0.5)) for q in p])
    return np.where(np.isnan(t), 0.0, np.copysign(z, t))


def paired_episode_t_greater(diff: np.ndarray, groups: np.ndarray) -> float:
    """One-sided p-value that paired differences (checked block minus its real counterpart, (n,))
    are positive, with episodes as the units: one-sample t of the episode means of the differences,
    k - 1 degrees of freedom (NaN with fewer than 2 episodes). Pairing removes what the checked and
    the real episode share (weather, operating conditions), so it is far more sensitive than an
    unpaired comparison when the checked data replay logged conditions."""
    m = episode_means(diff, groups)
    k = len(m)
    if k < 2:
        return float("nan")
    sd = m.std(ddof=1)
    if sd <= 0:
        return 0.0 if m.mean() > 0 else 1.0
    return t_sf(float(m.mean() / (sd / math.sqrt(k))), k - 1)


def episode_t_greater(
    x: np.ndarray, x_groups: np.ndarray, y: np.ndarray, y_groups: np.ndarray, log: bool = False
) -> float:
    """One-sided p-value of `episode_t` (checked episodes score higher than real ones)."""
    t, df = episode_t(x, x_groups, y, y_groups, log)
    if math.isnan(t):
        return float("nan")
    return t_sf(t, df)


def variance_inflation(deff_x: float, deff_y: float, n: int, m: int) -> float:
    """Factor by which clustering inflates the Mann-Whitney variance: its x part (share m / (n + m))
    times deff_x plus its y part (share n / (n + m)) times deff_y."""
    return (deff_x * m + deff_y * n) / (n + m)


def cluster_bootstrap(rng: np.random.Generator, groups: np.ndarray, reps: int) -> list[np.ndarray]:
    """`reps` bootstrap resamples of the units indexed 0..n-1 that draw whole clusters (episodes)
    with replacement, as many as there are: each replicate is an index array of varying length."""
    groups = np.asarray(groups)
    labels = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in labels]
    out = []
    for _ in range(reps):
        pick = rng.integers(0, len(labels), size=len(labels))
        out.append(np.concatenate([members[i] for i in pick]))
    return out


def cluster_resample(rng: np.random.Generator, groups: np.ndarray, n: int) -> np.ndarray:
    """About n unit indices drawn as whole clusters with replacement (the last cluster cut to
    exactly n): a sample of n real blocks with the real data's dependence between blocks."""
    groups = np.asarray(groups)
    labels = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in labels]
    out, total = [], 0
    while total < n:
        idx = members[int(rng.integers(0, len(labels)))]
        out.append(idx)
        total += len(idx)
    return np.concatenate(out)[:n]


def conformal_p(value: float | np.ndarray, reference: np.ndarray) -> np.ndarray:
    """(1 + #{reference >= value}) / (m + 1): the conformal p-value of a block score."""
    ref = np.sort(np.asarray(reference, float))
    v = np.atleast_1d(np.asarray(value, float))
    greater_eq = len(ref) - np.searchsorted(ref, v, side="left")
    return (1.0 + greater_eq) / (len(ref) + 1.0)


def bootstrap_indices(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    """(reps, n) indices for resampling n blocks with replacement."""
    return rng.integers(0, n, size=(reps, n))


def percentile_interval(samples: np.ndarray, level: float = 0.9) -> tuple[float, float]:
    lo, hi = np.quantile(np.asarray(samples, float), [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def mmd2_rbf(x: np.ndarray, y: np.ndarray, bandwidth: float) -> float:
    """Biased MMD^2 estimate with an RBF kernel (x (n, d), y (m, d)); exact, O((n + m)^2): for
    small samples and as the reference the random-feature statistic is tested against."""

    def k(a, b):
        d2 = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T
        return np.exp(-np.maximum(d2, 0) / (2 * bandwidth**2))

    return float(k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean())


def median_bandwidth(states: np.ndarray, rng: np.random.Generator, subsample: int = 500) -> float:
    """The median heuristic: sqrt(median squared distance / 2) over a subsample of the states (N, d)."""
    sub = states[rng.choice(len(states), size=min(len(states), subsample), replace=False)]
    d2 = ((sub[:, None] - sub[None]) ** 2).sum(-1)
    return float(np.sqrt(0.5 * np.median(d2[d2 > 0]))) if (d2 > 0).any() else 1.0


def fourier_unit_sums(
    units: list[np.ndarray], bandwidth: float, rng: np.random.Generator, features: int = 1024, chunk: int = 16384
) -> np.ndarray:
    """Per unit, the sum over its states of random Fourier features of the RBF kernel (Rahimi &
    Recht 2007): phi(x) = sqrt(2 / F) cos(W x + b), W ~ N(0, I / bandwidth^2), b ~ U(0, 2 pi), so
    that phi(x) . phi(y) estimates exp(-|x - y|^2 / (2 bandwidth^2)). Returns (U, F), float64.
    Memory is bounded by `chunk` states at a time whatever the number of states."""
    d = units[0].shape[1]
    W = rng.normal(size=(d, features)) / bandwidth  # (d, F)
    b = rng.uniform(0, 2 * np.pi, size=features)  # (F,)
    lengths = np.array([len(u) for u in units])
    owner = np.repeat(np.arange(len(units)), lengths)  # (N,) unit of each state
    states = np.concatenate(units).astype(np.float64)  # (N, d)
    sums = np.zeros((len(units), features))
    for i in range(0, len(states), chunk):
        phi = np.sqrt(2.0 / features) * np.cos(states[i : i + chunk] @ W + b)  # (c, F)
        sums += _segment_sums(phi, owner[i : i + chunk], len(units))
    return sums


def _segment_sums(rows: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Sum of rows (c, F) per owner id in [0, n): (n, F), without a Python loop over owners."""
    out = np.zeros((n, rows.shape[1]))
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # owners come in runs (concatenated units)
    out[owner[starts]] += np.add.reduceat(rows, starts, axis=0)
    return out


def block_mmd_test(
    x_blocks: list[np.ndarray],
    y_blocks: list[np.ndarray],
    rng: np.random.Generator,
    permutations: int = 999,
    x_groups: np.ndarray | None = None,
    y_groups: np.ndarray | None = None,
    features: int = 1024,
) -> tuple[float, float]:
    """Two-sample MMD test whose permutations exchange whole blocks (respects autocorrelation), or
    whole episodes when the blocks' episode labels are given (blocks of one episode are dependent).

    x_blocks / y_blocks: lists of (k, d) arrays of states from each block. Returns (mmd2, p).

    The statistic is the biased MMD^2 under `features` random Fourier features of the RBF kernel
    (median-heuristic bandwidth): the squared distance between the two samples' mean feature
    vectors. Each unit (block or episode) is summarised once by its feature sum, so every
    permutation costs (units x features), not (states^2): a check of 1,000 episodes (190k states)
    permutes in well under a second, where the exact kernel needed 190k^2 kernel values per
    permutation. The permutation p-value is exact for this statistic; the features only
    approximate the kernel, which can cost power, never level.
    """
    xs, ys = np.concatenate(x_blocks), np.concatenate(y_blocks)
    bandwidth = median_bandwidth(np.concatenate([xs, ys]), rng)
    if x_groups is None or y_groups is None:
        units = list(x_blocks) + list(y_blocks)
        nx = len(x_blocks)
    else:  # exchangeable units are episodes: the blocks of each concatenated, in label order
        units = []
        for blocks, groups in ((x_blocks, x_groups), (y_blocks, y_groups)):
            by_label: dict = {}
            for blk, g in zip(blocks, np.asarray(groups).tolist()):
                by_label.setdefault(g, []).append(blk)
            units += [np.concatenate(by_label[label]) for label in sorted(by_label)]
        nx = len(np.unique(x_groups))
    sums = fourier_unit_sums(units, bandwidth, rng, features)  # (U, F)
    counts = np.array([len(u) for u in units], np.float64)  # (U,)
    in_x = np.zeros((permutations + 1, len(units)), bool)  # row 0: the observed split
    in_x[0, :nx] = True
    in_x[np.arange(1, permutations + 1)[:, None], _random_subsets(rng, permutations, len(units), nx)] = True
    a = in_x.astype(np.float64)  # (P + 1, U)
    mean_x = (a @ sums) / (a @ counts)[:, None]  # (P + 1, F)
    mean_y = ((1 - a) @ sums) / ((1 - a) @ counts)[:, None]
    stat = ((mean_x - mean_y) ** 2).sum(1)  # (P + 1,)
    observed = float(stat[0])
    count = int((stat[1:] >= observed - 1e-12).sum())
    return observed, (1 + count) / (permutations + 1)


def sign_flip_test(d: np.ndarray, rng: np.random.Generator | None = None, flips: int = 20000) -> float:
    """One-sided p-value for "the paired differences d (one per episode) have a positive mean".

    The null is a distribution of d symmetric about 0 or below it: the p-value is the share of random
    sign flips whose mean is at least the observed one (Monte Carlo, exact in expectation) for fewer
    than 30 pairs, otherwise the normal approximation of the mean (paired t statistic).
    """
    d = np.asarray(d, float)
    n = len(d)
    if n == 0 or not np.any(d):
        return 1.0
    observed = d.mean()
    if n < 30:
        rng = rng or np.random.default_rng(0)
        signs = np.where(rng.random((flips, n)) < 0.5, -1.0, 1.0)
        null = (signs * np.abs(d)).mean(1)
        return float((1 + np.sum(null >= observed - 1e-12)) / (flips + 1))
    se = d.std(ddof=1) / math.sqrt(n)
    if se <= 0:
        return 0.0 if observed > 0 else 1.0
    return float(_norm_sf(observed / se))


_LGAMMA = np.frompyfunc(math.lgamma, 1, 1)  # elementwise, to double precision (numpy has no lgamma)


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    """log C(n, k) for an array of k."""
    k = np.asarray(k, float)
    return math.lgamma(n + 1) - (_LGAMMA(k + 1.0) + _LGAMMA(n - k + 1.0)).astype(float)


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test that k1 of n1 and k2 of n2 come from one proportion: the sum of
    the hypergeometric probabilities (margins fixed) no larger than the observed table's. In log
    space (math.comb of tens of thousands of episodes took seconds a table)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    K, N = k1 + k2, n1 + n2
    lo, hi = max(0, n1 - (N - K)), min(K, n1)
    x = np.arange(lo, hi + 1)  # the tables with these margins
    log_total = math.lgamma(N + 1) - math.lgamma(n1 + 1) - math.lgamma(N - n1 + 1)  # log C(N, n1)
    log_pmf = _log_comb(K, x) + _log_comb(N - K, n1 - x) - log_total
    keep = log_pmf <= log_pmf[k1 - lo] + 1e-7  # no more probable than the observed table (float tolerance)
    return 1.0 if keep.all() else float(min(1.0, np.exp(log_pmf[keep]).sum()))
