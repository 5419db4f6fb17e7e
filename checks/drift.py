"""Drift statistics for `wmcheck monitor`: has reality moved away from what the model learned?

Owns the per-episode features a monitored episode is summarised by, the test of a window of new
episodes against the calibration's held-out real episodes, and the false-alarm budget over
repeated looks. Pure numpy; `monitor.py` feeds it block scores and keeps the state.

Features (one value per episode, from its blocks' scores; `EpisodeFeatures`):
  divergence       mean log open-loop divergence (share outside the 90 % band) one-sided: larger = drift
  nll              mean one-step predictive NLL                          one-sided
  bias:<ch>        mean signed open-loop error (truth - predicted mean)  two-sided, normalised units
  dispersion:<ch>  log variance of the standardised open-loop error      two-sided (noisier or smoother)
  support          share of steps whose latent state is farther from the training latents than
                   99 % of held-out real steps                           one-sided: the model's competence

The window test (`window_test`): under "no drift" the new episodes and the calibration episodes
are exchangeable, so a permutation test over the union is exact whatever the features'
distributions. The statistic is the largest standardised difference of mean ranks over all
features (ranks within the union, which no permutation changes: a Wilcoxon-type statistic per
feature), so correlated features are not over-corrected and no heavy tail dominates; each feature's own p-value is the single-step max-t adjustment
(Westfall-Young): a feature is flagged when its statistic alone beats the permutation law of the
maximum. All subsets are enumerated when there are few, otherwise `draws` random ones.

The budget (`LookPlan`): alpha is spent over `looks` planned looks and the windows tested at each
(Bonferroni), so P(any false alarm within `looks` looks) <= alpha, however the looks depend on each
other (they share the calibration set and overlapping windows). After `looks` looks the budget
starts again: at most alpha per cycle. A window whose smallest attainable p-value is above the
look's level cannot fire and says so (too few episodes to test at that level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from wmcheck.checks.stats import t_critical

KINDS = ("divergence", "nll", "bias", "dispersion", "support")
MAX_EXACT = 200_000  # enumerate every subset up to this many; beyond, random draws
MAX_DRAWS = 200_000


@dataclass
class EpisodeFeatures:
    """Per-episode drift features: values (n_episodes, F); names / kinds / channel / two_sided (F,)."""

    ids: np.ndarray  # (n,) episode ids, in the order of `values`
    values: np.ndarray  # (n, F)
    names: list[str]
    kinds: list[str]
    channel: list[int | None]  # observation channel of a bias / dispersion feature
    two_sided: np.ndarray  # (F,) bool


def feature_layout(obs_names: list[str]) -> tuple[list[str], list[str], list[int | None], np.ndarray]:
    names, kinds, channel, two = ["divergence", "nll"], ["divergence", "nll"], [None, None], [False, False]
    for kind in ("bias", "dispersion"):
        for d, n in enumerate(obs_names):
            names.append(f"{kind}:{n}")
            kinds.append(kind)
            channel.append(d)
            two.append(True)
    names.append("support")
    kinds.append("support")
    channel.append(None)
    two.append(False)
    return names, kinds, channel, np.array(two)


def episode_features(sc, groups: np.ndarray, support_q, obs_names: list[str]) -> EpisodeFeatures:
    """The features of every episode in `groups` ((n_blocks,) episode id per block of `sc`, a
    `scoring.BlockScores`); `support_q` is the held-out real steps' 99 % support distance, one
    value or (n_blocks,) one per block (the reference's own, left out: Calibration.left_out_support_bounds)."""
    names, kinds, channel, two = feature_layout(obs_names)
    ids = np.unique(groups)
    bound = np.broadcast_to(np.asarray(support_q, np.float64), (len(groups),))  # (n_blocks,)
    rows = []
    for e in ids:
        b = groups == e
        z = sc.z_steps[b].reshape(-1, sc.z_steps.shape[-1])  # (blocks * H, D)
        err = sc.err_steps[b].reshape(-1, sc.err_steps.shape[-1])
        rows.append(
            np.concatenate(
                [
                    [np.log(np.maximum(sc.divergence[b], 1e-12)).mean(), sc.nll[b].mean()],
                    err.mean(0),
                    np.log(np.maximum(z.var(0), 1e-12)),
                    [(sc.support_steps[b] > bound[b, None]).mean()],
                ]
            )
        )
    return EpisodeFeatures(ids, np.array(rows, float).reshape(len(ids), len(names)), names, kinds, channel, two)


@dataclass
class WindowTest:
    """One window of new episodes against the reference episodes."""

    n_new: int
    n_ref: int
    statistic: np.ndarray  # (F,) standardised differences (|.| for two-sided features)
    p_value: float  # of the maximum over features
    feature_p: np.ndarray  # (F,) max-t adjusted p-value of each feature
    min_p: float  # the smallest p-value this test can give, even for a perfect separation on one feature
    subsets: str  # "exact (C subsets)" or "random (B draws)"
    diff: np.ndarray  # (F,) mean(new) - mean(ref) in feature units
    ci: np.ndarray  # (F, 2) 95 % Welch interval of diff (episodes as units)


def _standardised_stats(mask: np.ndarray, xs: np.ndarray, n: int, two_sided: np.ndarray) -> np.ndarray:
    """(S, F) statistics of S candidate "new" subsets (mask (S, N) 0/1) of the standardised union xs (N, F)."""
    N = xs.shape[0]
    m = N - n
    sums = mask @ xs  # (S, F)
    total = xs.sum(0)  # (F,)
    t = (sums / n - (total - sums) / m) / math.sqrt(1.0 / n + 1.0 / m)
    return np.where(two_sided, np.abs(t), t)


def _null_max(xs: np.ndarray, n: int, two_sided: np.ndarray, draws: int, rng, chunk: int = 8192):
    """(S,) the maximum statistic of candidate "new" subsets of size n of the union xs (N, F): all
    subsets when there are at most MAX_EXACT (exact test, the observed one among them), else
    `draws` random ones; built `chunk` masks (chunk, N) at a time. Returns (null_max, exact)."""
    N = xs.shape[0]
    exact = math.comb(N, n) <= MAX_EXACT
    out = []
    if exact:
        combos = combinations(range(N), n)
        while True:
            block = np.fromiter((i for c in _take(combos, chunk) for i in c), dtype=np.int64).reshape(-1, n)
            if not len(block):
                break
            out.append(_masked_max(block, xs, n, two_sided))
    else:
        for s in range(0, draws, chunk):
            block = rng.random((min(chunk, draws - s), N)).argsort(1)[:, :n]
            out.append(_masked_max(block, xs, n, two_sided))
    return np.concatenate(out), exact


def _take(it, k: int):
    for _ in range(k):
        try:
            yield next(it)
        except StopIteration:
            return


def _masked_max(members: np.ndarray, xs: np.ndarray, n: int, two_sided: np.ndarray) -> np.ndarray:
    mask = np.zeros((len(members), xs.shape[0]))
    np.put_along_axis(mask, members, 1.0, axis=1)
    return _standardised_stats(mask, xs, n, two_sided).max(1)


def _standardised_ranks(union: np.ndarray) -> np.ndarray:
    """(N, F) mid-ranks of each column, centred and scaled to unit variance (a constant column is 0).
    Ranks make every feature's null the same and bound each episode's weight, so one heavy-tailed
    feature (a share of steps that is mostly 0) does not inflate the maximum's null."""
    order = union.argsort(0, kind="stable")
    ranks = np.empty_like(union)
    N = union.shape[0]
    for f in range(union.shape[1]):
        col = union[order[:, f], f]
        r = np.arange(1, N + 1, dtype=float)
        _, start, counts = np.unique(col, return_index=True, return_counts=True)
        for s0, c in zip(start, counts):  # ties share their mean rank
            if c > 1:
                r[s0 : s0 + c] = r[s0 : s0 + c].mean()
        ranks[order[:, f], f] = r
    sd = ranks.std(0)
    return np.where(sd > 0, (ranks - ranks.mean(0)) / np.where(sd > 0, sd, 1.0), 0.0)


def window_test(
    new: np.ndarray, ref: np.ndarray, two_sided: np.ndarray, rng: np.random.Generator, draws: int = 20_000
) -> WindowTest:
    """Permutation max-t test of `new` (n, F) episodes against `ref` (m, F) (see the module)."""
    new, ref = np.asarray(new, float), np.asarray(ref, float)
    n, m = len(new), len(ref)
    if n < 1 or m < 2:
        raise ValueError(f"a window test needs >= 1 new and >= 2 reference episodes, got {n} and {m}")
    union = np.concatenate([new, ref])  # (N, F)
    xs = _standardised_ranks(union)
    observed_mask = np.zeros((1, n + m))
    observed_mask[0, :n] = 1.0
    stat = _standardised_stats(observed_mask, xs, n, two_sided)[0]  # (F,)
    draws = int(min(max(draws, 1), MAX_DRAWS))
    null_max, exact = _null_max(xs, n, two_sided, draws, rng)  # (S,)
    tol = 1e-9  # ties of the observed subset with itself count as ">="
    if exact:  # the observed subset is one of the enumerated ones
        feature_p = (null_max[None, :] >= stat[:, None] - tol).mean(1)
        min_p = float((null_max >= null_max.max() - tol).mean())  # every subset as extreme as the most extreme
        subsets = f"exact ({len(null_max)} subsets)"
    else:
        feature_p = (1 + (null_max[None, :] >= stat[:, None] - tol).sum(1)) / (len(null_max) + 1)
        # each feature's ranks have one most extreme subset (two when two-sided): even a perfect
        # separation on one feature ties with that many subsets
        extreme = len(two_sided) + int(np.sum(two_sided))
        min_p = max(1.0 / (len(null_max) + 1), extreme / math.comb(n + m, n))
        subsets = f"random ({len(null_max)} draws)"
    diff = new.mean(0) - ref.mean(0)
    return WindowTest(n, m, stat, float(feature_p.min()), feature_p, min_p, subsets, diff, _welch_ci(new, ref, diff))


def _welch_ci(new: np.ndarray, ref: np.ndarray, diff: np.ndarray, level: float = 0.95) -> np.ndarray:
    """(F, 2) Welch interval of mean(new) - mean(ref); a single new episode uses the reference's
    variance for both sides (prediction-style interval)."""
    n, m = len(new), len(ref)
    vr = ref.var(0, ddof=1)
    vn = new.var(0, ddof=1) if n > 1 else vr
    a, b = vn / n, vr / m
    se = np.sqrt(a + b)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(se > 0, (a + b) ** 2 / (a**2 / max(n - 1, 1) + b**2 / (m - 1)), 1.0)
    if n == 1:  # the only variance estimate is the reference's
        df = np.full_like(vr, m - 1.0)
    q = np.array([t_critical((1 - level) / 2, max(float(d), 1.0)) for d in np.atleast_1d(df)])
    return np.stack([diff - q * se, diff + q * se], 1)


@dataclass(frozen=True)
class LookPlan:
    """The false-alarm budget: alpha over `looks` looks x len(windows) window tests per look."""

    alpha: float = 0.05
    looks: int = 52  # e.g. a year of weekly looks
    windows: tuple[int, ...] = (1, 4)  # periods per window: this period alone, and the last 4 together

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.looks < 1 or not self.windows or min(self.windows) < 1:
            raise ValueError("looks and every window must be >= 1 period")

    @property
    def level(self) -> float:
        """The level of each window test."""
        return self.alpha / (self.looks * len(self.windows))

    def cycle(self, look: int) -> int:
        """Which budget cycle look number `look` (1-based) falls in (1 = the first `looks` looks)."""
        return (look - 1) // self.looks + 1

    def guarantee(self) -> str:
        return (
            f"false-alarm budget: P(any false alarm in {self.looks} looks) <= {self.alpha:g} under no drift "
            f"(each of the {len(self.windows)} window tests per look at {self.level:.2g}; the budget starts "
            f"again after every {self.looks} looks)"
        )


@dataclass
class LookResult:
    verdict: str  # "stable" | "drifted" | "off-support" | "inconclusive"
    tests: dict[int, WindowTest]  # window (periods) -> its test
    fired: list[int]  # windows whose test fired
    flagged: list[int]  # features flagged in a fired window (indices into the layout)
    untestable: list[int]  # windows whose smallest attainable p is above the level


def decide_look(tests: dict[int, WindowTest], level: float, kinds: list[str]) -> LookResult:
    """The verdict of one look: `off-support` when the support feature is flagged (the model
    cannot judge the rest there), `drifted` when any other feature is, `stable` when a window
    that could fire did not, `inconclusive` when no window could reach the level."""
    fired = [w for w, t in tests.items() if t.p_value <= level]
    untestable = [w for w, t in tests.items() if t.min_p > level]
    flagged = sorted({int(f) for w in fired for f in np.flatnonzero(tests[w].feature_p <= level)})
    if any(kinds[f] == "support" for f in flagged):
        verdict = "off-support"
    elif flagged:
        verdict = "drifted"
    elif len(untestable) == len(tests):
        verdict = "inconclusive"
    else:
        verdict = "stable"
    return LookResult(verdict, tests, fired, flagged, untestable)
