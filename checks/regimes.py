"""Where the checked trajectories part ways with reality: regimes of the operating conditions.

Owns `find_regimes`. For every control channel (the commands and the exogenous inputs acting on a
step) the held-out real steps define quantile bins. In each bin:
- test: the checked blocks' open-loop errors against the held-out real blocks' in the same bin.
  Blocks are the units (steps are autocorrelated): a block contributes the mean z^2 of its steps
  that fall in the bin (z = standardised open-loop error, all observation channels), blocks with
  fewer than `min_steps` steps there are left out; one-sided Mann-Whitney, clustered by episode
  (blocks of one episode are dependent; stats.clustered_mann_whitney) when the blocks' episodes
  are given, Bonferroni over channels x bins at alpha;
- effect, in the observations' own units: the median signed error of the checked observations
  against the model's prediction (checked - predicted) with a 95% interval that resamples whole
  episodes (blocks without episode labels), next
  to the same median on held-out real data (the model's own bias there, the yardstick);
- competence: the share of the checked steps in the bin whose block is outside the model's
  competence; separately, the checked steps whose controls leave the training logs' range.
Adjacent flagged bins of one channel merge into one range; its effect is recomputed over all its
steps, and it is reported as a regime only when the effect is material (the interval excludes 0
and the error exceeds the model's own error on real data there), in a sentence a domain engineer
can verify ("Ws_avg 7.2-11.2 m/s: P_avg 104 kW below what the model predicts for reality ...").
A divergence driven by one channel also shows, diluted, in the bins of channels correlated with
it; the materiality rule and the ordering by p-value keep the driving channel first.

Only competent blocks enter the test and the effect; bins where most checked steps are outside
competence are listed as `not_competent` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wmcheck.checks.stats import clustered_mann_whitney, mann_whitney_greater


@dataclass
class RegimeConfig:
    bins: int = 8  # quantile bins of the held-out real values per channel
    min_steps: int = 3  # steps a block needs inside a bin to count there
    min_blocks: int = 3  # blocks per side for a bin to be tested
    bootstrap: int = 200  # block-bootstrap replicates for the effect's interval
    not_competent_share: float = 0.5  # a bin is `not competent` when this share of its checked steps is


def quantile_edges(real_values: np.ndarray, bins: int) -> np.ndarray:
    """Unique quantile edges of the real values (a channel with few distinct values gets fewer bins)."""
    q = np.quantile(real_values, np.linspace(0, 1, bins + 1))
    return np.unique(q)


def bin_of(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of each value against the inner edges; values outside the real range go to the
    end bins (and are counted separately as outside the range)."""
    return np.clip(np.searchsorted(edges[1:-1], values, side="right"), 0, len(edges) - 2)


