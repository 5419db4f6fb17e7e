"""Open-loop bias, two-sided: where the checked trajectories sit above or below reality, in the
channels' own units.

Every divergence score asks "is the checked data *worse* than reality?". A deterministic
engineering simulator is smoother than reality and scores *better* on all of them, while its error
is a systematic bias: too much power at low wind, too little at high wind, fuel use 20 % too high.
This module owns the test that sees it.

Cells, in three families. Per observation channel d, with e = truth - predicted mean of the
imagined steps of a block (normalised units):
  - overall: e averaged over all imagined steps (the channel's bias);
  - response: the least-squares slope of e on the predicted value over an episode's imagined
    steps. A more damped or more sluggish simulator moves less than the model predicts from
    reality wherever it is, so its errors point against the prediction (slope < 0) while their
    mean is zero; a livelier one gives slope > 0. Needs the predicted means (CellLayout.response);
  - regime: e averaged over the steps whose control k (a command or an exogenous input acting on
    the step) falls in bin j of the held-out real values' quantiles (regimes.quantile_edges): the
    bias in that operating regime. A block enters a regime cell with at least `min_steps` steps there.
Blocks store columns (CellLayout.block_columns: the overall and regime means, and for the
response the means of e, p, e p and p^2 from which each episode's slope is computed), NaN where a
block has too few steps in a regime.

Test. Episodes are the units: each cell's value is taken per episode, and each cell's statistic is
Welch's t of the checked episodes' values against the real episodes' (with one checked episode,
against a new real episode's). The model's own bias on real data is in the real episodes' values,
so it cancels. The null comes from the episodes themselves: the checked and real episodes are
permuted (a check of the same size drawn from reality), so correlated cells are not
over-corrected as Bonferroni would, and the threshold holds for any number of checked episodes.
The families are combined by single-step min-p (`min_p_thresholds`): each family's max |t| is
ranked against the same family's maxima over the permutations, and the best rank decides, so the
17 response cells of a 17-channel system are not drowned by its 800 regime cells. Where too few
distinct permutations exist to reach the level (one checked episode against few real ones), each
cell is held to its own Bonferroni Welch critical value instead. `evidence` = max over cells of
|t| / its family's threshold (>= 1: significant at the level); a cell is significant when its |t|
reaches that threshold (the family-wise error over all cells is controlled).

Paired. When every checked block replays the logged inputs of a held-out real block (a plant
simulator driven by the logged weather: check._real_twins), each block is compared with its twin:
the cell differences (checked - twin) are averaged per episode, each cell gets the one-sample t of
those episode means, and the null of the max |t| flips the signs of whole episodes (under no gap a
difference is as likely negative as positive); Bonferroni one-sample t where too few sign patterns
exist. What the checked and the real episode share (the week's wind) then cancels.

Estimates: the difference (checked - real) per cell with its Welch 95 % interval: for overall and
regime cells in physical units, and relative to the model's predicted level of the channel in the
cell (the integral of the channel over the imagined steps, in %; not given where the level is near
zero); for response cells the difference of slopes (-0.2: the checked system follows the model's
predicted swings 0.8x as far as reality does).
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
    kind: str = "overall"  # overall / response / regime (the families of the test)


FAMILIES = ("overall", "response", "regime")
RESPONSE_SUMS = 4  # block columns per channel of a response cell: mean e, p, e p and p^2


@dataclass
class CellLayout:
    """The cells of one bias test: D observation channels, the regime edges of the controls, and
    whether the response cells are in (they need the model's predicted means).

    Block columns (`block_columns`, what is stored per block and subset by the power table):
    [overall D | response sums 4D | regime cells]. Tested cells (`episode_values`, `cells`):
    [overall D | response slopes D | regime cells], each episode's response slope computed from the
    means of its blocks' sums (all blocks have the same number of imagined steps)."""

    n_obs: int
    edges: list
    response: bool = False

    def cells(self) -> list[Cell]:
        D = self.n_obs
        out = [Cell(d) for d in range(D)]
        if self.response:
            out += [Cell(d, kind="response") for d in range(D)]
        for k, e in enumerate(self.edges):
            for j in range(len(e) - 1):
                out += [Cell(d, k, float(e[j]), float(e[j + 1]), "regime") for d in range(D)]
        return out

    def families(self) -> np.ndarray:
        """(C,) each tested cell's family (an index into FAMILIES)."""
        return np.array([FAMILIES.index(c.kind) for c in self.cells()], int)

    def block_columns(
        self, err: np.ndarray, controls: np.ndarray | None, pred: np.ndarray | None = None, min_steps: int = MIN_STEPS
    ) -> np.ndarray:
        """err, pred (n, H, D), controls (n, H, K) -> (n, Cb) float32 block columns."""
        cells = bias_cells(err, controls, self.edges, min_steps)  # (n, D + regimes)
        if not self.response:
            return cells
        if pred is None or np.shape(pred) != np.shape(err):
            raise ValueError("the response cells need the predicted means (n, H, D) of the same blocks")
        D = self.n_obs
        return np.concatenate([cells[:, :D], response_sums(err, pred), cells[:, D:]], 1)

    def episode_values(self, columns: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """(n, Cb) block columns -> (E, C) the tested cells per episode (sorted episode order)."""
        means = episode_cell_means(columns, groups)  # (E, Cb)
        if not self.response:
            return means
        D = self.n_obs
        s = means[:, D : D + RESPONSE_SUMS * D]
        return np.concatenate([means[:, :D], response_slopes(s, D), means[:, D + RESPONSE_SUMS * D :]], 1)

    def levels(self, pred: np.ndarray, controls: np.ndarray | None) -> np.ndarray:
        """(C,) the model's mean predicted value of each cell's channel over the blocks' steps in the
        cell (normalised units; the denominator of the relative bias); NaN for response cells."""
        level = predicted_level(pred, controls, self.edges)  # (D + regimes,)
        if not self.response:
            return level
        D = self.n_obs
        return np.concatenate([level[:D], np.full(D, np.nan), level[D:]])


def response_sums(err: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Per block and channel the means over the imagined steps of e, p, e p and p^2 (e = truth -
    predicted mean p, normalised units): err, pred (n, H, D) -> (n, 4D)."""
    e, p = np.asarray(err, np.float64), np.asarray(pred, np.float64)
    return np.concatenate([e.mean(1), p.mean(1), (e * p).mean(1), (p * p).mean(1)], 1).astype(np.float32)


def response_slopes(sums: np.ndarray, n_obs: int) -> np.ndarray:
    """(E, 4D) episode means of response_sums -> (E, D) each episode's least-squares slope of the
    open-loop error on the predicted value, per channel: 0 when the truth moves as the prediction
    does, < 0 when it moves less (a more damped, more sluggish system), > 0 when more. NaN where
    the prediction does not vary over the episode."""
    D = n_obs
    me, mp, mep, mpp = (sums[:, i * D : (i + 1) * D].astype(np.float64) for i in range(RESPONSE_SUMS))
    var = mpp - mp**2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(var > 1e-8 * np.maximum(mpp, 1e-12), (mep - me * mp) / var, np.nan)


def regime_edges(real_controls: np.ndarray | None, bins: int = BINS) -> list[np.ndarray]:
    """Quantile edges of each control (K,) over the held-out real steps (m, H, K)."""
    if real_controls is None or real_controls.ndim != 3:
        return []
    return [quantile_edges(real_controls[..., k].ravel(), bins) for k in range(real_controls.shape[-1])]


def calibration_cells(cal) -> tuple[CellLayout, np.ndarray] | None:
    """The cell layout and the held-out real blocks' block columns (m, Cb) of a calibration
    (calibration.Calibration); None when it has no per-step errors or controls. The response cells
    are in when the calibration kept the real blocks' predicted means (calibration format 10 on)."""
    real = cal.real
    if real.err_steps.ndim != 3 or cal.real_controls is None:
        return None
    pred = real.pred_mean if np.shape(real.pred_mean) == np.shape(real.err_steps) else None
    layout = CellLayout(real.err_steps.shape[-1], regime_edges(cal.real_controls), pred is not None)
    return layout, layout.block_columns(real.err_steps, cal.real_controls, pred)


def cell_layout(n_obs: int, edges: list[np.ndarray]) -> list[Cell]:
    """The overall and regime cells (CellLayout without response cells)."""
    return CellLayout(n_obs, edges).cells()


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
    with np.errstate(invalid="ignore", divide="ignore"):
        a = _mean_var(x)
        b = _mean_var(y)
        se2 = a + b
        den = a**2 / np.maximum(nx - 1, 1) + b**2 / np.maximum(ny - 1, 1)
        df = np.where(den > 0, se2**2 / den, nx + ny - 2)
        t = (x.mean() - y.mean()) / np.sqrt(se2)
    ok = (nx >= MIN_EPISODES) & (ny >= min_real) & (se2 > 0) & np.isfinite(t)
    return np.where(ok, t, 0.0), np.where(ok, np.sqrt(se2), np.nan), np.where(ok, df, np.nan)


def welch_t(x: _Moments, y: _Moments, min_real: int = MIN_EPISODES) -> np.ndarray:
    """`welch`'s t alone, with fewer temporaries: what the permutation and bootstrap rows need, on
    (rows, cells) arrays where every temporary costs (the power table runs thousands of them).
    It shares `welch`'s arithmetic (`_mean_var`, the same order), so the values are equal to the
    last bit: the permutation null's ranks count exact ties (a split and its complement give t and
    -t), and a different rounding would break them. Either side may be one row (1, C) broadcast
    against the other's rows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se2 = _mean_var(x) + _mean_var(y)
        t = x.mean() - y.mean()
        t /= np.sqrt(se2)
    ok = (x.n >= MIN_EPISODES) & (y.n >= min_real) & (se2 > 0) & np.isfinite(t)
    return np.where(ok, t, 0.0)


def _mean_var(m: _Moments) -> np.ndarray:
    """The variance of the episode means' mean, var / n, in place on one new array (errors of
    0 / 0 are the caller's to silence): Welch's t's one place for it."""
    v = m.s**2
    v /= m.n
    np.subtract(m.q, v, out=v)
    np.maximum(v, 0.0, out=v)
    v /= m.n - 1
    v /= m.n
    return v


def pooled_se(x: _Moments, y: _Moments) -> tuple[np.ndarray, np.ndarray]:
    """(se, df) of Student's pooled t of the episode means per row and cell: the test's form under
    the null that the checked episodes are real ones (stats.episode_t says why not Welch's at
    Bonferroni levels). NaN where a side has fewer than two episodes."""
    nx, ny = x.n, y.n
    with np.errstate(invalid="ignore", divide="ignore"):
        sp2 = ((nx - 1) * x.var() + (ny - 1) * y.var()) / (nx + ny - 2)
        se = np.sqrt(sp2 * (1.0 / nx + 1.0 / ny))
    ok = (nx >= MIN_EPISODES) & (ny >= MIN_EPISODES) & (se > 0)
    return np.where(ok, se, np.nan), np.where(ok, nx + ny - 2, np.nan)


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
    layout: CellLayout | None = None,
) -> BiasTest:
    """The test of the module docstring on block columns (n, Cb) / (m, Cb) with their episodes
    (`layout` says what they are; without one every column is a cell of one family).
    `boot_idx`: checked-block index resamples (stats.cluster_bootstrap) for the evidence's bootstrap
    (the replicates the other gap tests use, so the top gap compares like with like)."""
    values = episode_cell_means if layout is None else layout.episode_values
    mx = values(checked_cells, checked_groups)  # (Ex, C)
    my = values(real_cells, real_groups)  # (Ey, C)
    families = None if layout is None else layout.families()
    ex, ey = len(mx), len(my)
    ones_x, ones_y = np.ones((1, ex)), np.ones((1, ey))
    obs_x, obs_y = _Moments.of(ones_x, mx), _Moments.of(ones_y, my)
    t, se, df = (a[0] for a in welch(obs_x, obs_y))
    diff = (obs_x.mean() - obs_y.mean())[0]  # (C,) NaN where a side has no episode in the cell
    null = None
    if ex and ey and _distinct_splits(ex, ey) >= 2.0 / level and permutations > 0:
        pooled = np.concatenate([mx, my])  # (E, C)
        perm = rng.permuted(np.tile(np.arange(ex + ey), (permutations, 1)), axis=1)  # (P, E)
        wx = np.zeros((permutations, ex + ey))
        np.put_along_axis(wx, perm[:, :ex], 1.0, 1)
        null = np.abs(welch_t(_Moments.of(wx, pooled), _Moments.of(1.0 - wx, pooled)))  # (P, C)
    boot_t = None
    if boot_idx:
        boot_t = welch_t(_Moments.of(_boot_weights(checked_groups, boot_idx), mx), _Moments.of(ones_y, my))
    pooled = None if null is not None else tuple(a[0] for a in pooled_se(obs_x, obs_y))
    return _result(t, diff, se, df, level, null, "permutation", boot_t, ex, ey, False, families, pooled)


def _result(t, diff, se, df, level, null, null_name, boot_t, ex, ey, paired, families=None, pooled=None) -> BiasTest:
    """The min-p decision over the cells' families (one family: the max-|t| decision), the
    Bonferroni thresholds without a resampled null, evidence, bootstrap. `pooled` (se, df) per
    cell: the Bonferroni test is the pooled t's, expressed as a threshold on the Welch |t| (t and
    its interval stay Welch's): |t| >= crit(df_pooled) x se_pooled / se fires exactly when the
    pooled t reaches its critical value. With 2 checked against 6 real episodes, Welch's own
    critical values rejected normal data at 3.7x the level at 5e-4 (docs/benchmarks.md)."""
    C = len(t)
    families = np.zeros(C, int) if families is None else np.asarray(families, int)
    if null is not None:
        threshold, p_value = min_p_thresholds(np.abs(t), null, families, level)
    elif pooled is not None:
        se_p, df_p = pooled
        with np.errstate(invalid="ignore", divide="ignore"):
            threshold = np.where(np.isfinite(se_p) & (se > 0), _bonferroni(df_p, level) * se_p / se, np.inf)
        p_value, null_name = None, "bonferroni"
    else:
        threshold, p_value, null_name = _bonferroni(df, level), None, "bonferroni"
    evidence = float(_ratio(t, threshold).max()) if C else 0.0
    boot = np.zeros(0) if boot_t is None else _ratio(boot_t, threshold).max(1)
    return BiasTest(t, diff, se, df, threshold, evidence, null_name, p_value, boot, ex, ey, paired)


def min_p_thresholds(
    stat: np.ndarray, null: np.ndarray, families: np.ndarray, level: float
) -> tuple[np.ndarray, float]:
    """Thresholds (C,) of |t| and the permutation p of the observed cells, from null |t| (P, C).

    Single-step min-p over families (Westfall and Young): each family's statistic is its max |t|,
    turned into a rank among the null rows' maxima of that family; the run's statistic is the best
    rank over families, and its null is the same best rank of every null row. So a family of 17
    cells is not drowned by one of 800 (as in one max over all cells) and no Bonferroni split is
    paid for correlated families. A cell fires when its |t| reaches its family's threshold: the
    value whose rank is the critical one. With one family this is the max-|t| test: fire iff at
    most k - 1 null maxima reach the statistic, k = floor(level (P + 1))."""
    labels = np.unique(families)
    P = null.shape[0]
    M = np.stack([null[:, families == f].max(1) for f in labels], 1)  # (P, F) each family's max
    srt = np.sort(M, 0)  # ascending per family
    # rank from the top of each null row in its family: #{rows whose max >= this row's}
    rank = np.stack([P - np.searchsorted(srt[:, i], M[:, i], "left") for i in range(len(labels))], 1)
    best = np.sort(rank.min(1))  # (P,) the null's best rank, ascending
    obs = [stat[families == f].max() if np.any(families == f) else 0.0 for f in labels]
    obs_rank = min(int(P - np.searchsorted(srt[:, i], obs[i], "left")) for i in range(len(labels)))
    p_value = float((1 + np.sum(best <= obs_rank)) / (P + 1))
    k = int(math.floor(level * (P + 1)))
    thr = np.full(len(labels), np.inf)
    if 2 <= k <= P:
        r_star = int(best[k - 1]) - 1  # the largest rank that at most k - 1 null rows reach
        if r_star >= 1:  # a family's statistic must reach its r_star-th largest null maximum
            thr = np.maximum(srt[P - r_star], 1e-12)
    out = np.empty(len(families))
    for i, f in enumerate(labels):
        out[families == f] = thr[i]
    return out, p_value


def one_sample(m: _Moments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-sample t of episode means against 0 per row and cell, its standard error and n - 1 df;
    t = 0 where fewer than 2 episodes have the cell."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(m.var() / m.n)
        t = m.mean() / se
    ok = (m.n >= 2) & (se > 0) & np.isfinite(t)
    return np.where(ok, t, 0.0), np.where(ok, se, np.nan), np.where(ok, m.n - 1, np.nan)


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
    checked_cells: np.ndarray,
    twin_cells: np.ndarray,
    groups: np.ndarray,
    level: float,
    rng: np.random.Generator,
    boot_idx=None,
    permutations: int = PERMUTATIONS,
    layout: CellLayout | None = None,
) -> BiasTest:
    """The paired test of the module docstring: block columns (n, Cb) of the checked blocks and of
    each one's real twin; a column is compared where both blocks have it."""
    both = np.isfinite(checked_cells) & np.isfinite(twin_cells)
    values = episode_cell_means if layout is None else layout.episode_values
    m = values(np.where(both, checked_cells, np.nan), groups) - values(np.where(both, twin_cells, np.nan), groups)
    E, C = m.shape
    t, se, df = (a[0] for a in one_sample(_Moments.of(np.ones((1, E)), m)))
    diff = _Moments.of(np.ones((1, E)), m).mean()[0]
    null = None
    if E and 2.0**E >= 2.0 / level and permutations > 0:
        signs = rng.choice([-1.0, 1.0], size=(permutations, E))
        v = np.isfinite(m)
        m0 = np.where(v, m, 0.0)
        flipped = _Moments(np.ones((permutations, E)) @ v, signs @ m0, np.ones((permutations, E)) @ (m0**2))
        null = np.abs(one_sample(flipped)[0])  # (P, C)
    boot_t = one_sample(_Moments.of(_boot_weights(groups, boot_idx), m))[0] if boot_idx else None
    families = None if layout is None else layout.families()
    return _result(t, diff, se, df, level, null, "sign-flip", boot_t, E, E, True, families)


def predicted_level(pred_mean: np.ndarray, controls: np.ndarray | None, edges: list[np.ndarray]) -> np.ndarray:
    """(C,) the model's mean predicted value of each cell's channel over the checked blocks' steps in
    the cell (normalised units; the denominator of the relative bias)."""
    per_block = bias_cells(pred_mean, controls, edges, min_steps=1).astype(np.float64)  # (n, C)
    valid = np.isfinite(per_block)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid, per_block, 0.0).sum(0) / valid.sum(0)
