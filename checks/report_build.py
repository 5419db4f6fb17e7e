"""The report of a check: evidence (evidence.py) and its decision (decision.py) in words and JSON.

Owns the `report.json` content that is not a raw figure: one row per gap (verdict from the
decision, evidence, estimate, interval, explanation), the episode entries, the summary message,
and what to do next per gap. Nothing here decides: every verdict is read from the `Decision`.
"""

from __future__ import annotations

import math

import numpy as np

from wmcheck.checks.config import COMPETENCE, DYNAMICS_GAPS, SCORES
from wmcheck.checks.decision import Decision, Levels
from wmcheck.checks.endings import EXPECTED
from wmcheck.checks.evidence import CheckEvidence, DistributionEvidence, EpisodeEvidence, GapEvidence
from wmcheck.checks.policy_match import PolicyShift

NEXT_STEPS = {
    "latency": "add the estimated action delay to the simulator's control loop (or model the measured loop timing) and re-check",
    "actuator": "calibrate the simulated actuator: apply the estimated gain / offset / deadband to the commands, then re-check",
    "sensor_noise": "match the simulated sensor model to the real residuals: noise level, bias, drift; re-check",
    "dynamics": "revisit the simulator's physics (friction, damping, mass, contact, efficiency or power curves) on the "
    "channels, operating regimes and horizons listed: the open-loop bias says where the simulator sits above or below "
    "reality and by how much; system-identify those parameters from the real logs",
    "distribution": "collect real logs in the states the checked episodes visit, or restrict the task / initial-state "
    "distribution to what the logs cover",
    "ending": "compare the simulator's termination conditions (limits, safety cut-offs, failure thresholds) with the "
    "real system's: its episodes end where reality's do not, or run on where reality stops. Where a controller runs "
    "in the loop, a latency, actuator, sensor-noise or dynamics difference also makes it fail sooner: to tell these "
    "apart, check "
    "episodes that run long enough for blocks (a lower-gain or safer policy in the simulator, shorter episodes cut "
    "before the failure)",
    "visual": "match the simulator's rendering to the camera (lighting, exposure, colour, textures, blur, noise) as the "
    "photometric statistics say, or widen visual domain randomisation over them; re-check",
}


def r4(x) -> float | None:
    """Four significant digits; None for None, NaN and infinities (JSON has none of them)."""
    return None if x is None or not math.isfinite(float(x)) else float(f"{x:.4g}")


def rlist(a) -> list:
    return [float(f"{v:.4g}") for v in np.asarray(a, float).ravel()]


def _row(g: GapEvidence, verdict: str, estimate, ci, explanation: str, **extra) -> dict:
    out = {
        "verdict": verdict,
        "evidence": None if g.evidence is None else round(float(g.evidence), 3),
        "estimate": estimate,
        "ci": ci,
        "explanation": explanation,
    }
    out.update(extra)
    return out


def _fit_test_words(d) -> str:
    """How the corrections' score test (sysid.py) decided, in one clause."""
    t = d.test
    worst = int(np.argmax(np.abs(t.t))) if len(t.t) else 0
    null = (
        "paired with each block's real twin, sign-flip null"
        if t.paired
        else "permutation null over episodes"
        if t.null != "bonferroni"
        else "Bonferroni over the parameters (too few episodes to permute)"
    )
    where = _param_words(d.params[worst], d.names) if len(t.t) else "none"
    return (
        f"the checked blocks' score of the {where} correction differs from the held-out real blocks' by Welch "
        f"t = {t.t[worst]:.3g} (|t| needed: {float(t.threshold[worst]):.3g}, {null}"
        + (f", p = {t.p_value:.3g}" if t.p_value is not None else "")
        + ")"
    )


def _param_words(p, names) -> str:
    from wmcheck.checks.sysid import describe

    return describe(p.kind, None if p.channel is None else names[p.channel])


def _estimate_words(e, dt=None) -> str:
    if e.param.kind == "delay":
        secs = f" ({e.value * dt * 1000:.0f} ms)" if dt else ""
        return f"delay {e.value:+.2f} steps{secs} [{e.interval[0]:+.2f}, {e.interval[1]:+.2f}]"
    return f"{e.param.kind} {e.value:.3g} on {e.channel} [{e.interval[0]:.3g}, {e.interval[1]:.3g}]" + (
        " (at the edge of what the model can judge)" if e.at_bound else ""
    )


def _fit_words(d) -> str:
    r = d.fit
    if r.fit is None:
        return ""
    words = (
        f"; the joint fit ({', '.join(_estimate_words(e, d.dt) for e in r.estimates)}; 95 % intervals) lowers the "
        f"objective by {r.fit.J0 - r.fit.J1:.3g} nats per step and channel in {r.evaluations} model evaluations"
    )
    if r.confounded:
        strongest = sorted(r.confounded, key=lambda x: -abs(x[2]))[:4]  # every pair is in the estimate's JSON
        words += (
            "; confounded (they mimic each other): "
            + ", ".join(f"{a} and {b} (correlation {c:+.2f})" for a, b, c in strongest)
            + (f" and {len(r.confounded) - 4} more pairs" if len(r.confounded) > 4 else "")
        )
    if not r.curvature_ok:
        words += "; the fit is not at a clear minimum, so its intervals are approximate"
    return words


def _estimate_json(e) -> dict:
    return {"estimate": r4(e.value), "ci95": [r4(e.interval[0]), r4(e.interval[1])], "score_t": r4(e.t)}


def _support_words(d) -> str:
    """When the score test fires but the fit does not support the row (sysid.py, "Decision")."""
    if d.fit_support is None or d.fit_support >= 1.0:
        return ""
    return (
        f"; the score test fires, but the fitted {'delay' if d.gap == 'latency' else 'actuator corrections'} do not "
        f"exclude the identity at 95 % (joint Wald test: {d.fit_support:.2f} of its critical value), so the "
        f"difference is not attributed to {d.gap}"
    )


def latency_fit_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    best = d.best() if g.fires else None
    steps = None if best is None else round(best.value, 2)
    direction = (
        "none"
        if steps is None or steps == 0
        else f"the simulator lacks ~{steps:.2g} step(s) of latency (responds earlier than reality)"
        if steps > 0
        else f"the simulator has ~{-steps:.2g} step(s) too much latency (responds later than reality)"
    )
    return _row(
        g,
        verdict,
        {
            "steps": steps,
            "seconds": (steps * d.dt if d.dt and steps is not None else None),
            "direction": direction,
            "method": "fit",
            "score_t": r4(d.test.t[0]) if len(d.test.t) else None,
            "fitted_with": [_param_words(e.param, d.names) for e in d.fit.estimates if e.param.kind != "delay"],
        },
        None if best is None else [r4(best.interval[0]), r4(best.interval[1])],
        _fit_test_words(d) + _fit_words(d) + _support_words(d) + _sub_step_words(g, steps),
    )


