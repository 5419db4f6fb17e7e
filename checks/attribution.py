"""Attribution: which correction of the checked data best brings it back to reality.

Owns the searches (latency, actuator) and the residual tests (sensor noise), each yielding an
*evidence* value on one scale: the statistic divided by its null (1 - alpha) quantile, where the
null comes from running the very same procedure on held-out real blocks (calibration). Evidence
>= 1 means "present at level alpha". The search objective J is each block's predictive
log-score under the corrected commands: the one-step NLL for latency (alignment), plus the
Gaussian log-score of 8-step open-loop rollouts from windows tiling the block for actuator
corrections, which accumulate (scoring.attribution_objective); the statistic is the paired t of the best
correction's improvement over blocks, and the null runs the same search, so the selection effect
of searching is in it.

  latency       J matrix over delays -max..max; estimate = the shift that registers the checked
                curve J(d) onto the real blocks' curve (steps, seconds); CI by episode bootstrap
  actuator      per command channel, J over gains, offsets and deadbands (one factor at a time)
  sensor_noise  per observation channel: residual std ratio (checked / real), bias, whiteness
  dynamics      one-step residuals larger AND more coloured than reality's (the whiteness test of
                system identification: added sensor noise whitens residuals, missing or wrong
                physics colours them), after applying the latency / actuator corrections found;
                reported with the open-loop error ratio per channel and per horizon
The attribution never blends: each gap has its own evidence, estimate and interval, and the top
gap is named only when the block bootstrap separates it from the runner-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.scoring import attribution_objective, one_step_nll
from wmcheck.checks.transforms import actuator_correction, actuator_values, correction_kwargs, shift_drivers

ACTUATOR_KINDS = ("gain", "offset", "deadband")
"""The actuator corrections searched, one factor at a time per command channel."""


@dataclass
class SearchMatrices:
    """J[candidate, block] for every search; computed for real blocks (calibration) and checked ones."""

    delays: np.ndarray  # (Ld,) candidate delays
    latency: np.ndarray  # (Ld, n); (0, 0) when the latency search was not run
    act_values: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> (G,) grid
    actuator: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> (C, G, n): channel, candidate, block

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}delays": self.delays, f"{prefix}latency": self.latency}
        for kind in self.act_values:
            out[f"{prefix}grid_{kind}"] = self.act_values[kind]
            out[f"{prefix}actuator_{kind}"] = self.actuator[kind]
        return out

    @classmethod
    def from_arrays(cls, arrays, prefix: str) -> SearchMatrices:
        kinds = [k for k in ACTUATOR_KINDS if f"{prefix}grid_{k}" in arrays]
        return cls(
            np.asarray(arrays[prefix + "delays"]),
            np.asarray(arrays[prefix + "latency"]),
            {k: np.asarray(arrays[f"{prefix}grid_{k}"]) for k in kinds},
            {k: np.asarray(arrays[f"{prefix}actuator_{k}"]) for k in kinds},
        )

    def searches(self):
        """(kind, channel, grid, J (G, n)) for every actuator search."""
        for kind, grid in self.act_values.items():
            for c in range(self.actuator[kind].shape[0]):
                yield kind, c, grid, self.actuator[kind][c]

    @property
    def n_actuator_searches(self) -> int:
        return sum(m.shape[0] for m in self.actuator.values())


def identity_index(kind: str, grid: np.ndarray) -> int:
    """Index of the no-correction candidate in a grid (gain 1, offset 0, deadband 0, delay 0)."""
    return int(np.flatnonzero(np.asarray(grid) == (1.0 if kind == "gain" else 0.0))[0])


def search_matrices(
    model,
    episodes,
    normalizer,
    cfg,
    action_std: np.ndarray,
    latency: bool = True,
    actuator_episodes=None,
    actuator: bool = True,
    kinds: tuple[str, ...] = ACTUATOR_KINDS,
) -> SearchMatrices:
    """Evaluate J for every candidate correction on the blocks of `episodes`; the actuator searches
    run on `actuator_episodes` when given (the checked episodes with the latency found already
    corrected: corrections are found in order, each on what the previous ones leave), and the
    latency search is skipped when `latency` is False (its matrix is then empty), the actuator
    searches when `actuator` is False; `kinds` limits them to some of gain / offset / deadband."""

    def blocks(eps):
        return make_blocks(eps, normalizer, cfg.context, cfg.horizon)

    def J(eps):
        return attribution_objective(model, blocks(eps), seed=cfg.seed)

    # Latency is an alignment question: the one-step NLL pins it to the step (an open-loop term
    # blurs it); gains, offsets and deadbands accumulate over steps, so they use the full objective.
    delays = np.arange(-cfg.max_delay, cfg.max_delay + 1)
    latency = (
        np.stack(
            [one_step_nll(model, blocks([shift_drivers(e, int(d)) for e in episodes]), seed=cfg.seed) for d in delays]
        )
        if latency
        else np.zeros((0, 0))
    )
    episodes = episodes if actuator_episodes is None else actuator_episodes
    grids = {
        "gain": np.asarray(cfg.gain_grid),
        "offset": np.asarray(cfg.offset_grid),
        "deadband": np.asarray(cfg.deadband_grid),
    }
    grids = {k: v for k, v in grids.items() if k in kinds}
    if not actuator:
        return SearchMatrices(delays, latency, {}, {})
    base = J(episodes)
    act = {}
    for kind, grid in grids.items():
        per_channel = []
        for c in range(len(action_std)):
            rows = []
            for v in grid:
                if v == (1.0 if kind == "gain" else 0.0):
                    rows.append(base)
                    continue
                value = v if kind == "gain" else v * action_std[c]
                rows.append(J([actuator_correction(e, c, kind, value) for e in episodes]))
            per_channel.append(np.stack(rows))  # (G, n)
        act[kind] = np.stack(per_channel) if per_channel else np.zeros((0, len(grid), len(base)))  # (C, G, n)
    return SearchMatrices(delays, latency, grids, act)


def outside_training_share(norm, episodes, c: int) -> float:
    """Share of command channel c's values outside the training logs' range (0 when the normaliser
    predates stored ranges)."""
    x = np.concatenate([e.actions[:, c] for e in episodes]) if episodes else np.zeros(0, np.float32)
    return _outside_share(norm, x, c)


def _outside_share(norm, x: np.ndarray, c: int) -> float:
    """Share of the values x (n,) of command channel c outside the training logs' range."""
    rng_a = norm.range["action"]
    if rng_a is None or not len(x):
        return 0.0
    return float(((x < rng_a[0][c]) | (x > rng_a[1][c])).mean())


