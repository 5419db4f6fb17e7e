"""Attribution: which correction of the checked data best brings it back to reality.

Owns the searches (latency, actuator) and the residual tests (sensor noise), each yielding an
*evidence* value on one scale: the statistic divided by its null (1 - alpha) quantile, where the
null comes from running the very same procedure on held-out real blocks (calibration). Evidence
>= 1 means "present at level alpha". The search objective J is each block's predictive
log-score under the corrected commands: the one-step NLL for latency (alignment), plus the
Gaussian log-score of an 8-step open-loop rollout for actuator corrections, which accumulate
(scoring.attribution_objective); the statistic is the paired t of the best
correction's improvement over blocks, and the null runs the same search, so the selection effect
of searching is in it.

  latency       J matrix over delays -max..max; estimate = argmin (steps, seconds); CI by block
                bootstrap of the argmin
  actuator      per command channel, J over gains, offsets and deadbands (one factor at a time)
  sensor_noise  per observation channel: residual std ratio (checked / real), bias, whiteness
  dynamics      residual growth over the open-loop horizon (late-horizon z^2) after applying the
                latency / actuator corrections that were found, vs real blocks
The attribution never blends: each gap has its own evidence, estimate and interval, and the top
gap is named only when the block bootstrap separates it from the runner-up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.scoring import attribution_objective, one_step_nll
from wmcheck.checks.transforms import actuator, shift_actions


@dataclass
class SearchMatrices:
    """J[candidate, block] for every search; computed for real blocks (calibration) and checked ones."""

    delays: np.ndarray  # (Ld,) candidate delays
    latency: np.ndarray  # (Ld, n)
    act_values: dict[str, np.ndarray] = field(default_factory=dict)  # "gain"/"offset"/"deadband" -> (G,) grid
    actuator: dict[str, np.ndarray] = field(default_factory=dict)  # "gain:c" -> (G, n)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}delays": self.delays, f"{prefix}latency": self.latency}
        for k, v in self.act_values.items():
            out[f"{prefix}grid_{k}"] = v
        for k, v in self.actuator.items():
            out[f"{prefix}act_{k}"] = v
        return out

    @classmethod
    def from_arrays(cls, arrays, prefix: str) -> "SearchMatrices":
        grids = {k[len(prefix) + 5 :]: np.asarray(arrays[k]) for k in arrays if k.startswith(prefix + "grid_")}
        act = {k[len(prefix) + 4 :]: np.asarray(arrays[k]) for k in arrays if k.startswith(prefix + "act_")}
        return cls(np.asarray(arrays[prefix + "delays"]), np.asarray(arrays[prefix + "latency"]), grids, act)


def search_matrices(model, episodes, normalizer, cfg, action_std: np.ndarray) -> SearchMatrices:
    """Evaluate J for every candidate correction on the blocks of `episodes`."""
    def blocks(eps):
        return make_blocks(eps, normalizer, cfg.context, cfg.horizon)

    def J(eps):
        return attribution_objective(model, blocks(eps), seed=cfg.seed)

    # Latency is an alignment question: the one-step NLL pins it to the step (an open-loop term
    # blurs it); gains, offsets and deadbands accumulate over steps, so they use the full objective.
    delays = np.arange(-cfg.max_delay, cfg.max_delay + 1)
    latency = np.stack([one_step_nll(model, blocks([shift_actions(e, int(d)) for e in episodes]), seed=cfg.seed)
                        for d in delays])
    base = J(episodes)
    grids = {"gain": np.asarray(cfg.gain_grid), "offset": np.asarray(cfg.offset_grid),
             "deadband": np.asarray(cfg.deadband_grid)}
    act = {}
    for c in range(len(action_std)):
        for kind, grid in grids.items():
            rows = []
            for v in grid:
                if (kind == "gain" and v == 1.0) or (kind != "gain" and v == 0.0):
                    rows.append(base)
                    continue
                kw = {"gain": dict(gain=v), "offset": dict(offset=v * action_std[c]),
                      "deadband": dict(band=v * action_std[c])}[kind]
                rows.append(J([actuator(e, c, **kw) for e in episodes]))
            act[f"{kind}:{c}"] = np.stack(rows)
    return SearchMatrices(delays, latency, grids, act)


def _improvement(mat: np.ndarray, identity: int, idx: np.ndarray | None = None) -> tuple[float, int]:
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


def null_quantile(real: np.ndarray, identity: int, n: int, alpha: float, rng: np.random.Generator,
                  reps: int) -> float:
    """Threshold for the search statistic: the (1 - alpha) quantile of the same search on n
    resampled *real* blocks (the selection effect of searching is in it), and never below the
    one-sided normal critical value (a paired t below that is not significant even unsearched)."""
    from statistics import NormalDist

    m = real.shape[1]
    vals = [_improvement(real, identity, rng.integers(0, m, size=n))[0] for _ in range(reps)]
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


def evaluate_search(checked: np.ndarray, real: np.ndarray, grid: np.ndarray, identity: int, alpha: float,
                    rng: np.random.Generator, reps: int, boot_idx: np.ndarray) -> SearchResult:
    n = checked.shape[1]
    thr = null_quantile(real, identity, n, alpha, rng, reps)
    t, best = _improvement(checked, identity)
    boots, ests = [], []
    for idx in boot_idx:
        b_t, b_best = _improvement(checked, identity, idx)
        boots.append(min(b_t, 1e6) / thr)
        ests.append(grid[b_best])
    lo, hi = np.quantile(ests, [0.05, 0.95])
    curve = checked.mean(1)
    return SearchResult(min(t, 1e6) / thr, float(curve[identity] - curve[best]), thr, best, (float(lo), float(hi)),
                        np.asarray(boots), curve)


def residual_evidence(checked_std: np.ndarray, real_std: np.ndarray, checked_mean: np.ndarray,
                      real_mean: np.ndarray, alpha: float, rng: np.random.Generator, reps: int,
                      boot_idx: np.ndarray) -> dict:
    """Sensor-noise evidence per channel from block residual statistics (n, D) vs real (m, D).

    Rank-based, two-sided (a simulator can be too noisy or too clean, biased up or down): the
    Mann-Whitney z of the blocks' log residual std and of their residual mean against real blocks,
    over the critical value at alpha / (2 * 2 * D). Estimates: noise ratio sqrt(mean var_checked /
    mean var_real) with a block-bootstrap interval, and the bias (difference of mean residuals).
    """
    from statistics import NormalDist

    from wmcheck.checks.stats import mann_whitney_z

    D = checked_std.shape[1]
    crit = NormalDist().inv_cdf(1 - alpha / (4 * D))
    log_real = np.log(np.maximum(real_std, 1e-12))

    def evidence(std, mu):
        ls = np.log(np.maximum(std, 1e-12))
        z_ratio = np.array([abs(mann_whitney_z(ls[:, d], log_real[:, d])) for d in range(D)])
        z_bias = np.array([abs(mann_whitney_z(mu[:, d], real_mean[:, d])) for d in range(D)])
        return np.maximum(z_ratio, z_bias) / crit  # (D,)

    def ratio(std, rstd):
        return np.sqrt(np.maximum((std**2).mean(0), 1e-12) / np.maximum((rstd**2).mean(0), 1e-12))

    ev = evidence(checked_std, checked_mean)
    m = real_std.shape[0]
    boots, ratio_boot = [], []
    for idx in boot_idx:
        boots.append(evidence(checked_std[idx], checked_mean[idx]).max())
        ratio_boot.append(ratio(checked_std[idx], real_std[rng.integers(0, m, size=m)]))
    ratio_boot = np.asarray(ratio_boot)
    return {
        "evidence_per_channel": ev, "evidence": float(ev.max()), "ratio": ratio(checked_std, real_std),
        "ratio_interval": (np.quantile(ratio_boot, 0.05, axis=0), np.quantile(ratio_boot, 0.95, axis=0)),
        "bias": checked_mean.mean(0) - real_mean.mean(0), "boot_evidence": np.asarray(boots),
    }


def excess_evidence(checked: np.ndarray, real: np.ndarray, alpha: float, rng: np.random.Generator, reps: int,
                    boot_idx: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Evidence that block scores (n,) exceed real ones (m,), rank-based (open-loop errors are
    heavy-tailed: a few chaotic blocks must not decide): the Mann-Whitney z over its one-sided
    critical value at alpha. Returns (evidence, bootstrap evidence over checked blocks, z_crit)."""
    from statistics import NormalDist

    from wmcheck.checks.stats import mann_whitney_z

    crit = NormalDist().inv_cdf(1 - alpha)
    boots = np.asarray([mann_whitney_z(checked[idx], real) / crit for idx in boot_idx])
    return mann_whitney_z(checked, real) / crit, boots, crit


def separate_top(boot: dict[str, np.ndarray], present: list[str], level: float = 0.9) -> tuple[str, list[str]]:
    """Top gap if it has the largest evidence in >= `level` of bootstrap replicates, else 'none'
    plus the confounded gaps (those that are the largest in >= 10% of replicates)."""
    if not present:
        return "none", []
    if len(present) == 1:
        return present[0], []
    mat = np.stack([boot[g] for g in present])  # (G, reps)
    winners = np.argmax(mat, 0)
    share = np.bincount(winners, minlength=len(present)) / mat.shape[1]
    best = int(np.argmax(share))
    if share[best] >= level:
        return present[best], []
    return "none", [present[i] for i in np.flatnonzero(share >= 0.1)]
