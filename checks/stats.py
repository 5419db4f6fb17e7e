"""Statistics for the checks, with trajectory blocks (not steps) as the independent units.

Owns: the one-sided Mann-Whitney U test (checked blocks vs held-out real blocks), its effect size
(the probability that a checked block scores higher than a real one, 0.5 = indistinguishable),
conformal p-values of single blocks, and the block bootstrap used for confidence intervals and
for the null distribution of search-based statistics. Steps inside a trajectory are
autocorrelated, so nothing here treats steps as i.i.d.: every sample unit is a block of
consecutive steps (calibration and checks cut the same blocks).
"""
from __future__ import annotations

import math

import numpy as np


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def rank_auc(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) for samples x (checked) and y (real)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    ranks = _ranks(np.concatenate([x, y]))
    u = ranks[: len(x)].sum() - len(x) * (len(x) + 1) / 2.0
    return float(u / (len(x) * len(y)))


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    sv = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def mann_whitney_z(x: np.ndarray, y: np.ndarray) -> float:
    """Normal-approximation z of the one-sided Mann-Whitney statistic (x larger than y), with the
    tie correction; cheap enough for bootstrap replicates."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    pooled = np.concatenate([x, y])
    ranks = _ranks(pooled)
    u = ranks[:n].sum() - n * (n + 1) / 2.0
    _, counts = np.unique(pooled, return_counts=True)
    tie = (counts**3 - counts).sum()
    var = n * m / 12.0 * ((n + m + 1) - tie / ((n + m) * (n + m - 1)))
    return float((u - n * m / 2.0) / math.sqrt(var)) if var > 0 else 0.0


def mann_whitney_greater(x: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None,
                         permutations: int = 20000) -> float:
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
        pooled = np.concatenate([x, y])
        ranks = _ranks(pooled)
        observed = ranks[:n].sum()
        perm = np.argsort(rng.random((permutations, n + m)), axis=1)[:, :n]
        sums = ranks[perm].sum(1)
        return float((1 + np.sum(sums >= observed - 1e-9)) / (permutations + 1))
    ranks = _ranks(np.concatenate([x, y]))
    u = ranks[:n].sum() - n * (n + 1) / 2.0
    mu = n * m / 2.0
    _, counts = np.unique(np.concatenate([x, y]), return_counts=True)
    tie = (counts**3 - counts).sum()
    var = n * m / 12.0 * ((n + m + 1) - tie / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    z = (u - mu - 0.5) / math.sqrt(var)
    return float(_norm_sf(z))


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
    """Biased MMD^2 estimate with an RBF kernel (x (n, d), y (m, d))."""
    def k(a, b):
        d2 = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T
        return np.exp(-np.maximum(d2, 0) / (2 * bandwidth**2))
    return float(k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean())


def block_mmd_test(x_blocks: list[np.ndarray], y_blocks: list[np.ndarray], rng: np.random.Generator,
                   permutations: int = 200) -> tuple[float, float]:
    """Two-sample MMD test whose permutations exchange whole blocks (respects autocorrelation).

    x_blocks / y_blocks: lists of (k, d) arrays of states from each block. Returns (mmd2, p).
    """
    xs, ys = np.concatenate(x_blocks), np.concatenate(y_blocks)
    pooled = np.concatenate([xs, ys])
    sub = pooled[rng.choice(len(pooled), size=min(len(pooled), 500), replace=False)]
    d2 = ((sub[:, None] - sub[None]) ** 2).sum(-1)
    bandwidth = float(np.sqrt(0.5 * np.median(d2[d2 > 0]))) if (d2 > 0).any() else 1.0
    observed = mmd2_rbf(xs, ys, bandwidth)
    blocks = list(x_blocks) + list(y_blocks)
    nx = len(x_blocks)
    count = 0
    for _ in range(permutations):
        perm = rng.permutation(len(blocks))
        a = np.concatenate([blocks[i] for i in perm[:nx]])
        b = np.concatenate([blocks[i] for i in perm[nx:]])
        count += mmd2_rbf(a, b, bandwidth) >= observed - 1e-12
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