def allowed_corrections(
    norm, episodes, c: int, kind: str, grid: np.ndarray, unit: float, competence_alpha: float
) -> np.ndarray:
    """(G,) bool: the candidate corrections of kind `kind` (grid values x `unit`) on channel c that
    the model can judge: they leave no more of the commands outside the training logs' range than
    the uncorrected commands already are, or competence_alpha, whichever is larger. The model
    knows reality only inside that range; beyond it a physics gap could masquerade as a
    correction it only extrapolates to."""
    x = np.concatenate([e.actions[:, c] for e in episodes]) if episodes else np.zeros(0, np.float32)
    share = np.array([_outside_share(norm, actuator_values(x, **correction_kwargs(kind, v * unit)), c) for v in grid])
    ident = identity_index(kind, grid)
    return share <= max(share[ident], competence_alpha)


def paired_improvement(mat: np.ndarray, identity: int, idx: np.ndarray | None = None) -> tuple[float, int]:
    """Paired t-statistic of the best candidate's improvement over the identity on blocks idx.

    mat (G, n): J per candidate and block. The best candidate minimises mean J; the statistic is
    mean(J_id - J_best) / (sd / sqrt(n)) over blocks (0 when the identity is best). Returns
    (t, argmin).
    """
    m = mat if idx is None else mat[:, idx]
    best = int(np.argmin(m.mean(1)))
    if best == identity:
        return 0.0, best
    diff = m[identity] - m[best]  # (n,)
    sd = diff.std(ddof=1) if len(diff) > 1 else 0.0
    if sd <= 0:
        return (float("inf") if diff.mean() > 0 else 0.0), best
    return float(diff.mean() / (sd / np.sqrt(len(diff)))), best


def only_allowed(mat: np.ndarray, allowed: np.ndarray | None, identity: int) -> np.ndarray:
    """J matrix (G, n) with the candidates the model cannot judge (allowed False) set to +inf, so
    no search picks them; the identity always stays."""
    if allowed is None:
        return mat
    allowed = np.asarray(allowed, bool).copy()
    allowed[identity] = True
    return np.where(allowed[:, None], mat, np.inf)