def _block_means(z2: np.ndarray, in_bin: np.ndarray, min_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean z^2 of each block over its steps in the bin, for blocks with >= min_steps such steps,
    and the mask of those blocks."""
    counts = in_bin.sum(1)
    keep = counts >= min_steps
    sums = (z2 * in_bin).sum(1)
    return sums[keep] / counts[keep], keep


def _median_err(err: np.ndarray, in_bin: np.ndarray) -> float:
    vals = err[in_bin]
    return float(np.median(vals)) if len(vals) else float("nan")


def _bootstrap_ci(
    err: np.ndarray, in_bin: np.ndarray, reps: int, rng: np.random.Generator, groups: np.ndarray | None = None
) -> list[float]:
    """95% interval of the median error in the bin, resampling whole episodes (`groups`: each
    block's episode) or, without labels, whole blocks. All resamples at once: a resample is a
    multiplicity per unit, and the median of the values repeated that often is a weighted median
    of the values sorted once (the same draws and numbers as concatenating the units per resample,
    which made this a Python loop of reps medians per channel and regime)."""
    rows = np.flatnonzero(in_bin.any(1))
    if len(rows) < 2:
        return [float("nan"), float("nan")]
    if groups is not None:
        unit_of_row = np.unique(groups[rows], return_inverse=True)[1].ravel()
    else:
        unit_of_row = np.arange(len(rows))
    n_units = int(unit_of_row.max()) + 1
    r, c = np.nonzero(in_bin[rows])  # the bin's values: (block row, step)
    vals = err[rows][r, c]
    order = np.argsort(vals, kind="stable")
    vals, unit = vals[order], unit_of_row[r][order]  # (M,) sorted, with each value's unit
    draws = rng.integers(0, n_units, (reps, n_units))  # per resample, n_units draws of a unit
    mult = np.zeros((reps, n_units))
    np.add.at(mult, (np.repeat(np.arange(reps), n_units), draws.ravel()), 1.0)
    cum = np.cumsum(mult[:, unit], 1)  # (R, M) how many values up to each sorted one
    total = cum[:, -1]

    # the k-th (0-based) value of each resample: the first sorted value whose count passes k. The
    # rows of cum are nondecreasing, so one searchsorted over the rows laid end to end (row i
    # shifted by i * step) finds every row's position at once.
    R, M = cum.shape
    step = float(total.max()) + 1.0
    flat = (cum + step * np.arange(R)[:, None]).ravel()

    def kth(k: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(flat, k + step * np.arange(R), side="right") - M * np.arange(R)
        return vals[pos]

    meds = 0.5 * (kth((total - 1) // 2) + kth(total // 2))  # np.median: the mean of the middle two
    return [float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))]


def find_regimes(
    checked_z: np.ndarray,
    checked_err: np.ndarray,
    checked_controls: np.ndarray,
    competent: np.ndarray,
    real_z: np.ndarray,
    real_err: np.ndarray,
    real_controls: np.ndarray,
    control_names: list[str],
    obs_names: list[str],
    units: dict[str, str],
    alpha: float,
    cfg: RegimeConfig | None = None,
    seed: int = 0,
    training_range: np.ndarray | None = None,
    checked_episode: np.ndarray | None = None,
    real_episode: np.ndarray | None = None,
) -> dict:
    """Regimes of the operating conditions where the checked data diverge.

    checked_z / checked_err: (n, H, D) standardised and physical-unit open-loop errors of the
    checked blocks; checked_controls: (n, H, K) physical-unit controls of those steps; competent:
    (n,) bool. real_*: the same for held-out real blocks (calibration). training_range: (K, 2)
    min / max of each control in the training logs (default: the held-out real range).
    checked_episode (n,) / real_episode (m,): each block's episode (the clusters). Returns a
    JSON-safe dict: {"channels": [{name, unit, bins: [...]}], "regimes": [...], "not_competent":
    [...], "outside_training_range": [...], "alpha_per_test", "method"}.
    """
    cfg = cfg or RegimeConfig()
    rng = np.random.default_rng(seed)
    cz2 = (checked_z.astype(np.float64) ** 2).mean(-1)  # (n, H)
    rz2 = (real_z.astype(np.float64) ** 2).mean(-1)  # (m, H)
    comp = np.asarray(competent, bool)
    K = checked_controls.shape[-1]
    edges_all = [quantile_edges(real_controls[..., k].ravel(), cfg.bins) for k in range(K)]
    n_tests = sum(max(len(e) - 1, 0) for e in edges_all) or 1
    a_test = alpha / n_tests
    channels, regimes, not_competent, outside = [], [], [], []
    for k, name in enumerate(control_names):
        edges = edges_all[k]
        if len(edges) < 2:
            continue
        unit = units.get(name, "")
        cvals, rvals = checked_controls[..., k], real_controls[..., k]  # (n, H), (m, H)
        cbin, rbin = bin_of(cvals, edges), bin_of(rvals, edges)
        t_lo, t_hi = (
            (edges[0], edges[-1])
            if training_range is None
            else (float(training_range[k][0]), float(training_range[k][1]))
        )
        tol = 1e-4 * max(t_hi - t_lo, 1e-12)  # the controls went through normalise / denormalise (float32)
        lo_out, hi_out = cvals < t_lo - tol, cvals > t_hi + tol
        bins, masks = [], []
        for j in range(len(edges) - 1):
            cin, rin = cbin == j, rbin == j  # (n, H), (m, H)
            share_out = float((~comp[:, None] & cin).sum() / max(cin.sum(), 1))
            cin_c = cin & comp[:, None]
            x, kx = _block_means(cz2, cin_c, cfg.min_steps)
            y, ky = _block_means(rz2, rin, cfg.min_steps)
            tested = len(x) >= cfg.min_blocks and len(y) >= cfg.min_blocks
            if not tested:
                p = float("nan")
            elif checked_episode is None or real_episode is None:
                p = mann_whitney_greater(x, y, rng)
            else:
                p = clustered_mann_whitney(x, checked_episode[kx], y, real_episode[ky], rng)
            effect = _effect(checked_err, real_err, cin_c, rin, obs_names, units, cfg.bootstrap, rng, checked_episode)
            masks.append((cin_c, rin))
            bins.append(
                {
                    "range": [_round(edges[j]), _round(edges[j + 1])],
                    "checked_steps": int(cin.sum()),
                    "checked_blocks": int(len(x)),
                    "real_blocks": int(len(y)),
                    "checked_z2": _round(float(cz2[cin_c].mean()) if cin_c.any() else float("nan")),
                    "real_z2": _round(float(rz2[rin].mean()) if rin.any() else float("nan")),
                    "p_value": _round(p),
                    "flagged": bool(tested and p < a_test),
                    "outside_competence_share": round(share_out, 4),
                    "effect": effect,
                }
            )
        channels.append(
            {
                "name": name,
                "unit": unit,
                "bins": bins,
                "checked_below_real_range": int(lo_out.sum()),
                "checked_above_real_range": int(hi_out.sum()),
                "real_range": [_round(edges[0]), _round(edges[-1])],
            }
        )
        for run in _runs(bins, lambda b: b["flagged"]):
            # The merged range's effect, from all its steps; reported only when material: the
            # interval excludes 0 and the error exceeds the model's own error on real data there.
            cin = np.logical_or.reduce([masks[j][0] for j in run])
            rin = np.logical_or.reduce([masks[j][1] for j in run])
            eff = _effect(checked_err, real_err, cin, rin, obs_names, units, cfg.bootstrap, rng, checked_episode)
            if any(_material(e) for e in eff.values()):
                regimes.append(_describe(name, unit, [bins[j] for j in run], eff))
        for run in _runs(
            bins, lambda b: b["checked_steps"] > 0 and b["outside_competence_share"] >= cfg.not_competent_share
        ):
            not_competent.append(_describe_not_competent(name, unit, [bins[j] for j in run]))
        n_out = int((lo_out | hi_out).sum())
        if n_out:
            src = "the held-out real data" if training_range is None else "the training logs"
            outside.append(
                {
                    "channel": name,
                    "unit": unit,
                    "range": [_round(t_lo), _round(t_hi)],
                    "steps": n_out,
                    "share": round(n_out / lo_out.size, 6),
                    "text": (
                        f"{n_out} of {lo_out.size} checked steps ({n_out / lo_out.size:.1%}) have {name} outside the "
                        f"range of {src} [{t_lo:.4g}, {t_hi:.4g}]{_unit(unit)}: the model extrapolates there"
                    ),
                }
            )
    regimes.sort(key=lambda r: r["p_value"] if r["p_value"] is not None else 1.0)
    outside.sort(key=lambda r: -r["share"])
    return {
        "channels": channels,
        "regimes": regimes,
        "not_competent": not_competent,
        "outside_training_range": outside,
        "alpha_per_test": a_test,
        "method": (
            "per control channel, quantile bins of held-out real values; checked vs real blocks' mean "
            "open-loop z^2 in the bin (one-sided Mann-Whitney, clustered by episode, Bonferroni over "
            "channels x bins); effect = median of checked - predicted observation, episode-bootstrap 95% interval"
        ),
    }


def _effect(checked_err, real_err, cin, rin, obs_names, units, reps, rng, groups=None) -> dict:
    """Per observation channel: median checked error in the mask, its bootstrap 95% interval (whole
    episodes when `groups` labels the blocks), and the model's own median error on the real steps
    in the matching mask."""
    return {
        obs: {
            "checked_median_error": _round(_median_err(checked_err[..., d], cin)),
            "ci": [_round(v) for v in _bootstrap_ci(checked_err[..., d], cin, reps, rng, groups)],
            "real_median_error": _round(_median_err(real_err[..., d], rin)),
            "unit": units.get(obs, ""),
        }
        for d, obs in enumerate(obs_names)
    }


def _material(e: dict) -> bool:
    med, ci, ref = e["checked_median_error"], e["ci"], e["real_median_error"]
    if med is None or None in ci:
        return False
    return (ci[0] > 0 or ci[1] < 0) and abs(med) > abs(ref or 0.0)


def _runs(bins: list[dict], hit) -> list[list[int]]:
    """Index runs of adjacent bins for which hit(bin) holds."""
    out, run = [], []
    for j, b in enumerate(bins):
        if hit(b):
            run.append(j)
        elif run:
            out.append(run)
            run = []
    return out + ([run] if run else [])


def _describe_not_competent(name: str, unit: str, run: list[dict]) -> dict:
    lo, hi = run[0]["range"][0], run[-1]["range"][1]
    steps = sum(b["checked_steps"] for b in run)
    share = sum(b["outside_competence_share"] * b["checked_steps"] for b in run) / max(steps, 1)
    return {
        "channel": name,
        "unit": unit,
        "range": [lo, hi],
        "share": round(share, 4),
        "text": f"{name} {lo:.4g}-{hi:.4g}{_unit(unit)}: {share:.0%} of {steps} checked steps lie outside the model's "
        f"competence (unverifiable there)",
    }


def _describe(name: str, unit: str, run: list[dict], effect: dict) -> dict:
    lo, hi = run[0]["range"][0], run[-1]["range"][1]
    best = min(run, key=lambda b: b["p_value"])
    # The sentence names the (at most 3) observation channels with the clearest material errors.
    material = [o for o, e in effect.items() if _material(e)]
    material.sort(
        key=lambda o: -abs(effect[o]["checked_median_error"]) / max(effect[o]["ci"][1] - effect[o]["ci"][0], 1e-12)
    )
    parts = []
    for obs in material[:3]:
        e = effect[obs]
        med, ci, ref, u = e["checked_median_error"], e["ci"], e["real_median_error"], _unit(e["unit"])
        parts.append(
            f"{obs} {abs(med):.3g}{u} {'above' if med > 0 else 'below'} what the model predicts for reality "
            f"(median; 95% CI {ci[0]:.3g} to {ci[1]:.3g}{u}; the model's own median error on held-out real "
            f"data there: {ref:.2g}{u})"
        )
    if len(material) > 3:
        parts.append(f"and {len(material) - 3} more observation channel(s)")
    shown = material[:3]
    per_bin = ", ".join(
        f"{b['range'][0]:.3g}-{b['range'][1]:.3g}: "
        + "/".join(
            f"{b['effect'][o]['checked_median_error']:.3g}"
            for o in shown
            if b["effect"][o]["checked_median_error"] is not None
        )
        for b in run
    )
    steps = sum(b["checked_steps"] for b in run)
    return {
        "channel": name,
        "unit": unit,
        "range": [lo, hi],
        "steps": steps,
        "blocks": sum(b["checked_blocks"] for b in run),
        "p_value": best["p_value"],
        "effect": effect,
        "bin_medians": per_bin,
        "text": f"{name} {lo:.4g}-{hi:.4g}{_unit(unit)}: "
        + "; ".join(parts)
        + f" [{steps} checked steps; strongest bin p = {best['p_value']:.2g}; median error per bin "
        f"({'/'.join(shown)}) {per_bin}]",
    }


def _unit(u: str) -> str:
    return f" {u}" if u else ""


def _round(x, digits: int = 5):
    if x is None:
        return None
    x = float(x)
    if not np.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")