def _sub_step_words(g: GapEvidence, steps: float | None) -> str:
    if not g.confounded_with or steps is None:
        return ""
    return (
        f"; the fitted delay ({steps:+.2f} steps) rounds to zero steps: a fraction of a step mixes each command "
        "with its neighbour, a filter of the commands that a slower response (damping, inertia, actuator "
        f"bandwidth) gives as well, so the difference is listed with {', '.join(g.confounded_with)} rather than "
        "named latency; the residual and bias tests judge the data with the delay corrected, so the dynamics row "
        "fires only on what the delay does not explain"
    )


def actuator_fit_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    best = d.best() if g.fires else None
    per_channel: dict[str, dict] = {}
    for e in d.estimates():
        per_channel.setdefault(e.channel, {})[e.param.kind] = _estimate_json(e)
    t_per = {}
    for p, t, sig in zip(d.params, d.test.t, d.test.significant):
        where = "every channel" if p.channel is None else d.names[p.channel]  # sysid.COMMON_GAIN
        t_per.setdefault(where, {})[p.kind] = {"score_t": r4(t), "significant": bool(sig)}
    estimate = {
        "channel": None if best is None else best.channel,
        "kind": None if best is None else best.param.kind,
        "value": None if best is None else r4(best.value),
        "method": "fit",
        "per_channel": per_channel,
        "scores": t_per,
        "judgeable": d.box,
        "untested": [_param_words(p, d.names) for p in d.untestable],
        "confounded": [{"a": a, "b": b, "correlation": r4(c)} for a, b, c in d.fit.confounded],
    }
    untested = (
        "; not tested, because every such correction moves commands outside the training logs' range: "
        + ", ".join(estimate["untested"])
        if d.untestable
        else ""
    )
    return _row(
        g,
        verdict,
        estimate,
        None if best is None else [r4(best.interval[0]), r4(best.interval[1])],
        _fit_test_words(d) + _fit_words(d) + _support_words(d) + untested + _bandwidth_words(g),
    )


def _bandwidth_words(g: GapEvidence) -> str:
    """Why an actuator finding is listed with dynamics (gap_tests.common_gain_only: one gain on every
    channel is all that is significant; gap_tests.bandwidth_lookalike: its identified gains all lie
    on one side of 1, with a sub-step delay)."""
    from wmcheck.checks.gap_tests import common_gain_only, identified_gains

    if not g.confounded_with or not g.fires:
        return ""
    if common_gain_only(g.detail):
        return (
            "; only the test of one gain on every channel is significant: a response weaker or stronger on every "
            "channel at once is what a plant with other damping or inertia gives as well, so the difference is "
            f"listed with {', '.join(g.confounded_with)} rather than named actuator"
        )
    gains = identified_gains(g.detail.estimates())
    if not gains:
        return ""
    way, late = ("weaker", "later") if gains[0].value < 1.0 else ("stronger", "earlier")
    return (
        f"; the {way} gains come with a fitted delay of a fraction of a step ({late} than reality): a response "
        f"both {late} and {way} than the model's is what a plant with other damping or inertia gives (another "
        "bandwidth, which a command transform imitates only by a phase shift and a steady gain together), so the "
        f"difference is listed with {', '.join(g.confounded_with)} rather than named actuator"
    )


def latency_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    if hasattr(d, "fit"):  # gap_tests.FitDetail: the corrections' fit (sysid.py)
        return latency_fit_row(g, verdict)
    direction = (
        f"the simulator lacks ~{d.steps} step(s) of latency (responds earlier than reality)"
        if d.steps > 0
        else f"the simulator has ~{-d.steps} step(s) too much latency (responds later than reality)"
        if d.steps < 0
        else "none"
    )
    return _row(
        g,
        verdict,
        {"steps": d.steps, "seconds": (d.steps * d.dt if d.dt else None), "direction": direction},
        list(d.interval),
        f"shifting the checked commands by {d.best_shift} step(s) lowers the one-step NLL by {d.improvement:.3g} "
        f"(paired t = {d.statistic:.3g}; the same search on real blocks stays below {d.threshold:.3g}); the checked NLL "
        f"curve over delays is the real blocks' curve shifted by {d.steps} step(s)",
        curve={
            "delays": d.delays.tolist(),
            "mean_log_score": rlist(d.curve),
            "real_mean_log_score": rlist(d.real_curve),
        },
    )


def actuator_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    if hasattr(d, "fit"):  # gap_tests.FitDetail
        return actuator_fit_row(g, verdict)
    b = d.best
    per_channel: dict[str, dict] = {}
    for c in d.searches:
        per_channel.setdefault(c.channel, {})[c.kind] = {
            "estimate": c.value,
            "ci": list(c.interval),
            "evidence": round(c.evidence, 3),
        }
    caution = (
        f"; caution: {d.extrapolated_share:.0%} of the corrected {b.channel} commands lie outside the training logs' "
        f"range, where the model extrapolates"
        if d.extrapolated_share > d.competence_alpha
        else ""
    )
    if d.untested:
        caution += (
            "; not tested, because they would move commands outside the training logs' range where the model "
            "cannot judge them: "
            + "; ".join(
                f"{k} {', '.join(f'{v:.3g}' for v in vs)} on {ch}"
                for ch, kinds in d.untested.items()
                for k, vs in kinds.items()
            )
        )
    estimate = {
        "channel": b.channel,
        "kind": b.kind,
        "value": b.value,
        "per_channel": per_channel,
        "extrapolated_share": round(d.extrapolated_share, 4),
        "untested": d.untested,
    }
    return _row(
        g,
        verdict,
        estimate,
        list(b.interval),
        f"{b.kind} {b.value:.3g} on {b.channel} lowers the predictive log-score by {b.improvement:.3g} "
        f"(paired t = {b.statistic:.3g}; real blocks stay below {b.threshold:.3g}){caution}",
    )


def sensor_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    s, names, std = d.stats, d.names, d.std
    w = int(np.argmax(s.sensor_per_channel))
    coloured = [names[i] for i in np.flatnonzero(s.coloured)]
    per_channel = {
        names[i]: {
            "noise_ratio": float(s.ratio[i]),
            "noise_ratio_ci": [float(s.ratio_lo[i]), float(s.ratio_hi[i])],
            "bias": float(s.bias[i] * std[i]),
            "residual_ac1": float(d.ac1_checked[i]),
            "real_residual_ac1": float(d.ac1_real[i]),
            "evidence": round(float(s.sensor_per_channel[i]), 3),
        }
        for i in range(len(names))
    }
    ac_c, ac_r = d.ac1_checked[w], d.ac1_real[w]
    text = (
        f"one-step residuals of {names[w]}: noise level {s.ratio[w]:.2f}x reality's, bias {s.bias[w] * std[w]:.3g}; lag-1 "
        f"autocorrelation {ac_c:.2f} (real {ac_r:.2f}: {'whiter' if ac_c < ac_r else 'more coloured'} than reality)"
    )
    if coloured:
        text += (
            f"; not counted on {', '.join(coloured)}, whose larger residuals are more coloured than reality's "
            f"(dynamics, not sensor noise)"
        )
    sm = d.smoothness
    smooth = None
    if sm is not None:
        smooth = {
            "kl_ratio": round(sm.kl_ratio, 4),
            "nll_difference": round(sm.nll_difference, 4),
            "z": {k: round(v, 3) for k, v in sm.z.items()},
            "evidence": round(sm.evidence, 3),
        }
        lead = sm.evidence >= 1 and sm.evidence >= s.sensor_evidence
        part = (
            f"surprise against reality's: KL(post || prior) {sm.kl_ratio:.2f}x the real episodes' "
            f"(episode geometric means {sm.kl_geo_ratio:.2f}x, 95 % CI {sm.kl_geo_ratio_ci[0]:.2f}-"
            f"{sm.kl_geo_ratio_ci[1]:.2f}), one-step NLL {sm.nll_difference:+.3g} nats (smoothness z = {min(sm.z.values()):.2f}; smoother than reality "
            f"below -{sm.critical:.2f})"
        )
        if lead:
            text = "the simulator is smoother than reality (missing sensor or process noise): " + part + "; " + text
        else:
            text += "; " + part
    return _row(
        g,
        verdict,
        {
            "channel": names[w],
            "noise_ratio": float(s.ratio[w]),
            "bias": float(s.bias[w] * std[w]),
            "per_channel": per_channel,
            "smoothness": smooth,
        },
        [float(s.ratio_lo[w]), float(s.ratio_hi[w])],
        text,
    )