def null_quantile(
    real: np.ndarray,
    identity: int,
    n: int,
    alpha: float,
    rng: np.random.Generator,
    reps: int,
    real_groups: np.ndarray | None = None,
) -> float:
    """Threshold for the search statistic: the (1 - alpha) quantile of the same search on n
    resampled *real* blocks (the selection effect of searching is in it), drawn as whole real
    episodes when `real_groups` labels them (so the null has the dependence between blocks of one
    episode that the checked blocks have), and never below the one-sided normal critical value
    (a paired t below that is not significant even unsearched)."""
    from statistics import NormalDist

    from wmcheck.checks.stats import cluster_resample

    m = real.shape[1]

    def draw():
        return rng.integers(0, m, size=n) if real_groups is None else cluster_resample(rng, real_groups, n)

    vals = [
        min(paired_improvement(real, identity, draw())[0], 1e6) for _ in range(reps)
    ]  # inf: one block, or identical J
    floor = NormalDist().inv_cdf(1 - alpha)
    return float(max(np.quantile(vals, 1 - alpha), floor))


@dataclass
class SearchResult:
    evidence: float
    improvement: float  # mean J reduction of the best candidate (nats per step and channel)
    threshold: float
    best: int  # index into the grid
    interval: tuple[float, float]  # bootstrap interval of the estimate (grid values)
    boot_evidence: np.ndarray  # (reps,)
    curve: np.ndarray  # mean J per candidate


def evaluate_search(
    checked: np.ndarray,
    real: np.ndarray,
    grid: np.ndarray,
    identity: int,
    alpha: float,
    rng: np.random.Generator,
    reps: int,
    boot_idx,
    real_groups: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
) -> SearchResult:
    """checked (G, n) / real (G, m): J per candidate and block; boot_idx: bootstrap index arrays
    over the checked blocks (whole episodes); real_groups (m,): the real blocks' episodes;
    allowed (G,): the candidates the model can judge (the others are left out of the search, on
    the checked and on the real side alike, so the null keeps the same selection effect)."""
    if allowed is not None:
        checked, real = only_allowed(checked, allowed, identity), only_allowed(real, allowed, identity)
    n = checked.shape[1]
    thr = null_quantile(real, identity, n, alpha, rng, reps, real_groups)
    t, best = paired_improvement(checked, identity)
    boots, ests = [], []
    for idx in boot_idx:
        b_t, b_best = paired_improvement(checked, identity, idx)
        boots.append(min(b_t, 1e6) / thr)
        ests.append(grid[b_best])
    lo, hi = np.quantile(ests, [0.05, 0.95])
    curve = checked.mean(1)
    return SearchResult(
        min(t, 1e6) / thr,
        float(curve[identity] - curve[best]),
        thr,
        best,
        (float(lo), float(hi)),
        np.asarray(boots),
        curve,
    )


def registered_delay(
    checked: np.ndarray, real: np.ndarray, delays: np.ndarray, boot_idx
) -> tuple[int, tuple[float, float]]:
    """The delay estimate by curve registration: the shift s for which the checked blocks' mean
    one-step NLL over candidate delays, J_c(d), best matches the real blocks' curve shifted by s,
    J_r(d - s) (least variance of their difference over the overlap, so a level offset does not
    matter). Real data have no delay by definition, but a model's curve on them need not bottom
    out exactly at 0 (it can be flat between -1 and 0), so the argmin of J_c alone is biased by the
    model's own alignment; registration removes that. checked (Ld, n), real (Ld, m). Returns
    (estimate, 90% episode-bootstrap interval)."""
    rc = real.mean(1)
    pos = {int(d): i for i, d in enumerate(delays)}

    def fit(curve) -> int:
        best, best_v = 0, np.inf
        for s in delays:
            pairs = [(pos[int(d)], pos[int(d - s)]) for d in delays if int(d - s) in pos]
            if len(pairs) < 3:
                continue
            diff = np.array([curve[i] - rc[j] for i, j in pairs])
            v = float(diff.var())
            if v < best_v - 1e-15 or (abs(v - best_v) <= 1e-15 and abs(s) < abs(best)):
                best, best_v = int(s), v
        return best

    est = fit(checked.mean(1))
    boots = [fit(checked[:, idx].mean(1)) for idx in boot_idx]
    lo, hi = np.quantile(boots, [0.05, 0.95])
    return est, (float(lo), float(hi))


