"""Open-loop bias, two-sided: where the checked trajectories sit above or below reality, in the
channels' own units.

Every divergence score asks "is the checked data *worse* than reality?". A deterministic
engineering simulator is smoother than reality and scores *better* on all of them, while its error
is a systematic bias: too much power at low wind, too little at high wind, fuel use 20 % too high.
This module owns the test that sees it.

Cells. Per observation channel d, the signed open-loop error e = truth - predicted mean of the
imagined steps of a block (normalised units) is averaged over
  - all imagined steps (the channel's overall bias), and
  - the steps whose control k (a command or an exogenous input acting on the step) falls in bin j
    of the held-out real values' quantiles (regimes.quantile_edges): the bias in that operating
    regime. A block enters a regime cell with at least `min_steps` steps there.
Cells are (n, C) per block with C = D x (1 + sum of the bins), NaN where a block has too few steps.

Test. Episodes are the units: each cell's block values are averaged per episode, and each cell's
statistic is Welch's t of the checked episodes' mean against the real episodes' (with one checked
episode, against a new real episode's). The run's statistic is the largest |t| over all cells
(the model's own bias on real data is in the real episodes' means, so it cancels). Its null comes
from the episodes themselves: the checked and real episodes are permuted (a check of the same size
drawn from reality), so correlated cells are not over-corrected as Bonferroni would, and the
threshold holds for any number of checked episodes. Where too few distinct permutations exist to
reach the level (one checked episode against few real ones), each cell is held to its own
Bonferroni Welch critical value instead. `evidence` = statistic / threshold (>= 1: significant at
the level); a cell is significant when its |t| reaches the threshold (single-step max-t, so the
family-wise error over cells is controlled).

Paired. When every checked block replays the logged inputs of a held-out real block (a plant
simulator driven by the logged weather: check._real_twins), each block is compared with its twin:
the cell differences (checked - twin) are averaged per episode, each cell gets the one-sample t of
those episode means, and the null of the max |t| flips the signs of whole episodes (under no gap a
difference is as likely negative as positive); Bonferroni one-sample t where too few sign patterns
exist. What the checked and the real episode share (the week's wind) then cancels.

Estimates: the difference of means (checked - real) per cell in physical units with its Welch 95 %
interval, and relative to the model's predicted level of the channel in the cell (the integral of
the channel over the imagined steps, in %; not given where the level is near zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.regimes import bin_of, quantile_edges
from wmcheck.checks.stats import half_steps, t_critical

MIN_STEPS = 3  # imagined steps a block needs in a regime bin to count there
BINS = 8  # quantile bins of the held-out real values per control
PERMUTATIONS = 1999
MIN_EPISODES = 2  # episodes a cell needs on each side to be tested


@dataclass
class Cell:
    channel: int  # observation channel
    control: int | None = None  # control channel of the regime (None: all imagined steps)
    lo: float | None = None  # regime range, normalised control units
    hi: float | None = None


def regime_edges(real_controls: np.ndarray | None, bins: int = BINS) -> list[np.ndarray]:
    """Quantile edges of each control (K,) over the held-out real steps (m, H, K)."""
    if real_controls is None or real_controls.ndim != 3:
        return []
    return [quantile_edges(real_controls[..., k].ravel(), bins) for k in range(real_controls.shape[-1])]


def calibration_cells(cal) -> tuple[list[np.ndarray], np.ndarray] | None:
    """The regime edges and the held-out real blocks' cells (m, C) of a calibration
    (calibration.Calibration); None when it has no per-step errors or controls."""
    if cal.real.err_steps.ndim != 3 or cal.real_controls is None:
        return None
    edges = regime_edges(cal.real_controls)
    return edges, bias_cells(cal.real.err_steps, cal.real_controls, edges)


def cell_layout(n_obs: int, edges: list[np.ndarray]) -> list[Cell]:
    cells = [Cell(d) for d in range(n_obs)]
    for k, e in enumerate(edges):
        for j in range(len(e) - 1):
            cells += [Cell(d, k, float(e[j]), float(e[j + 1])) for d in range(n_obs)]
    return cells


def bias_cells(
    err: np.ndarray, controls: np.ndarray | None, edges: list[np.ndarray], min_steps: int = MIN_STEPS
) -> np.ndarray:
    """Mean signed open-loop error of every block in every cell: err (n, H, D), controls (n, H, K)
    -> (n, C) float32, NaN where the block has fewer than `min_steps` steps in the cell."""
    err = np.asarray(err, np.float64)
    out = [err.mean(1)]  # (n, D): all imagined steps
    for k, e in enumerate(edges):
        b = bin_of(controls[..., k], e)  # (n, H)
        for j in range(len(e) - 1):
            m = b == j  # (n, H)
            cnt = m.sum(1)  # (n,)
            s = (err * m[..., None]).sum(1)  # (n, D)
            out.append(np.where((cnt >= min_steps)[:, None], s / np.maximum(cnt, 1)[:, None], np.nan))
    return np.concatenate(out, 1).astype(np.float32)


def episode_cell_means(cells: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(n, C) block values by episode -> (E, C) episode means over the blocks that have the cell
    (NaN where an episode has none), episodes in sorted order."""
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    onehot = np.zeros((inv.max() + 1 if len(inv) else 0, len(inv)))
    onehot[inv, np.arange(len(inv))] = 1.0
    valid = np.isfinite(cells)
    sums = onehot @ np.where(valid, cells, 0.0)
    counts = onehot @ valid
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