def _unit(units: dict, name: str) -> str:
    u = units.get(name) or ""
    return f" {u}" if u else ""


def _finite_min(a: np.ndarray) -> float | None:
    a = np.asarray(a, float)
    a = a[np.isfinite(a)]
    return r4(float(a.min())) if len(a) else None


def bias_cells_report(b) -> list[dict]:
    """The open-loop bias per cell (gap_tests.BiasDetail): every channel's overall cell and every
    significant response and regime cell, strongest first. Overall and regime cells in physical
    units; a response cell is a difference of slopes (bias.response_slopes) and its factor 1 + that
    difference: how far the checked system follows the model's predicted swings, reality's = 1."""
    t, ci = b.test, b.test.interval()
    out = []
    for c, cell in enumerate(b.cells):
        kind = getattr(cell, "kind", "overall")
        if kind != "overall" and not t.significant[c]:
            continue
        if kind == "response":
            d, lo, hi = (float(v) for v in (t.difference[c], ci[c, 0], ci[c, 1]))
            out.append(
                {
                    "channel": b.obs_names[cell.channel],
                    "kind": "response",
                    "where": None,
                    "difference": r4(d),
                    "ci95": [r4(lo), r4(hi)],
                    "response_factor": r4(1.0 + d),
                    "response_factor_ci95": [r4(1.0 + lo), r4(1.0 + hi)],
                    "t": r4(float(t.t[c])),
                    "significant": bool(t.significant[c]),
                }
            )
            continue
        sd = float(b.obs_std[cell.channel])
        diff, lo, hi = (float(v) * sd for v in (t.difference[c], ci[c, 0], ci[c, 1]))
        level = float(b.level[c])
        rel_ok = np.isfinite(level) and abs(level) >= 0.1 * sd  # a level near zero makes % meaningless
        where = None
        if cell.control is not None:
            k = cell.control
            where = {
                "control": b.control_names[k],
                "range": [
                    r4(cell.lo * b.control_std[k] + b.control_mean[k]),
                    r4(cell.hi * b.control_std[k] + b.control_mean[k]),
                ],
            }
        out.append(
            {
                "channel": b.obs_names[cell.channel],
                "kind": kind,
                "where": where,
                "difference": r4(diff),
                "ci95": [r4(lo), r4(hi)],
                "relative": r4(diff / abs(level)) if rel_ok else None,
                "relative_ci95": [r4(lo / abs(level)), r4(hi / abs(level))] if rel_ok else None,
                "predicted_level": r4(level),
                "t": r4(float(t.t[c])),
                "significant": bool(t.significant[c]),
            }
        )
    out.sort(key=lambda e: (not e["significant"], -abs(e["t"] or 0.0)))
    return out


def bias_sentence(b, cells: list[dict], fires: bool) -> str:
    """The open-loop bias in words: where the checked data sit above or below reality."""
    t = b.test
    sig = [c for c in cells if c["significant"]]
    kinds = [getattr(c, "kind", "overall") for c in b.cells]
    families = ", ".join(f"{kinds.count(k)} {k}" for k in ("overall", "response", "regime") if kinds.count(k))
    null = {
        "permutation": f"max |t| per family of cells ({families}), min-p over the families, null by permuting "
        f"{t.checked_episodes} checked and {t.real_episodes} real episodes",
        "sign-flip": f"each block against the real block whose logged inputs it replays; max |t| per family "
        f"of cells ({families}), min-p over the families, null by flipping the signs of {t.checked_episodes} episodes",
    }.get(
        t.null,
        f"{'paired' if t.paired else 'Welch'} t per cell, Bonferroni over {len(b.cells)} cells: "
        f"{t.checked_episodes} checked and {t.real_episodes} real episodes are too few for a resampled null "
        f"at this level, so a cell needs |t| >= {_finite_min(t.threshold) or float('inf'):.3g}; more held-out "
        "real episodes (wmcheck calibrate --real) or more checked ones give the test power",
    )
    if not sig:
        return f"open-loop bias: none significant (evidence {t.evidence:.2f}; {null})"
    parts = []
    for c in sig[:4]:
        if c["kind"] == "response":
            lo, hi = c["response_factor_ci95"]
            parts.append(
                f"{c['channel']} follows the model's predicted swings {c['response_factor']:.2f}x as far as "
                f"reality does (95 % CI {lo:.2f}-{hi:.2f}x; "
                + ("a more damped or sluggish system" if c["difference"] < 0 else "a livelier, less damped system")
                + ")"
            )
            continue
        u = _unit(b.units, c["channel"])
        side = "above" if c["difference"] > 0 else "below"
        text = f"{c['channel']} {abs(c['difference']):.3g}{u} {side} reality (95 % CI {c['ci95'][0]:+.3g} to {c['ci95'][1]:+.3g}{u}"
        if c["relative"] is not None:
            text += f"; {c['relative']:+.0%} of the predicted {c['predicted_level']:.3g}{u}"
        text += ")"
        w = c["where"]
        if w is None:
            text += " over all imagined steps"
        else:
            text += f" at {w['control']} {w['range'][0]:.3g} to {w['range'][1]:.3g}{_unit(b.units, w['control'])}"
        parts.append(text)
    more = f" (and {len(sig) - 4} more cells)" if len(sig) > 4 else ""
    lead = "open-loop bias, two-sided" + (": " if fires else " (below dynamics' level): ")
    return lead + "; ".join(parts) + more + f" [{null}]"


