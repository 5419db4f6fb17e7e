"""The human report: one self-contained HTML file (no network) read in two minutes.

Owns the page layout: verdict first; the reality-gap table (one row per gap type, green / amber /
red, evidence, estimate, interval, what to do next); divergence vs horizon; per-channel overlays of
the checked data vs the model's prediction with bands for the worst blocks; episodes; the power
table; provenance. Figures are matplotlib PNGs embedded as data URIs.
"""
from __future__ import annotations

import base64
import html
import io
import json

import numpy as np

from wmcheck.checks.check import NEXT_STEPS

COLORS = {"present": "#d9534f", "absent": "#5cb85c", "tolerated": "#f0ad4e", "not_checked": "#aaaaaa", "confounded": "#f0ad4e"}
VERDICT_COLORS = {"pass": "#2e7d32", "fail": "#c62828", "unverifiable": "#ef6c00"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def divergence_figure(report: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = report["divergence_curve"]
    fig, ax = plt.subplots(figsize=(6, 2.8))
    h = c["horizon_steps"]
    ax.plot(h, c["real_mean"], color="k", label="held-out real (mean)")
    ax.plot(h, c["real_q"], color="k", ls="--", lw=0.8, label=f"real {c.get('real_q_level', 0.95):.0%} quantile")
    ax.plot(h, c["checked_mean"], color="#c62828", label="checked (mean)")
    ax.set_xlabel("open-loop horizon (steps)")
    ax.set_ylabel("standardised error z^2")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def overlay_figures(report: dict, max_channels: int = 6) -> list[tuple[str, object]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = report.get("_plots", {})
    names = plots.get("names", [])
    out = []
    for blk in plots.get("worst_blocks", []):
        truth = np.asarray(blk["truth"])
        C = blk["context"]
        pred, lo, hi = (np.asarray(blk[k]) for k in ("pred", "lo", "hi"))
        D = min(truth.shape[1], max_channels)
        fig, axes = plt.subplots(D, 1, figsize=(6, 1.7 * D), squeeze=False)
        steps = np.arange(truth.shape[0]) + blk["start"]
        for d in range(D):
            ax = axes[d, 0]
            ax.axvspan(steps[0], steps[C - 1], color="0.9")
            ax.plot(steps, truth[:, d], color="k", lw=1, label="checked trajectory")
            ax.plot(steps[C:], pred[:, d], color="tab:blue", lw=1, label="model prediction (real dynamics)")
            ax.fill_between(steps[C:], lo[:, d], hi[:, d], color="tab:blue", alpha=0.25, label="90% band")
            ax.set_ylabel(names[d] if d < len(names) else f"obs {d}", fontsize=7)
            if d == 0:
                ax.legend(fontsize=6, loc="best")
        axes[-1, 0].set_xlabel("step (context shaded)")
        fig.tight_layout()
        out.append((f"episode {blk['episode']}, steps {blk['start']}-{blk['start'] + truth.shape[0] - 1}", fig))
    return out


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items() if k not in ("per_channel", "per_horizon_ratio", "photometric", "per_episode_distance_ratio"))
    return str(v)


def render_html(report: dict) -> str:
    e = html.escape
    s = report["summary"]
    v = report["verdict"]
    rows = []
    for gap, g in report["gaps"].items():
        status = "confounded" if g.get("confounded_with") else g["verdict"]
        # Estimates are shown for gaps the evidence supports (the JSON keeps them all).
        shown = g["verdict"] in ("present", "tolerated") or gap == "distribution"
        rows.append(
            f"<tr><td><b>{e(gap)}</b></td><td><span class='dot' style='background:{COLORS.get(status, '#aaa')}'></span>{e(status)}</td>"
            f"<td>{_fmt(g.get('evidence'))}</td><td>{e(_fmt(g.get('estimate')) if shown else '–')}</td>"
            f"<td>{e(_fmt(g.get('ci')) if shown else '–')}</td>"
            f"<td>{e(g.get('explanation', ''))}</td><td>{e(NEXT_STEPS.get(gap, '')) if g['verdict'] in ('present', 'tolerated') else ''}</td></tr>")
    ep_rows = "".join(
        f"<tr><td>{ep['id']}</td><td>{e(str(ep.get('name') or ''))}</td><td class='v-{ep['verdict']}'>{ep['verdict']}</td>"
        f"<td>{ep['score']:.3f}</td><td>{_fmt(ep['divergence_onset_step'])}</td><td>{ep['outside_competence_fraction']:.0%}</td></tr>"
        for ep in sorted(report["episodes"], key=lambda x: -x["score"])[:50])
    pw = report["power"]
    power_rows = "".join(
        f"<tr><td>{e(g)}</td><td>{e(p['units'])}</td>"
        + "".join(f"<td>{size:g}: {prob:.0%}</td>" for size, prob in zip(p["sizes"], p["detection_probability"]))
        + f"<td><b>{_fmt(p['smallest_detected'])}</b></td></tr>" for g, p in pw["gaps"].items())
    figs = [f"<figure><img src='{_png(divergence_figure(report))}' alt='divergence vs horizon'><figcaption>Standardised open-loop error vs horizon: checked episodes against held-out real episodes.</figcaption></figure>"]
    for caption, fig in overlay_figures(report):
        figs.append(f"<figure><img src='{_png(fig)}' alt='overlay'><figcaption>Worst block: {e(caption)}. Black: the checked trajectory; blue: what the world model (trained on real logs) predicts under the same commands.</figcaption></figure>")
    prov = report["provenance"]
    th = report["thresholds"]
    warning = f"<p class='warn'>{e(th['calibration_warning'])}</p>" if th.get("calibration_warning") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>wmcheck report: {e(v)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;max-width:1100px;color:#222}}
.verdict{{color:#fff;padding:14px 18px;border-radius:6px;font-size:22px;background:{VERDICT_COLORS[v]}}}
table{{border-collapse:collapse;margin:8px 0 18px;font-size:13px}} td,th{{border:1px solid #ddd;padding:4px 8px;vertical-align:top}}
th{{background:#f4f4f4}} .dot{{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:6px}}
.v-divergent{{color:#c62828}} .v-unverifiable{{color:#ef6c00}} .v-consistent{{color:#2e7d32}}
figure{{margin:8px 0}} figcaption{{font-size:12px;color:#555}} .warn{{color:#ef6c00}} code{{background:#f4f4f4;padding:1px 4px}}
</style></head><body>
<div class="verdict" id="verdict">Verdict: <b>{e(v.upper())}</b> &nbsp; score {s['score']:.3f} &nbsp; top gap: {e(s['top_gap'])}</div>
<p id="message">{e(s['message'])}</p>
<p>{s['episodes']} episodes checked: {s['consistent']} consistent, {s['divergent']} divergent, {s['unverifiable']} unverifiable;
{s.get('competent_blocks', 0)} of {s.get('blocks', 0)} blocks inside the model's competence. False-alarm budget alpha = {s['alpha']} per run
(thresholds from {e(str(th['source']))}, {th.get('calibration_blocks')} held-out real blocks).</p>{warning}
<h2>Reality-gap table</h2>
<table id="gap-table"><tr><th>gap</th><th>status</th><th>evidence (&ge;1 = present)</th><th>estimate</th><th>90% interval</th><th>evidence detail</th><th>what to do next</th></tr>
{''.join(rows)}</table>
<h2>Divergence and overlays</h2>
{''.join(figs)}
<h2>Episodes (worst first)</h2>
<table><tr><th>id</th><th>name</th><th>verdict</th><th>score</th><th>divergence onset (step)</th><th>outside competence</th></tr>{ep_rows}</table>
<h2>What a pass is worth (power)</h2>
<p>Detection probability of gaps injected into held-out real episodes, for a check of {pw['n_blocks']} blocks, at the calibrated threshold; the last column is the smallest size detected with probability &ge; {pw['target']:.0%}.</p>
<table id="power-table"><tr><th>gap</th><th>units</th><th colspan="4">size: detection probability</th><th>smallest detected</th></tr>{power_rows}</table>
<h2>Provenance</h2>
<p><code>{e(prov['command'])}</code><br>wmcheck {e(prov['wmcheck_version'])}; model sha256 {e(prov['model_sha256'][:16])}…; training data sha256 {e(prov['training_data_sha256'][:16])}…; rollouts {e(prov['rollouts'])} ({e(prov['rollouts_sha256'][:16])}…); {prov['seconds']} s.</p>
<script type="application/json" id="report-json">{e(json.dumps({k: report[k] for k in ('verdict', 'summary')}))}</script>
</body></html>"""
