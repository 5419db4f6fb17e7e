"""Calibrated predictive spread: one conformal scale per horizon step and channel.

Owns the rule that turns the world model's sampled open-loop spread into an interval that covers
what it says. The model's spread (the std of its latent rollouts) is learnt from posterior
residuals while open loop runs on prior states, so its nominal 90 % interval under-covers
(0.75 on HalfCheetah). On held-out real windows we measure

  r[b, h, d] = |truth - predicted mean| / predicted std        (B, H, D)

and set scale[h, d] to the `level` quantile of r pooled over the windows and the horizon steps
within `pool` steps of h, divided by the standard normal's quantile, so the interval

  predicted mean +- z_{(1+level)/2} * scale[h, d] * predicted std

covers `level` of held-out truth at every step and channel (split conformal; the pooling over
neighbouring steps trades a little locality for a quantile from several times more values).
Standardised errors divide by scale as well: z_cal = z / scale. `wmcheck train` reports the
coverage this buys on windows the scale was not fitted on (`cross_fitted_coverage`); calibration
fits the scale on its held-out real blocks and every check scores with it.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

LEVEL = 0.9
"""The interval's nominal coverage."""
Z_LEVEL = NormalDist().inv_cdf((1 + LEVEL) / 2)
"""The standardised error at the interval's edge (1.645): |z_cal| > Z_LEVEL lies outside it."""


def fit_spread_scale(r: np.ndarray, level: float = LEVEL, pool: int = 2) -> np.ndarray:
    """r (B, H, D) absolute standardised errors -> scale (H, D) (>= 1e-3; NaN-free)."""
    r = np.abs(np.asarray(r, np.float64))
    B, H, D = r.shape
    if B == 0:
        return np.ones((H, D))
    zq = NormalDist().inv_cdf((1 + level) / 2)
    scale = np.ones((H, D))
    for h in range(H):
        lo, hi = max(0, h - pool), min(H, h + pool + 1)
        pooled = r[:, lo:hi].reshape(-1, D)  # (B * steps, D)
        # the finite-sample conformal quantile: the ceil((n + 1) level)-th smallest value
        n = pooled.shape[0]
        k = min(n - 1, int(np.ceil((n + 1) * level)) - 1)
        scale[h] = np.sort(pooled, 0)[k] / zq
    return np.maximum(np.nan_to_num(scale, nan=1.0), 1e-3)


def left_out_scales(r: np.ndarray, groups: np.ndarray, level: float = LEVEL, pool: int = 2) -> np.ndarray:
    """(B, H, D) the scale of every window fitted on the windows of the *other* groups (episodes).

    The held-out real windows are the reference every check and monitor look compares new data
    with, and the scale is fitted on them: scored with it, their exceedances are in-sample (a
    quantile sits on its own values, Monte Carlo draws included), so they look better than any
    new real episode scored with the same scale, and faithful data drifts. Scored with the scale
    fitted without their own episode they stand where a new episode stands. With one group the
    one scale is all there is."""
    r = np.abs(np.asarray(r, np.float64))
    groups = np.asarray(groups)
    ids = np.unique(groups)
    out = np.empty(r.shape)
    if len(ids) < 2:
        out[:] = fit_spread_scale(r, level, pool)
        return out
    for g in ids:
        m = groups == g
        out[m] = fit_spread_scale(r[~m], level, pool)
    return out


def interval_covered(r: np.ndarray, scale: np.ndarray | None = None, level: float = LEVEL) -> np.ndarray:
    """Whether each truth lies in the (scaled) central interval: r (B, H, D) -> bool (B, H, D)."""
    zq = NormalDist().inv_cdf((1 + level) / 2)
    s = np.ones(r.shape[1:]) if scale is None else scale[: r.shape[1]]
    return np.abs(r) <= zq * s


def cross_fitted_coverage(r: np.ndarray, groups: np.ndarray, level: float = LEVEL, pool: int = 2) -> np.ndarray:
    """Coverage per horizon step (H,) of the calibrated interval on windows it was not fitted on
    (`cross_fitted_inside` with halves by sorted group id, averaged over windows and channels).
    NaN when fewer than 2 groups."""
    inside = cross_fitted_inside(r, groups, level, pool)
    return np.full(r.shape[1], np.nan) if inside is None else inside.mean((0, 2))


def cross_fitted_inside(
    r: np.ndarray, groups: np.ndarray, level: float = LEVEL, pool: int = 2, first_half: np.ndarray | None = None
) -> np.ndarray | None:
    """Whether each truth (B, H, D) lies in the calibrated interval fitted without its episode:
    the groups (episodes) are split in two halves; each half is scored with the scale fitted on
    the other. `first_half` (B,) bool names the windows of one half (whole groups, e.g. halves
    stratified by fold); by default the first half of the sorted group ids. None when a half is
    empty (fewer than 2 groups)."""
    if first_half is None:
        ids = np.unique(groups)
        first_half = np.isin(groups, ids[: len(ids) // 2])
    half = np.asarray(first_half, bool)
    if half.all() or not half.any():
        return None
    inside = np.zeros(r.shape, bool)
    for fit, score in ((half, ~half), (~half, half)):
        inside[score] = interval_covered(r[score], fit_spread_scale(r[fit], level, pool), level)
    return inside