def residual_evidence(
    checked_std: np.ndarray,
    real_std: np.ndarray,
    checked_mean: np.ndarray,
    real_mean: np.ndarray,
    checked_ac1: np.ndarray,
    real_ac1: np.ndarray,
    alpha: float,
    rng: np.random.Generator,
    reps: int,
    boot_idx,
    groups: tuple[np.ndarray, np.ndarray],
    sensor_share: float = 1.0,
    dynamics_share: float = 1.0,
) -> ResidualStats:
    """Sensor-noise and dynamics evidence per channel from the blocks' one-step residual statistics
    (n, D) vs real blocks' (m, D): level (std), bias (mean) and colour (lag-1 autocorrelation).

    The residual whiteness test of system identification separates the two: white noise added to
    the observations makes the residuals larger and *whiter* (with a filtering model, even
    negatively correlated), or, for a simulator cleaner than the sensor, smaller; a dynamics gap
    makes them larger and *more coloured* (the error is a smooth function of the state, so it
    persists from step to step).
      sensor_noise  per channel: max(|z_level|, |z_bias|) over its critical value at sensor_share x alpha / (4 D)
                    (two-sided, two statistics), except on channels whose residuals are both larger
                    and significantly more coloured than reality's (those are dynamics);
      dynamics      per channel: min(z_level, z_colour) over the one-sided critical value at
                    dynamics_share x alpha / D: larger AND more coloured residuals (the open-loop
                    bias test, bias.py, takes the rest of the dynamics level).
    Every z is the episode-level t of the statistic (stats.episode_t, pooled variance; groups = (checked, real)
    episode of each block: blocks of one episode are dependent and a rank test of few episodes
    saturates), mapped to the normal scale by its tail probability (stats.t_to_z). Estimates: noise
    ratio sqrt(mean var_checked / mean var_real) with an episode-bootstrap interval, and the bias
    (difference of mean residuals).
    """
    from statistics import NormalDist

    from wmcheck.checks.stats import cluster_resample, episode_means_columns, pooled_t_of_means, t_to_z_many

    gx, gy = (np.asarray(g) for g in groups)
    D = checked_std.shape[1]
    crit_sensor = NormalDist().inv_cdf(1 - sensor_share * alpha / (4 * D))  # share: the rest goes to smoothness
    crit_dyn = NormalDist().inv_cdf(1 - dynamics_share * alpha / D)  # share: the rest goes to the open-loop bias
    ref = np.concatenate([np.log(np.maximum(real_std, 1e-12)), real_mean, real_ac1], 1)  # (m, 3D): level, bias, colour
    stats = np.concatenate([np.log(np.maximum(checked_std, 1e-12)), checked_mean, checked_ac1], 1)  # (n, 3D)

    # the episode t of every statistic and channel, at the blocks and at every bootstrap of them;
    # then all of them to the normal scale at once
    draws = [np.arange(len(stats)), *(np.asarray(i) for i in boot_idx)]
    real_means = episode_means_columns(ref, gy)  # (3D, ky): the same real side for every draw
    ts, dfs = zip(*(pooled_t_of_means(episode_means_columns(stats[idx], gx[idx]), real_means) for idx in draws))
    z = t_to_z_many(np.concatenate(ts), np.repeat(dfs, 3 * D)).reshape(len(draws), 3, D)  # (R + 1, 3, D)
    level, bias, colour = z[:, 0], z[:, 1], z[:, 2]  # (R + 1, D) each
    coloured_all = (level > 0) & (colour > crit_dyn)
    sensor_all = np.where(coloured_all, 0.0, np.maximum(np.abs(level), np.abs(bias)) / crit_sensor)
    dynamics_all = np.minimum(level, colour) / crit_dyn

    def ratio(std, rstd):
        return np.sqrt(np.maximum((std**2).mean(0), 1e-12) / np.maximum((rstd**2).mean(0), 1e-12))

    ev, dyn, coloured = sensor_all[0], dynamics_all[0], coloured_all[0]
    m = real_std.shape[0]
    boots, dyn_boots = sensor_all[1:].max(1), dynamics_all[1:].max(1)
    ratio_boot = [ratio(checked_std, real_std)]  # no bootstrap: the interval is the point
    for idx in boot_idx:
        ratio_boot.append(ratio(checked_std[idx], real_std[cluster_resample(rng, gy, m)]))
    ratio_boot = np.asarray(ratio_boot[1:] if len(ratio_boot) > 1 else ratio_boot)
    return ResidualStats(
        ev,
        ratio(checked_std, real_std),
        np.quantile(ratio_boot, 0.05, axis=0),
        np.quantile(ratio_boot, 0.95, axis=0),
        checked_mean.mean(0) - real_mean.mean(0),
        coloured,
        dyn,
        np.asarray(boots),
        np.asarray(dyn_boots),
    )