@dataclass
class _Moments:
    """Per row (a resample or permutation) and cell: count, sum and sum of squares of episode means."""

    n: np.ndarray  # (R, C)
    s: np.ndarray
    q: np.ndarray

    @classmethod
    def of(cls, weights: np.ndarray, means: np.ndarray) -> _Moments:
        """weights (R, E) episode multiplicities, means (E, C) with NaN -> moments (R, C)."""
        v = np.isfinite(means)
        m0 = np.where(v, means, 0.0)
        return cls(weights @ v, weights @ m0, weights @ (m0**2))

    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.s / self.n

    def var(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.maximum(self.q - self.s**2 / self.n, 0.0) / (self.n - 1)


def welch(x: _Moments, y: _Moments, min_real: int = MIN_EPISODES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows-and-cells form of stats.episode_welch (the same formulas; tests/test_bias.py checks
    that they agree), for permutations and resamples at once.

    Welch's t of the checked (x) against the real (y) episode means per row and cell, its
    standard error and Welch-Satterthwaite degrees of freedom. t = 0 where a side has fewer than
    two episodes (MIN_EPISODES): a single checked episode has no spread of its own, and judging
    its cell mean against the real episodes' spread alone (a prediction interval) leaned on the
    normality of a 5-df variance estimate: a faithful one-episode Pendulum check failed on a
    Bonferroni cell at |t| 11.5 >= 11.4. No exchangeability-based test of one episode against six
    can reach the gap tests' level (p >= 1/7), and the check then says so (inconclusive) instead."""
    nx, ny = x.n, y.n
    vx, vy = x.var(), y.var()
    with np.errstate(invalid="ignore", divide="ignore"):
        a = vx / nx
        b = vy / ny
        se2 = a + b
        den = a**2 / np.maximum(nx - 1, 1) + b**2 / np.maximum(ny - 1, 1)
        df = np.where(den > 0, se2**2 / den, nx + ny - 2)
        t = (x.mean() - y.mean()) / np.sqrt(se2)
    ok = (nx >= MIN_EPISODES) & (ny >= min_real) & (se2 > 0) & np.isfinite(t)
    return np.where(ok, t, 0.0), np.where(ok, np.sqrt(se2), np.nan), np.where(ok, df, np.nan)


@dataclass
class BiasTest:
    """The omnibus open-loop bias test over cells (see the module docstring)."""

    t: np.ndarray  # (C,) Welch t per cell (positive: checked above reality)
    difference: np.ndarray  # (C,) checked - real episode means, normalised units
    se: np.ndarray  # (C,)
    df: np.ndarray  # (C,)
    threshold: np.ndarray  # (C,) |t| a cell must reach (the permutation quantile of max |t|, or Bonferroni)
    evidence: float  # max_c |t_c| / threshold_c: >= 1 significant at the level
    null: str  # "permutation" or "bonferroni"
    p_value: float | None = None  # permutation p of the max |t| (None with the Bonferroni null)
    boot: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (reps,) evidence on checked-episode resamples
    checked_episodes: int = 0
    real_episodes: int = 0
    paired: bool = False  # each checked block against its real twin (sign-flip null)

    @property
    def significant(self) -> np.ndarray:
        return np.abs(self.t) >= self.threshold

    def interval(self, level: float = 0.95) -> np.ndarray:
        """(C, 2) Welch interval of the difference (normalised units). The degrees of freedom are
        rounded down to half steps, as for the Bonferroni critical values (a slightly wider,
        conservative interval; the few distinct quantiles are computed once)."""
        q = np.array([t_critical((1 - level) / 2, d) if np.isfinite(d) and d > 0 else np.nan for d in self.df])
        return np.stack([self.difference - q * self.se, self.difference + q * self.se], 1)


def _distinct_splits(n_x: int, n_y: int) -> float:
    return float(math.comb(n_x + n_y, n_x))


def bias_test(
    checked_cells: np.ndarray,
    checked_groups: np.ndarray,
    real_cells: np.ndarray,
    real_groups: np.ndarray,
    level: float,
    rng: np.random.Generator,
    boot_idx=None,
    permutations: int = PERMUTATIONS,
) -> BiasTest:
    """The test of the module docstring on block cells (n, C) / (m, C) with their episodes.
    `boot_idx`: checked-block index resamples (stats.cluster_bootstrap) for the evidence's bootstrap
    (the replicates the other gap tests use, so the top gap compares like with like)."""
    mx = episode_cell_means(checked_cells, checked_groups)  # (Ex, C)
    my = episode_cell_means(real_cells, real_groups)  # (Ey, C)
    ex, ey = len(mx), len(my)
    ones_x, ones_y = np.ones((1, ex)), np.ones((1, ey))
    obs_x, obs_y = _Moments.of(ones_x, mx), _Moments.of(ones_y, my)
    t, se, df = (a[0] for a in welch(obs_x, obs_y))
    diff = (obs_x.mean() - obs_y.mean())[0]  # (C,) NaN where a side has no episode in the cell
    null_max = None
    if ex and ey and _distinct_splits(ex, ey) >= 2.0 / level and permutations > 0:
        pooled = np.concatenate([mx, my])  # (E, C)
        perm = rng.permuted(np.tile(np.arange(ex + ey), (permutations, 1)), axis=1)  # (P, E)
        wx = np.zeros((permutations, ex + ey))
        np.put_along_axis(wx, perm[:, :ex], 1.0, 1)
        tp, _, _ = welch(_Moments.of(wx, pooled), _Moments.of(1.0 - wx, pooled))
        null_max = np.abs(tp).max(1)  # (P,)
    boot_t = None
    if boot_idx:
        boot_t = welch(_Moments.of(_boot_weights(checked_groups, boot_idx), mx), _Moments.of(ones_y, my))[0]
    return _result(t, diff, se, df, level, null_max, "permutation", boot_t, ex, ey, False)


def _result(t, diff, se, df, level, null_max, null_name, boot_t, ex, ey, paired) -> BiasTest:
    """The max-|t| decision: the null's threshold (or Bonferroni without one), evidence, bootstrap."""
    C = len(t)
    if null_max is not None:
        stat = float(np.max(np.abs(t))) if C else 0.0
        threshold = np.full(C, _max_t_threshold(null_max, level))
        p_value, null = float((1 + np.sum(null_max >= stat)) / (len(null_max) + 1)), null_name
    else:
        threshold, p_value, null = _bonferroni(df, level), None, "bonferroni"
    evidence = float(_ratio(t, threshold).max()) if C else 0.0
    boot = np.zeros(0) if boot_t is None else _ratio(boot_t, threshold).max(1)
    return BiasTest(t, diff, se, df, threshold, evidence, null, p_value, boot, ex, ey, paired)


def one_sample(m: _Moments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-sample t of episode means against 0 per row and cell, its standard error and n - 1 df;
    t = 0 where fewer than 2 episodes have the cell."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(m.var() / m.n)
        t = m.mean() / se
    ok = (m.n >= 2) & (se > 0) & np.isfinite(t)
    return np.where(ok, t, 0.0), np.where(ok, se, np.nan), np.where(ok, m.n - 1, np.nan)


def _max_t_threshold(null_max: np.ndarray, level: float) -> float:
    """The |t| the observed max must reach: fire iff p = (1 + #{null >= stat}) / (P + 1) <= level,
    i.e. at most k - 1 null values reach the statistic (the k-th largest null value but one)."""
    null_max = np.sort(null_max)
    P = len(null_max)
    k = int(math.floor(level * (P + 1)))
    return max(float(null_max[P - k + 1]), 1e-12) if 2 <= k <= P else float("inf")


def _bonferroni(df: np.ndarray, level: float) -> np.ndarray:
    """Each cell's two-sided Bonferroni critical |t| at `level` over the cells. The degrees of freedom
    are rounded down to half steps (a slightly larger, i.e. conservative, critical value), so that the
    few distinct values are computed once: a bisection per cell and call made the power table of a
    many-channel system take minutes."""
    df = np.asarray(df, float)
    out = np.full(len(df), np.inf)
    ok = np.isfinite(df) & (df > 0)
    keys = half_steps(df[ok])
    p = level / (2 * max(len(df), 1))
    crit = {int(k): t_critical(p, k / 2.0) for k in np.unique(keys)}
    out[ok] = [crit[int(k)] for k in keys]
    return out


def _boot_weights(groups: np.ndarray, boot_idx) -> np.ndarray:
    """(R, E) how many times each episode (sorted order) is drawn in each block resample."""
    labels, inv = np.unique(np.asarray(groups), return_inverse=True)
    sizes = np.bincount(inv, minlength=len(labels))
    return np.stack([np.bincount(inv[idx], minlength=len(labels)) / sizes for idx in boot_idx])


def _ratio(t: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(threshold), np.abs(t) / threshold, 0.0)


def paired_bias_test(
    diff_cells: np.ndarray,
    groups: np.ndarray,
    level: float,
    rng: np.random.Generator,
    boot_idx=None,
    permutations: int = PERMUTATIONS,
) -> BiasTest:
    """The paired test of the module docstring on (n, C) cell differences checked - twin."""
    m = episode_cell_means(diff_cells, groups)  # (E, C)
    E, C = m.shape
    t, se, df = (a[0] for a in one_sample(_Moments.of(np.ones((1, E)), m)))
    diff = _Moments.of(np.ones((1, E)), m).mean()[0]
    null_max = None
    if E and 2.0**E >= 2.0 / level and permutations > 0:
        signs = rng.choice([-1.0, 1.0], size=(permutations, E))
        v = np.isfinite(m)
        m0 = np.where(v, m, 0.0)
        flipped = _Moments(np.ones((permutations, E)) @ v, signs @ m0, np.ones((permutations, E)) @ (m0**2))
        null_max = np.abs(one_sample(flipped)[0]).max(1)
    boot_t = one_sample(_Moments.of(_boot_weights(groups, boot_idx), m))[0] if boot_idx else None
    return _result(t, diff, se, df, level, null_max, "sign-flip", boot_t, E, E, True)


def predicted_level(pred_mean: np.ndarray, controls: np.ndarray | None, edges: list[np.ndarray]) -> np.ndarray:
    """(C,) the model's mean predicted value of each cell's channel over the checked blocks' steps in
    the cell (normalised units; the denominator of the relative bias)."""
    per_block = bias_cells(pred_mean, controls, edges, min_steps=1).astype(np.float64)  # (n, C)
    valid = np.isfinite(per_block)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid, per_block, 0.0).sum(0) / valid.sum(0)