def dynamics_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    s, names = d.stats, d.names
    w = int(np.argmax(s.dynamics_per_channel))
    H = len(d.per_horizon_ratio)
    q = max(1, H // 4)
    ac_c, ac_r = d.ac1_checked[w], d.ac1_real[w]
    colour_fires = s.dynamics_evidence >= 1.0
    text = (
        f"after {', '.join(d.applied) or 'no correction'}, one-step residuals of {names[w]} are {s.ratio[w]:.2f}x "
        f"reality's and {'more' if ac_c > ac_r else 'less'} coloured (lag-1 autocorrelation {ac_c:.2f} vs real {ac_r:.2f})"
        + (
            ": an error that persists from step to step is physics, not sensor noise"
            if colour_fires
            else ": not both significantly"
        )
        + f"; open-loop error vs reality's: x{d.per_horizon_ratio[:q].mean():.2g} over horizon steps 1-{q}, "
        f"x{d.per_horizon_ratio[H // 2 :].mean():.2g} over {H // 2 + 1}-{H}"
    )
    bias = None
    if d.bias is not None:
        cells = bias_cells_report(d.bias)
        bias_fires = d.bias.test.evidence >= 1.0
        sentence = bias_sentence(d.bias, cells, bias_fires)
        text = (sentence + "; " + text) if bias_fires else (text + "; " + sentence)
        bias = {
            "evidence": r4(d.bias.test.evidence),
            "null": d.bias.test.null,
            "paired": d.bias.test.paired,
            "p_value": r4(d.bias.test.p_value),
            "threshold": _finite_min(d.bias.test.threshold),
            "cells": cells,
        }
    estimate = {
        "channel": names[w],
        "residual_ratio": float(s.ratio[w]),
        "residual_ac1": float(ac_c),
        "real_residual_ac1": float(ac_r),
        "per_channel_ratio": {names[i]: round(float(d.per_channel_ratio[i]), 3) for i in range(len(names))},
        "after_corrections": list(d.applied),
        "per_horizon_ratio": rlist(d.per_horizon_ratio),
        "colour_evidence": r4(s.dynamics_evidence),
        "bias": bias,
    }
    return _row(g, verdict, estimate, None, text)


def ending_row(g: GapEvidence, verdict: str) -> dict:
    d = g.detail
    parts = []
    if d.count_p is not None:
        parts.append(
            f"{d.checked_terminated} of {d.checked_episodes} checked episodes terminate "
            f"({d.checked_rate:.0%}{f', after {d.checked_steps:.0f} steps on average' if d.checked_steps else ''}); "
            f"{d.real_terminated} of {d.real_episodes} real episodes do ({d.real_rate:.0%}"
            f"{f', after {d.real_steps:.0f} steps' if d.real_steps else ''}); Fisher's exact test, episodes as the "
            f"units: p = {d.count_p:.3g}"
            + (f"; {d.not_judged} episode(s) ending outside the real logs' range not judged" if d.not_judged else "")
            + expected_words(d)
        )
    if d.run_on is not None:
        parts.append(run_on_words(d.run_on))
    text = "; ".join(parts)
    r = d.run_on
    estimate = {
        "checked_termination_rate": round(d.checked_rate, 4),
        "real_termination_rate": round(d.real_rate, 4),
        "checked_terminated": d.checked_terminated,
        "checked_episodes": d.checked_episodes,
        "real_terminated": d.real_terminated,
        "real_episodes": d.real_episodes,
        "p_value": r4(d.p_value),
        "count_p_value": r4(d.count_p) if d.count_p is not None else None,
        "checked_mean_length": round(d.checked_length, 1),
        "not_judged": d.not_judged,
        "checked_probed_terminations": d.checked_probed,
        "checked_expected_terminations": d.checked_expected,
        "real_expected_terminations": d.real_expected,
        "real_probed_terminations": d.real_probed,
        "expected_p_value": r4(d.expected_p) if d.expected_p is not None else None,
        "checked_end_probability_median": r4(d.checked_end_probability),
        "real_end_probability_median": r4(d.real_end_probability),
        "ends_where_reality_ends": d.upstream,
        "run_on": None
        if r is None
        else {
            "checked_probed": r.checked_probed,
            "checked_with_expected_end": len(r.checked),
            "checked_steps_run_on": r.checked,
            "real_probed": r.real_probed,
            "real_with_expected_end": len(r.real),
            "real_steps_run_on": r.real,
            "p_value": r4(r.p_value),
            "level": r4(r.level),
            "runs_on": r.fires,
        },
        "power": None if d.power is None else ending_power_estimate(d.power),
    }
    return _row(g, verdict, estimate, None, text)


def ending_power_estimate(pw) -> dict:
    """The ending row's best case (endings.EndingPower) in the JSON."""
    return {
        "sooner_p_value": r4(pw.sooner_p) if pw.sooner_p is not None else None,
        "later_p_value": r4(pw.later_p) if pw.later_p is not None else None,
        "level": r4(pw.level),
        "judged_episodes": pw.judged,
        "episodes_needed": pw.episodes_needed,
        "detectable": pw.detectable,
        "blind": list(pw.blind),
    }


def ending_power_words(g: GapEvidence) -> str:
    """Why the ending row could not have fired in this check (R7), and what would let it."""
    pw = getattr(g.detail, "power", None)
    if not g.checked or pw is None:
        return f"the ending test could not run ({g.reason})"
    d = g.detail
    real = f"{d.real_terminated} of {d.real_episodes} real episodes terminate"
    where = "(ending inside the real logs' range)"
    ways = []
    for side in pw.blind:  # a blind side has a p (EndingPower.blind)
        p = pw.sooner_p if side == "sooner" else pw.later_p
        if not pw.judged and (side == "sooner" or not pw.run_on_checked):
            what = (
                "the count test judges no episode" if side == "sooner" else "no checked episode reaches an expected end"
            )
            ways.append(f"in the {side} direction: {what}")
        elif side == "sooner":
            ways.append(f"had {_all(pw.judged, 'judged checked episode')} {where} terminated (p = {p:.3g})")
        elif pw.judged:
            ways.append(f"had none of the {_n(pw.judged, 'judged checked episode')} {where} terminated (p = {p:.3g})")
        else:
            ways.append(
                f"had {_all(pw.run_on_checked, 'checked episode')} with an expected end run on longer than "
                f"every held-out real one (p = {p:.3g})"
            )
    need = (
        f"about {pw.episodes_needed} checked episodes ending inside the real logs' range would give the count test "
        "power both ways"
        if pw.episodes_needed is not None
        else "no number of checked episodes would against these real counts: more real episodes would"
    )
    return (
        f"the ending test could not have reached its level ({pw.level:.3g}) even "
        + " or ".join(ways)
        + f" ({real}); {need}"
    )


def _n(k: int, noun: str) -> str:
    """ "1 episode", "3 episodes"."""
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _all(k: int, noun: str) -> str:
    """ "the 1 episode", "all 3 episodes"."""
    return ("the " if k == 1 else "all ") + _n(k, noun)


def run_on_words(r) -> str:
    """The run-on test (endings.RunOn) in a clause of the ending row."""
    real = (
        f"held-out real: {len(r.real)} of {r.real_probed}, for a median of {r.real_median:.0f} steps (at most "
        f"{max(r.real)})"
    )
    if not r.checked:
        return (
            f"none of {r.checked_probed} checked episodes reaches a state where the world model expects reality to end "
            f"(end probability >= {EXPECTED:g}, inside the real logs' range); {real}"
        )
    return (
        f"{len(r.checked)} of {r.checked_probed} checked episodes go on past a state where the world model expects "
        f"reality to end (end probability >= {EXPECTED:g}, inside the real logs' range), for a median of "
        f"{r.checked_median:.0f} steps; {real}; one-sided Mann-Whitney test, episodes as the units: p = {r.p_value:.3g}"
    )


def expected_words(d) -> str:
    """Where the checked episodes terminate, whether the model expects reality to end there too
    (endings.py), in a clause of the ending row."""
    if d.checked_expected is None:
        return ""
    text = (
        f"; where they terminate, the world model expects reality to end too at {d.checked_expected} of "
        f"{d.checked_probed} (median end probability {d.checked_end_probability:.2f}"
    )
    if d.real_probed:
        text += (
            f"; held-out real terminations: {d.real_expected} of {d.real_probed}, median "
            f"{d.real_end_probability:.2f}; Fisher's exact test p = {d.expected_p:.3g}"
        )
    return text + ")"


def distribution_row(d: DistributionEvidence, verdict: str, policy: PolicyShift | None = None) -> dict:
    text = (
        f"{d.coverage:.0%} of checked steps lie inside the real data's support (latent distance within the 99% range of "
        f"held-out real steps); MMD two-sample test of the visited states, permuting whole episodes: p = {d.p_value:.3g}"
    )
    if d.min_coverage is not None:
        text += f"; the gate requires at least {d.min_coverage:.0%} coverage" + (
            " (not met)" if d.below_min_coverage else ""
        )
    if policy is not None:
        text += "; " + policy_sentence(policy)
    estimate = {
        "mmd2": round(d.mmd2, 5),
        "p_value": r4(d.p_value),
        "coverage": round(d.coverage, 4),
        "outside_competence_fraction": round(d.outside_competence_fraction, 4),
    }
    if policy is not None:
        estimate["policy_shift"] = {k: (r4(v) if isinstance(v, float) else v) for k, v in policy.to_dict().items()}
    return {
        "verdict": verdict,
        "evidence": round(float(d.alpha / max(d.p_value, 1e-12)), 3),
        "estimate": estimate,
        "ci": None,
        "explanation": text,
    }


def policy_sentence(p: PolicyShift) -> str:
    """What the policy-shift test (policy_match.py) found, in words, or what the team declared."""
    if p.declared != "auto":
        said = "another policy than the real logs'" if p.declared == "other" else "the real logs' own policy"
        tested = (
            f"the policy-shift test, for information: p = {p.p_value:.3g}, {p.effect:.2f} command std apart"
            if p.testable
            else f"the policy-shift test did not run ({p.reason})"
        )
        return (
            f"the team declares that the checked commands follow {said} (--checked-policy {p.declared}); {tested}"
            + ("; latency and actuator findings are confounded with the policy" if p.shifted else "")
        )
    caveat = (
        "; the real commands depend on the states (a closed loop), where this test cannot tell another "
        "controller from a simulator that differs under the logs' own, so the check takes the checked commands "
        "as another policy's: --checked-policy logs (the simulator ran the logs' controller) gives it its power, "
        "--checked-policy other confirms"
        if p.closed_loop
        else ""
    )
    if not p.testable:
        return f"whether the checked commands follow the real logs' policy was not tested ({p.reason}){caveat}"
    parts = (
        ""
        if math.isnan(p.joint_p)
        else f"; conditional test p = {p.conditional_p:.3g}, law of successive commands p = {p.joint_p:.3g}, "
        "twice the smaller"
    )
    if p.undetermined:
        return (
            f"the policy-shift test does not tell the checked commands from the real logs' policy (given the same "
            f"state, inputs and previous command: {p.effect:.2f} command std apart, p = {p.p_value:.3g}{parts}){caveat}"
        )
    if p.rejects:
        return (
            f"the checked commands follow another policy than the real logs' (given the same state, inputs and "
            f"previous command they differ by {p.effect:.2f} command std; episode permutation test p = {p.p_value:.3g}"
            f"{parts}): latency and actuator findings are confounded with the policy (closed-loop identification)"
            f"{caveat}"
        )
    return (
        f"the checked commands are consistent with the real logs' policy (given the same state, inputs and previous "
        f"command: {p.effect:.2f} command std apart, p = {p.p_value:.3g}{parts}){caveat}"
    )


def policy_clause(p: PolicyShift | None) -> str:
    """Why the decision takes the checked commands as another policy's (R4b, R4c), as a clause."""
    if p is not None and p.undetermined:
        return (
            "whether the checked commands follow the real logs' policy cannot be told (the real commands depend on "
            "the states, and on such a closed loop the policy-shift test cannot tell another controller from a "
            "simulator that differs under the logs' own)"
        )
    return "the checked commands follow another policy than the real logs'"


def undetermined_advice(p: PolicyShift | None) -> str:
    """What to do where the policy could not be told (`PolicyShift.undetermined`)."""
    if p is None or not p.undetermined:
        return ""
    return (
        " If the simulator ran the real logs' own controller, say so with --checked-policy logs: the check then "
        "judges these findings."
    )


def gap_rows(ev: CheckEvidence, dec: Decision, visual_row: dict) -> dict[str, dict]:
    """The report's `gaps`: every row's verdict is the decision's."""
    builders = {
        "latency": latency_row,
        "actuator": actuator_row,
        "sensor_noise": sensor_row,
        "dynamics": dynamics_row,
        "ending": ending_row,
    }
    rows = {"visual": dict(visual_row, verdict=dec.gaps["visual"])}
    for g, build in builders.items():
        e = ev.gaps[g]  # a test that could not run has no detail: its row says why
        rows[g] = build(e, dec.gaps[g]) if e.checked else _row(e, dec.gaps[g], None, None, e.reason)
    if ev.distribution is not None:
        rows["distribution"] = distribution_row(ev.distribution, dec.gaps["distribution"], ev.policy_shift)
    else:
        rows["distribution"] = {
            "verdict": "not_checked",
            "evidence": None,
            "estimate": None,
            "ci": None,
            "explanation": "no block of visited states to compare",
        }
    for g in dec.confounded:
        rows[g]["confounded_with"] = [o for o in dec.confounded if o != g]
    for g in dec.policy_confounded:  # R4b
        rows[g]["confounded_with_policy"] = True
        rows[g]["explanation"] += f"; not failing: {policy_clause(ev.policy_shift)}, and " + (
            "another controller makes a plant fail sooner, or keeps it from failing, as these episodes do"
            if g == "ending"
            else "under another closed-loop policy the model's own errors move this test as a gap would"
        )
    for g in DYNAMICS_GAPS:  # T1: a finding that the named gap gives as well (GapEvidence.explained_by)
        if g in ev.gaps and dec.top_gap in ev.gaps[g].explained_by and rows[g]["verdict"] in ("present", "tolerated"):
            rows[g]["explained_by"] = [dec.top_gap]
            rows[g]["explanation"] += "; " + explained_words(g, dec.top_gap)
    for g, row in rows.items():
        if row["verdict"] in ("present", "tolerated") and g in NEXT_STEPS:
            row["next_step"] = NEXT_STEPS[g]
            alike = ev.gaps[g].confounded_with if g in ev.gaps else ()
            if alike:  # the finding is what another gap type gives as well (decision.py, T1)
                row["next_step"] += "; or, as the evidence cannot tell them apart: " + "; ".join(
                    NEXT_STEPS[a] for a in alike
                )
    return rows


def _a(word: str) -> str:
    """The indefinite article before a gap's name: "an actuator gap", "a dynamics gap"."""
    return "an" if word[:1] in "aeiou" else "a"


def explained_words(g: str, by: str) -> str:
    """Why a firing row is reported but not named (gap_tests.SENSOR_LEVEL_EXPLAINED_BY, decision.py T1)."""
    return (
        f"{_a(by)} {by} gap changes the one-step residuals' level as well (a plant that moves less or more per step, "
        f"commands that act later or more strongly than the model expects), and the {by} row fires on evidence "
        f"that {g} does not give (a correction's score, an open-loop bias or coloured residuals), so {by} is named "
        "and this row is reported with it"
    )


def episode_entry(e: EpisodeEvidence, verdict: str, dt: float | None) -> dict:
    onset = e.onset_step if verdict == "divergent" else None
    return {
        "id": int(e.id),
        "name": e.name,
        "steps": int(e.steps),
        "blocks": int(e.blocks),
        "verdict": verdict,
        "score": round(float(e.score), 4),
        "divergence_onset_step": onset,
        "divergence_onset_seconds": (onset * dt if (onset is not None and dt) else None),
        "p_values": {k: r4(v) for k, v in {**e.divergence_p, **e.competence_p}.items()},
        "outside_competence_fraction": round(float(e.outside_competence_fraction), 4),
        "scores": {s: round(float(v), 4) for s, v in e.mean_scores.items() if s in SCORES + COMPETENCE},
    }


FAIL_WORDS = {
    "episodes": "{n_div} of {n_ep} episode(s) diverge from reality",
    "pooled": "the pooled test over all blocks finds the checked episodes worse than reality",
    "visual": "the checked camera frames differ from the real camera's (visual gap)",
    "ending": "the checked episodes end differently from reality's (ending gap)",
    "coverage": "only {coverage:.0%} of the checked steps lie inside the real logs' support, below the gate's minimum",
    "policy_gate": "the policy gate is not met",
}


def message(
    dec: Decision, ev: CheckEvidence, rows: dict, power: dict, levels: Levels, policy: dict | None = None
) -> str:
    """The summary paragraph: the verdict, why, and what a pass is worth."""
    n_ep = len(dec.episodes)
    n_div, n_unv = dec.count("divergent"), dec.count("unverifiable")
    cov = ev.distribution.coverage if ev.distribution is not None else 1.0
    parts = []
    if dec.verdict == "fail":
        if "policy_gate" in dec.failing and policy is not None:
            parts.append("FAIL: the policy gate is not met: " + "; ".join(policy["gate"]["reasons"]) + ".")
        said = [r for r in dec.failing if r != "policy_gate"]
        gaps = [r for r in said if r in DYNAMICS_GAPS]
        words = [FAIL_WORDS[r].format(n_div=n_div, n_ep=n_ep, coverage=cov) for r in said if r in FAIL_WORDS]
        if gaps:
            words.append(
                f"the gap tests find {', '.join(gaps)}"
                + (
                    ""
                    if {"episodes", "pooled"} & set(said)
                    else " (no single episode and not the pooled divergence test flags it: the gap is small but systematic)"
                )
            )
        if words:
            parts.append(("Consistency check: " if parts else "FAIL: ") + "; ".join(words) + ".")
        tolerated = [g for g, v in dec.gaps.items() if v == "tolerated"]
        if tolerated and {"episodes", "pooled"} & set(said):
            parts.append(
                f"The divergence remains after the corrections of the tolerated gap(s) ({', '.join(tolerated)})."
            )
    elif dec.verdict == "unverifiable":
        first = len(parts)

        def lead() -> str:  # the verdict heads the first of the reasons below
            return "UNVERIFIABLE: " if len(parts) == first else ""

        if n_unv:
            parts.append(
                f"UNVERIFIABLE: {n_unv} of {n_ep} episode(s) visit states where the model is not competent; this is not a pass."
            )
        if dec.shift_confounded:
            parts.append(
                lead()
                + f"the residual tests find {', '.join(dec.shift_confounded)}, but the checked episodes visit states in "
                f"other proportions than the real logs (distribution gap), and residuals differ between states anyway; "
                f"this is not a pass: collect real logs in the states the simulator visits."
            )
        if dec.divergence_confounded:
            found = " and ".join(
                {"episodes": f"{n_div} of {n_ep} episode(s) diverge", "pooled": "the pooled divergence test rejects"}[r]
                for r in dec.divergence_confounded
            )
            parts.append(
                lead() + f"{found}, but {policy_clause(ev.policy_shift)}: the divergence "
                "thresholds come from real episodes of the logs' policy, and the model's open-loop error depends on "
                "the commands and the states it is given as well as on the simulator; "
                "this is not a pass: to judge the simulator's dynamics, also check it under the logs' policy, or "
                "replaying the logged commands." + undetermined_advice(ev.policy_shift)
            )
        model_rows = [g for g in dec.policy_confounded if g != "ending"]
        if "ending" in dec.policy_confounded:
            parts.append(
                lead()
                + f"the checked episodes end otherwise than the real ones, but {policy_clause(ev.policy_shift)}, and "
                "another controller makes the plant fail sooner, or keeps it from failing, whatever the simulator; "
                "this is not a pass: to judge how its episodes end, also check the simulator under the logs' policy."
                + undetermined_advice(ev.policy_shift)
            )
        if model_rows:
            parts.append(
                lead() + f"the gap tests find {', '.join(model_rows)}, but {policy_clause(ev.policy_shift)}, "
                "and their thresholds come from real episodes of the logs' policy: under "
                "another policy the model's own small errors correlate with the commands as a delay or a gain would, "
                "and its residuals grow or shrink with how the commands excite the system; this is not a pass: to "
                f"judge {', '.join(model_rows)}, also check the simulator under the logs' policy, or "
                "replaying the logged commands." + undetermined_advice(ev.policy_shift)
            )
    elif dec.verdict == "inconclusive":
        parts.append(inconclusive_sentence(dec, ev, power))
    else:
        parts.append(
            f"PASS: {n_ep} episode(s) consistent with reality as the model knows it"
            + (" (gaps within gate tolerances)" if dec.tolerated_by_gate else "")
            + "."
        )
        if dec.tolerated_by_gate and {"episodes", "pooled"} & set(dec.failing_without_tolerance):
            parts.append(
                f"As checked, {n_div} episode(s) diverge; after the corrections of the tolerated gaps none does "
                "and the pooled test does not reject."
            )
        if dec.gaps.get("distribution") == "present":
            parts.append(
                "The checked episodes visit states in other proportions than the real logs (distribution gap): "
                "reported, not failing (set tolerances.distribution.min_coverage in the gate to make coverage binding)."
            )
        parts.append(power_sentence(power, levels.alpha))
        if "ending" in ev.gaps:
            parts.append(ending_pass_sentence(ev.gaps["ending"]))
    if policy is not None:
        parts.extend(policy_gate_notes(policy["gate"]))
    alike = {
        g: ev.gaps[g].confounded_with
        for g in DYNAMICS_GAPS
        if dec.gaps.get(g) in ("present", "tolerated") and g in ev.gaps and ev.gaps[g].confounded_with
    }
    if alike and dec.top_gap not in alike:  # T1's look-alikes, in one sentence (each row says why)
        others = sorted({a for v in alike.values() for a in v})
        parts.append(
            f"{', '.join(alike)} {'is' if len(alike) == 1 else 'are'} what a {', '.join(others)} gap gives as well "
            f"(a slower or faster plant: a fraction of a step of delay, and gains that move the response the same "
            f"way), so {'it is' if len(alike) == 1 else 'they are'} listed with {', '.join(others)}, not named."
        )
    explained = [g for g in DYNAMICS_GAPS if rows.get(g, {}).get("explained_by")]
    if explained:
        parts.append(
            f"{', '.join(explained)} fire{'s' if len(explained) == 1 else ''} too: {_a(dec.top_gap)} {dec.top_gap} gap changes the "
            f"residuals' level as well, so {'it is' if len(explained) == 1 else 'they are'} reported with "
            f"{dec.top_gap}, which is named."
        )
    if dec.top_gap != "none":
        parts.append(f"Top gap: {dec.top_gap} ({rows[dec.top_gap]['explanation']}).")
    elif dec.confounded:
        parts.append(f"The evidence does not separate {', '.join(dec.confounded)}: they are confounded.")
    elif unattributed(dec):
        parts.append(unattributed_sentence(ev, rows))
    ending = ev.gaps.get("ending")
    if (
        ending is not None
        and ending.fires
        and (dec.top_gap == "ending" or (dec.top_gap == "none" and ending.confounded_with))
    ):
        parts.append(ending_cause_sentence(ending, ev))
    return " ".join(parts)


UNATTRIBUTED_NEXT_STEP = (
    "no gap test names a cause: read the regimes where the checked data part from reality and the worst "
    "episodes' plots below, then look in the simulator for a physics or sensor difference the gap tests do not "
    "model (a bias in one operating regime, a missing coupling, another integrator or step size)"
)


POLICY_GATE_NEXT_STEP = (
    "the policy does not meet the release gate (see the policy section: episodes, success rate, exploitation of "
    "the simulator): fix what its rows name in the policy or the simulator, then re-check"
)


def unattributed(dec: Decision) -> bool:
    """A failing run whose divergence (episodes or the pooled test) no gap row explains."""
    return (
        dec.verdict == "fail"
        and dec.top_gap == "none"
        and not dec.confounded
        and bool({"episodes", "pooled"} & set(dec.failing))
    )


def unattributed_entry(dec: Decision, ev: CheckEvidence, rows: dict) -> dict | None:
    """The report's row for an unattributed divergence (so no FAIL sits above an all-green gap
    table), with what to do next; None when the run is not one."""
    if not unattributed(dec):
        return None
    return {
        "failing": [r for r in dec.failing if r in ("episodes", "pooled")],
        "explanation": unattributed_sentence(ev, rows),
        "next_step": UNATTRIBUTED_NEXT_STEP,
    }


def policy_gate_notes(gate: dict) -> list[str]:
    """The policy gate's sentences that do not fail the run: the warnings, and success not evaluated."""
    notes = [f"Policy gate warning: {w}." for w in gate.get("warnings", [])]
    if not gate.get("success_evaluated", True):
        notes.append(
            "The policy's success rate is not evaluated: the env reports no success and no --success rule was given."
        )
    return notes


def unattributed_sentence(ev: CheckEvidence, rows: dict) -> str:
    """A failing run no gap test explains: say so, with the strongest evidence of each kind."""
    pooled = {s: p for s, p in ev.divergence.pooled.p_values.items() if not math.isnan(p)}
    strongest = min(pooled, key=pooled.get) if pooled else None
    gaps = sorted(
        ((g, r["evidence"]) for g, r in rows.items() if r.get("evidence") is not None and g != "distribution"),
        key=lambda x: -x[1],
    )[:2]
    text = "Unattributed divergence: no gap test names a cause"
    if strongest is not None:
        text += f"; the strongest divergence evidence is the {strongest} score (pooled p = {pooled[strongest]:.3g})"
    if gaps:
        text += "; the gap tests come closest on " + ", ".join(
            f"{g} (evidence {e:.2f}, 1 = significant)" for g, e in gaps
        )
    return (
        text
        + ". Look at the regimes and the worst blocks below; a physics or sensor difference the tests do not model is likely."
    )


def ending_cause_sentence(ending: GapEvidence, ev: CheckEvidence) -> str:
    """Why the checked episodes end otherwise, as far as the evidence goes (endings.py)."""
    blocks = sum(e.blocks for e in ev.divergence.episodes) if ev.divergence is not None else 0
    scored = f"{blocks} block(s) of the checked episodes could be scored, and no gap test tells which"
    d = ending.detail
    if d is not None and d.run_on is not None and d.run_on.fires:
        return (
            "The checked episodes go on where the world model expects reality to end: the simulator lacks a "
            "termination the real system has (a fall, a trip, a safety cut-off), or ends later than it."
        )
    if ending.confounded_with and d is not None and d.checked_rate < d.real_rate:
        return (
            "The checked episodes end less often than reality's and do not go on past states where the world model "
            "expects reality to end: they do not reach the failing states, which a latency, actuator, sensor-noise or "
            f"dynamics difference does under a controller as well; {scored}."
        )
    if ending.confounded_with:
        return (
            "The checked episodes end more often than reality's, where the world model expects reality to end "
            "as well: the simulator reaches failing states sooner, which a latency, actuator, sensor-noise or dynamics difference does "
            f"under a controller; {scored}."
        )
    return (
        "What makes them end otherwise is not identified: other termination conditions do this, and under a "
        f"controller so does a latency, actuator, sensor-noise or dynamics difference that makes it fail sooner; {scored}."
    )


def short_message(dec: Decision, ev: CheckEvidence, rows: dict, why: str, n: int, lengths: list[int]) -> str:
    """The message of a check where no block could be scored (rule R8)."""
    ending = ev.gaps.get("ending")
    span = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    head = "FAIL" if dec.verdict == "fail" else dec.verdict.upper()
    text = f"{head}: {why}: {n} episode(s) of {span} steps, so the model's tests could not run"
    if dec.verdict == "fail":
        return (
            text
            + f". They end differently from reality's: {rows['ending']['explanation']}."
            + (" " + ending_cause_sentence(ending, ev) if ending is not None and ending.fires else "")
        )
    if "ending" in dec.policy_confounded:  # R4b
        return (
            text + "; this is not a pass. How they end: " + rows["ending"]["explanation"] + ". What would fix it: "
            "check the simulator under the logs' policy, record longer episodes, or calibrate with a shorter "
            "--context / --horizon." + undetermined_advice(ev.policy_shift)
        )
    return (
        text + "; this is not a pass. How they end: " + rows["ending"]["explanation"] + ". What would fix it: "
        "record longer episodes, or calibrate with a shorter --context / --horizon."
    )


def short_episodes_sentence(skipped: dict, episodes: int, context: int, horizon: int) -> str:
    """Said after the summary when some checked episodes are shorter than a block: the ending row
    counts them, and the divergence and gap tests (and the power table's size) rest on the other
    episodes' blocks. "" when none is."""
    if not skipped:
        return ""
    lengths = sorted(int(v) for v in skipped.values())
    return (
        f" {len(skipped)} of the {episodes} checked episodes are shorter than a block ({context + horizon} steps: "
        f"context {context} + horizon {horizon}; theirs hold {lengths[0]}-{lengths[-1]} observations) and hold no "
        "block: the ending row counts them, and the divergence and gap tests rest on the other episodes' "
        "blocks. Longer or more checked episodes give those tests more blocks."
    )


def inconclusive_sentence(dec: Decision, ev: CheckEvidence, power: dict) -> str:
    """R7 / R9: nothing was found, but the check could not have seen some required gap types, or
    the model is not good enough to judge."""
    n_ep = len(dec.episodes)
    if dec.model_not_competent:
        return (
            f"INCONCLUSIVE: nothing in the {n_ep} checked episode(s) diverges, but this is not a pass: "
            f"{ev.model_quality.sentence()}, so it cannot tell a simulator's error from its own. What would fix "
            "it: train longer (--max-steps, --patience, --min-improvement 0), a larger --preset, or on more real data; the quality "
            "card is RUNDIR/quality.json."
            + (
                f" Besides, the check could not have seen {', '.join(dec.missing_power)} gaps."
                if dec.missing_power
                else ""
            )
        )
    pw = ev.power
    table = [g for g in dec.missing_power if g != "ending"]
    if not table:
        why = []
    elif not pw.measured:
        why = [
            f"its power was not measured ({pw.held_out_episodes} held-out real episodes; the power table needs at "
            "least 2 per half)"
        ]
    elif not pw.reliable:
        rate = next(iter(power.values()))["control_detection"]
        why = [
            "its power could not be measured reliably: with no gap injected, the held-out real episodes already "
            f"differ among themselves ({rate:.0%} detected)"
        ]
    else:
        sizes = "; ".join(
            f"{g} {'down' if size_bound(power[g]) == '<=' else 'up'} to {power[g]['sizes'][-1]} {power[g]['units']}"
            for g in table
            if g in power
        )
        why = [f"no injected size of {', '.join(table)} was detected ({sizes})"]
    if "ending" in dec.missing_power:
        why.append(ending_power_words(ev.gaps["ending"]))
    why = "; ".join(why)
    return (
        f"INCONCLUSIVE: nothing in the {n_ep} checked episode(s) diverges, but this is not a pass: {why}, so the "
        f"check could not have seen {', '.join(dec.missing_power)} gaps. What would fix it: more held-out real "
        "episodes (log more, add real logs with `calibrate --real`, or cross-fit: `train --folds 5` holds every "
        "episode out once), more or longer checked episodes, or a "
        "better-trained model; a team that accepts a partial pass lists the types it needs in the gate "
        "(require_power: [...])."
    )


def size_bound(row: dict) -> str:
    """ ">=" for a power series whose sizes grow with the gap, "<=" for one whose sizes fall
    (motion_smaller: 0.9 down to 0.5 x reality's motion)."""
    sizes = [float(x) for x in row.get("sizes", [])]
    return "<=" if len(sizes) > 1 and sizes[-1] < sizes[0] else ">="


def power_sentence(power: dict, alpha: float) -> str:
    if not power:
        return "Its power was not measured: calibration needs at least 2 held-out real episodes to inject gaps into."
    if not all(p.get("reliable", True) for p in power.values()):
        rate = next(p["control_detection"] for p in power.values())
        return (
            f"Its power could not be measured reliably: with no gap injected, the held-out real episodes already "
            f"differ among themselves ({rate:.0%} detected); hold out more real episodes."
        )
    worth = [
        f"{g} {size_bound(p)} {p['smallest_detected']} {p['units']}"
        for g, p in power.items()
        if p["smallest_detected"] is not None
    ]
    undetectable = [g for g, p in power.items() if p["smallest_detected"] is None]
    rate = next(iter(power.values())).get("control_detection")
    return (
        "This pass would have caught: "
        + (", ".join(worth) or "none of the injected gap sizes")
        + "."
        + (f" Not detectable at the tested sizes: {', '.join(undetectable)}." if undetectable else "")
        + (
            f" (With no gap injected, {rate:.0%} of the power draws are flagged, above alpha: these sizes "
            f"are optimistic.)"
            if rate is not None and rate > alpha
            else ""
        )
        + " "
        + DYNAMICS_POWER_SCOPE
    )


DYNAMICS_POWER_SCOPE = (
    "The dynamics row's power is measured as a plant that moves more or less than reality over a block "
    "(motion_larger, motion_smaller: the held-out real horizons' motion scaled); a change of the physics "
    "that keeps how far the plant moves over a block (a hopper that topples as soon under more gravity) "
    "is not bounded by this pass."
)
"""Said with every pass's power: the physics of a real log cannot be changed, so the dynamics row's
injected gaps are the real horizons' motion scaled (power.MOTION_GAPS), not every physics change."""


def ending_pass_sentence(g: GapEvidence) -> str:
    """What a pass is worth on the ending row (its best case, endings.EndingPower); where the gate
    does not require it, why it could not have fired."""
    pw = getattr(g.detail, "power", None)
    if pw is not None and pw.detectable:
        said = []
        if pw.sooner_p is not None:
            said.append(f"{_all(pw.judged, 'judged checked episode')} terminating")
        if pw.later_p is not None and pw.judged:
            said.append("none of them terminating")
        elif pw.later_p is not None:
            said.append(
                f"{_all(pw.run_on_checked, 'checked episode')} with an expected end running on longer than the real ones"
            )
        return "The ending test would have caught " + " or ".join(said) + "."
    return "Not covered by this pass (the gate does not require it): " + ending_power_words(g) + "."


def pooled_description(ev: CheckEvidence) -> str:
    p = ev.divergence.pooled
    if p.paired:
        return (
            "paired: the checked blocks replay held-out real blocks' logged inputs; each is compared with its "
            f"real twin, episodes as the units ({p.paired_blocks} of {p.competent_blocks} competent blocks paired)"
        )
    return "unpaired: Student's t (pooled variance) of the checked vs the held-out real episodes' mean (log) scores"