SMOOTHNESS_SCORES = ("kl", "nll")
"""The scores whose lower tail says "less surprising than reality": a simulator without noise."""


@dataclass
class Smoothness:
    """A too-smooth simulator: its transitions are less surprising to the model than reality's."""

    z: dict[str, float]  # score -> normal-scale z, checked vs real episodes (negative: less surprising)
    kl_ratio: float  # mean KL(post || prior), checked / real
    nll_difference: float  # mean one-step NLL, checked - real (nats per step and channel)
    evidence: float  # -min(z) over its critical value: >= 1 means significantly smoother than reality
    critical: float = 0.0  # the normal critical value at the test's level (Bonferroni over the scores)
    kl_geo_ratio: float = float("nan")  # ratio of the episodes' mean log KL, exponentiated (what the test compares)
    kl_geo_ratio_ci: tuple[float, float] = (float("nan"), float("nan"))  # its 95 % Welch interval


def smoothness_evidence(checked: dict, checked_groups, real: dict, real_groups, level: float) -> Smoothness:
    """The lower tail of the surprise scores (KL(post || prior), one-step NLL): episode-level t
    (stats.episode_t, KL on a log scale), mapped to the normal scale, Bonferroni over the two at
    `level`. Every divergence test asks "worse than reality?"; a deterministic simulator is better
    than reality on all of them (no sensor noise, no process noise), and this is where it shows."""
    from statistics import NormalDist

    from wmcheck.checks.stats import episode_t, episode_welch, log_pair, t_to_z, welch_interval

    crit = NormalDist().inv_cdf(1 - level / len(SMOOTHNESS_SCORES))
    z = {}
    for s in SMOOTHNESS_SCORES:
        x, y = np.asarray(checked[s], float), np.asarray(real[s], float)
        if s != "nll":
            x, y = log_pair(x, y)
        z[s] = t_to_z(*episode_t(x, checked_groups, y, real_groups))
    kl_ratio = float(np.mean(checked["kl"]) / max(float(np.mean(real["kl"])), 1e-12))
    nll_diff = float(np.mean(checked["nll"]) - np.mean(real["nll"]))
    d_log, se, df = episode_welch(checked["kl"], checked_groups, real["kl"], real_groups, log=True)
    lo, hi = welch_interval(d_log, se, df)
    return Smoothness(
        z,
        kl_ratio,
        nll_diff,
        max(0.0, -min(z.values())) / crit,
        crit,
        float(np.exp(d_log)),
        (float(np.exp(lo)), float(np.exp(hi))),
    )


@dataclass
class ResidualStats:
    """The residual tests' outcome per observation channel (D,), see `residual_evidence`."""

    sensor_per_channel: np.ndarray  # (D,) sensor-noise evidence (level or bias), 0 on coloured channels
    ratio: np.ndarray  # (D,) residual std, checked / real
    ratio_lo: np.ndarray  # (D,) 90% episode-bootstrap interval of the ratio
    ratio_hi: np.ndarray  # (D,)
    bias: np.ndarray  # (D,) mean residual, checked - real (normalised units)
    coloured: np.ndarray  # (D,) bool: larger and significantly more coloured residuals (dynamics)
    dynamics_per_channel: np.ndarray  # (D,) dynamics evidence
    sensor_boot: np.ndarray  # (reps,) bootstrap of the largest sensor evidence
    dynamics_boot: np.ndarray  # (reps,)

    @property
    def sensor_evidence(self) -> float:
        return float(self.sensor_per_channel.max())

    @property
    def dynamics_evidence(self) -> float:
        return float(self.dynamics_per_channel.max())


def separate_top(boot: dict[str, np.ndarray], present: list[str], level: float = 0.9) -> tuple[str, list[str]]:
    """Top gap if it has the largest evidence in >= `level` of bootstrap replicates, else 'none'
    plus the confounded gaps (those that are the largest in >= 10% of replicates)."""
    if not present:
        return "none", []
    if len(present) == 1:
        return present[0], []
    mat = np.stack([boot[g] for g in present])  # (G, reps)
    if mat.shape[1] == 0:  # no bootstrap (the power table): nothing separates them
        return "none", list(present)
    winners = np.argmax(mat, 0)
    share = np.bincount(winners, minlength=len(present)) / mat.shape[1]
    best = int(np.argmax(share))
    if share[best] >= level:
        return present[best], []
    return "none", [present[i] for i in np.flatnonzero(share >= 0.1)]
