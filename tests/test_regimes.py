"""Regime analysis: it must flag the operating range where the checked data diverge, with the right
sign and size, and flag nothing when checked and real data come from the same process."""

from __future__ import annotations

import numpy as np

from wmcheck.checks.regimes import find_regimes

H = 48


def blocks(n, rng, shift=0.0, lo=None, hi=None):
    """n blocks of H steps: a slowly varying control u in [0, 20] (like a wind speed) and a
    standardised error z ~ N(0, 1) (+ `shift` where lo <= u < hi); error in kW = 50 * z."""
    start = rng.uniform(0, 20, (n, 1))
    u = np.clip(start + np.cumsum(rng.normal(0, 0.4, (n, H)), 1), 0, 20)  # (n, H)
    z = rng.normal(0, 1, (n, H))
    if shift:
        z = z + shift * ((u >= lo) & (u < hi))
    return z[..., None].astype(np.float32), (50.0 * z)[..., None], u[..., None]


def run(checked, real, competent=None, alpha=0.05, seed=0):
    cz, ce, cu = checked
    rz, re, ru = real
    comp = np.ones(len(cz), bool) if competent is None else competent
    return find_regimes(
        cz, ce, cu, comp, rz, re, ru, ["wind"], ["power"], {"wind": "m/s", "power": "kW"}, alpha, seed=seed
    )


def test_no_regime_is_flagged_when_checked_and_real_share_the_process():
    flagged = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        out = run(blocks(40, rng), blocks(40, rng), seed=seed)
        flagged += len(out["regimes"]) > 0
        assert out["not_competent"] == []
    assert flagged <= 1  # alpha = 0.05 per run, Bonferroni over the bins


def test_the_diverging_range_is_found_with_its_sign_and_size():
    rng = np.random.default_rng(1)
    out = run(blocks(60, rng, shift=-3.0, lo=12.0, hi=20.1), blocks(60, rng))
    assert out["regimes"], "a 3-sigma shift over 12-20 m/s must be flagged"
    for r in out["regimes"]:
        lo, hi = r["range"]
        assert hi > 12.0 and lo >= 9.0, r["text"]  # inside (or at the edge bin of) the shifted range
        med = r["effect"]["power"]["checked_median_error"]
        assert -200 < med < -80 and "below" in r["text"] and "m/s" in r["text"]  # -3 sigma x 50 kW = -150 kW
        assert abs(r["effect"]["power"]["real_median_error"]) < 30
    low_bins = [b for b in out["channels"][0]["bins"] if b["range"][1] <= 9.0]
    assert low_bins and not any(b["flagged"] for b in low_bins)


def test_outside_competence_and_outside_range_are_reported_not_tested():
    rng = np.random.default_rng(2)
    cz, ce, cu = blocks(40, rng, shift=5.0, lo=15.0, hi=20.1)
    competent = cu[:, :, 0].max(1) < 14.5  # every block reaching the diverging range is outside competence
    cu[:3] += 30.0  # three blocks far outside the real range
    out = run((cz, ce, cu), blocks(40, rng), competent=competent)
    assert out["regimes"] == []  # the divergence lies only where the model abstains
    assert any(r["range"][1] > 14.0 and r["share"] > 0.5 for r in out["not_competent"])
    (outside,) = out["outside_training_range"]
    assert outside["steps"] == 144 and "144 of 1920 checked steps (7.5%) have wind outside" in outside["text"]


def test_the_vectorised_bootstrap_interval_is_the_concatenating_loop():
    """_bootstrap_ci draws whole episodes and takes the median of their values per resample; the
    vectorised weighted median must give the loop's numbers (same draws, same medians)."""
    from wmcheck.checks.regimes import _bootstrap_ci

    def loop(err, in_bin, reps, rng, groups):
        rows = np.flatnonzero(in_bin.any(1))
        units = [rows[groups[rows] == g] for g in np.unique(groups[rows])]
        meds = []
        for _ in range(reps):
            pick = np.concatenate([units[i] for i in rng.integers(0, len(units), len(units))])
            meds.append(np.median(err[pick][in_bin[pick]]))
        return [float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))]

    rng = np.random.default_rng(0)
    for trial in range(5):
        err = rng.normal(size=(30, 12))
        in_bin = rng.random((30, 12)) < 0.3
        groups = rng.integers(0, 7, 30)
        got = _bootstrap_ci(err, in_bin, 200, np.random.default_rng(trial), groups)
        want = loop(err, in_bin, 200, np.random.default_rng(trial), groups)
        assert np.allclose(got, want), (trial, got, want)
