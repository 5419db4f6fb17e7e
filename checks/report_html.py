"""The human report: one self-contained HTML file (no network) read in two minutes.

Owns the page layout: verdict first; the reality-gap table (one row per gap type, green / amber /
red, evidence, estimate, interval, what to do next); divergence vs horizon; per-channel overlays of
the checked data vs the model's prediction with bands for the worst blocks; the operating regimes
where the checked data diverge; the closed-loop policy check (gate, returns in the simulator vs
inside the model, exploitation, coverage), when a policy was run; episodes; the power table;
provenance. Figures are matplotlib PNGs embedded as data URIs.
"""

from __future__ import annotations

import base64
import html
import io
import json

import numpy as np

from wmcheck.checks.report_build import POLICY_GATE_NEXT_STEP

COLORS = {
    "present": "#d9534f",
    "absent": "#5cb85c",
    "tolerated": "#f0ad4e",
    "not_checked": "#aaaaaa",
    "confounded": "#f0ad4e",
}
VERDICT_COLORS = {"pass": "#2e7d32", "fail": "#c62828", "unverifiable": "#ef6c00", "inconclusive": "#6d4c41"}

# The one style of every wmcheck page (check, monitor and shadow reports).
PAGE_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;max-width:1100px;color:#222}
.verdict{color:#fff;padding:14px 18px;border-radius:6px;font-size:22px}
table{border-collapse:collapse;margin:8px 0 18px;font-size:13px} td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top}
th{background:#f4f4f4} .dot{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:6px}
.v-divergent{color:#c62828} .v-unverifiable{color:#ef6c00} .v-consistent{color:#2e7d32}
figure{margin:8px 0} figcaption{font-size:12px;color:#555} .warn{color:#ef6c00} code{background:#f4f4f4;padding:1px 4px}
img{max-width:100%;height:auto} details.section>summary{cursor:pointer} details.section>summary h2{display:inline}
details.episode{margin:4px 0 4px 12px} details.episode>summary{cursor:pointer;font-size:14px}"""

# Opens the collapsed section or episode that a link (#episode-7) points to, on load and on click.
OPEN_TARGET_JS = """<script>
function wmOpen(){var t=location.hash&&document.getElementById(location.hash.slice(1));
for(var n=t;n;n=n.parentElement){if(n.tagName==='DETAILS'){n.open=true;}}if(t){t.scrollIntoView();}}
window.addEventListener('hashchange',wmOpen);window.addEventListener('load',wmOpen);
</script>"""


def page(title: str, colour: str, banner: str, body: str) -> str:
    """A self-contained HTML page in the reports' style: `title` (plain text), a verdict banner
    (`banner`, HTML) on `colour`, then `body` (HTML)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
{PAGE_CSS}
.verdict{{background:{colour}}}
</style></head><body>
<div class="verdict" id="verdict">{banner}</div>
{body}
</body></html>"""


FIG_WIDTH = 9.6
"""Inches at FIG_DPI: every report figure is 960 CSS pixels wide."""
FIG_DPI = 100
FIG_SCALE = 2
"""Pixels per CSS pixel: figures are rendered at twice their displayed size (sharp on high-DPI screens)."""


def _png(fig) -> tuple[str, int, int]:
    """The figure as a palette PNG data URI and its displayed (CSS pixel) width and height; closes it.
    Drawn once at FIG_SCALE x FIG_DPI and quantised from the canvas's pixels (no RGBA PNG in between)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    fig.set_dpi(FIG_DPI * FIG_SCALE)
    fig.canvas.draw()
    rgba = fig.canvas.buffer_rgba()
    width, height = fig.canvas.get_width_height(physical=True)
    plt.close(fig)
    img = Image.frombuffer("RGBA", (width, height), rgba, "raw", "RGBA", 0, 1).convert("RGB")
    out = io.BytesIO()
    img.quantize(colors=PALETTE_COLORS, method=Image.Quantize.FASTOCTREE).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode(), width // FIG_SCALE, height // FIG_SCALE


PALETTE_COLORS = 64
"""Colours of a figure's PNG: line plots need few, and a palette PNG at 2x is ~4x smaller than RGBA."""


def figure_img(fig, alt: str) -> str:
    """An <img> of the figure (closed here) at its displayed size; the page scales it down on narrow screens."""
    uri, width, height = _png(fig)
    return f"<img src='{uri}' width='{width}' height='{height}' alt='{html.escape(alt, quote=True)}'>"


def section(title: str, body: str, sid: str, open_: bool = True) -> str:
    """A report section that collapses: <details> with the title as its summary (a heading)."""
    return (
        f"<details class='section' id='{sid}'{' open' if open_ else ''}><summary><h2>{html.escape(title)}</h2>"
        f"</summary>\n{body}\n</details>"
    )


def divergence_figure(report: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = report["divergence_curve"]
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 3.6))
    h = c["horizon_steps"]
    ax.plot(h, c["real_mean"], color="k", label="held-out real (mean)")
    ax.plot(h, c["real_q"], color="k", ls="--", lw=0.8, label=f"real {c.get('real_q_level', 0.95):.0%} quantile")
    ax.plot(h, c["checked_mean"], color="#c62828", label="checked (mean)")
    ax.set_xlabel("open-loop horizon (steps)")
    ax.set_ylabel("standardised error z^2")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def _draw_block(axes, blk: dict, names: list, channels: int) -> None:
    """One block's overlay on `axes` (one per channel): the checked trajectory, the model's
    prediction and its 90 % band, the context steps shaded."""
    truth = np.asarray(blk["truth"])
    C = blk["context"]
    pred, lo, hi = (np.asarray(blk[k]) for k in ("pred", "lo", "hi"))
    steps = np.arange(truth.shape[0]) + blk["start"]
    for d in range(channels):
        ax = axes[d]
        ax.axvspan(steps[0], steps[C - 1], color="0.9")
        ax.plot(steps, truth[:, d], color="k", lw=1, label="checked trajectory")
        ax.plot(steps[C:], pred[:, d], color="tab:blue", lw=1, label="model prediction (real dynamics)")
        ax.fill_between(steps[C:], lo[:, d], hi[:, d], color="tab:blue", alpha=0.25, label="90% band")
        ax.set_ylabel(names[d] if d < len(names) else f"obs {d}", fontsize=8)
        if d == 0:
            ax.legend(fontsize=8, loc="best")
    axes[channels - 1].set_xlabel("step (context shaded)")


def _block_span(blk: dict) -> str:
    return f"steps {blk['start']}-{blk['start'] + len(blk['truth']) - 1}"


def overlay_figures(report: dict, max_channels: int = 6) -> list[tuple[str, object]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = (report.get("figures") or {}).get("worst_blocks") or {}
    names = plots.get("names", [])
    out = []
    for blk in plots.get("worst_blocks", []):
        D = min(len(blk["truth"][0]), max_channels)
        fig, axes = plt.subplots(D, 1, figsize=(FIG_WIDTH, 1.9 * D), squeeze=False)
        _draw_block(axes[:, 0], blk, names, D)
        fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
        out.append((f"episode {blk['episode']}, {_block_span(blk)}", fig))
    return out


def episode_figure(ep: dict, drill: dict, names: list, max_channels: int = 3):
    """One episode's drill-down: the divergence score of each of its blocks along the episode
    against the held-out real blocks' median and quantile, then its most divergent block's overlay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blk = ep["worst_block"]
    D = min(len(blk["truth"][0]), max_channels)
    fig, axes = plt.subplots(D + 1, 1, figsize=(FIG_WIDTH, 2.2 + 1.8 * D), squeeze=False)
    ax = axes[0, 0]
    ax.plot(ep["block_start"], ep["divergence"], "o-", color="#c62828", ms=4, label="checked block")
    if drill.get("real_divergence_q") is not None:
        ax.axhline(drill["real_divergence_median"], color="k", lw=0.8, label="held-out real blocks: median")
        ax.axhline(
            drill["real_divergence_q"],
            color="k",
            ls="--",
            lw=0.8,
            label=f"held-out real blocks: {drill.get('real_q_level', 0.95):.0%} quantile",
        )
    ax.set_yscale("log")
    ax.set_xlabel("block start (step)")
    ax.set_ylabel("divergence score", fontsize=8)
    ax.legend(fontsize=8, loc="best")
    _draw_block(axes[1:, 0], blk, names, D)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def policy_return_figure(report: dict):
    """Per episode: simulator return vs the model's closed-loop return (mean, range over rollouts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = (report.get("figures") or {}).get("policy_returns") or {}
    sim, mod = np.asarray(d.get("simulator_return", []), float), np.asarray(d.get("model_return", []), float)
    lo, hi = np.asarray(d.get("model_return_lo", []), float), np.asarray(d.get("model_return_hi", []), float)
    high = np.asarray(d.get("high", []), bool)
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 5.0))
    if len(sim):
        ax.errorbar(
            sim[~high],
            mod[~high],
            yerr=[mod[~high] - lo[~high], hi[~high] - mod[~high]],
            fmt="o",
            ms=3,
            lw=0.6,
            color="0.5",
            label="other episodes",
        )
        ax.errorbar(
            sim[high],
            mod[high],
            yerr=[mod[high] - lo[high], hi[high] - mod[high]],
            fmt="o",
            ms=3,
            lw=0.6,
            color="tab:blue",
            label="successful / high-return",
        )
        span = [min(sim.min(), lo.min()), max(sim.max(), hi.max())]
        ax.plot(span, span, color="k", lw=0.8, ls="--", label="model = simulator")
    ax.set_xlabel("return in the simulator")
    ax.set_ylabel("return inside the model (mean, range)")
    ax.legend(fontsize=7)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def _policy_html(report: dict) -> str:
    pol = report.get("policy")
    if not pol:
        return ""
    e = html.escape
    g, r, x, c, v, sc = (
        pol["gate"],
        pol["returns"],
        pol["exploitation"],
        pol["coverage"],
        pol["visitation"],
        pol["success"],
    )

    def status(ok: bool) -> str:
        return f"<span class='dot' style='background:{COLORS['absent' if ok else 'present']}'></span>{'met' if ok else 'not met'}"

    rate = "unknown" if g["success_rate"] is None else f"{g['success_rate']:.1%}"
    binding = g.get("binding", ["min_episodes", "min_success_rate"])

    def advisory(ok: bool, key: str) -> str:  # a default the gate file does not set warns, it does not fail
        if ok or key in binding:
            return status(ok)
        return f"<span class='dot' style='background:{COLORS['tolerated']}'></span>warning (default, not binding)"

    success_status = (
        status(g["success_rate"] is not None and g["success_rate"] >= g["min_success_rate"])
        if g.get("success_evaluated", True)
        else f"<span class='dot' style='background:{COLORS['not_checked']}'></span>not evaluated"
    )
    gate_rows = (
        f"<tr><td>simulator episodes</td><td>{g['episodes']}</td><td>&ge; {g['min_episodes']}</td>"
        f"<td>{advisory(g['episodes'] >= g['min_episodes'], 'min_episodes')}</td></tr>"
        f"<tr><td>simulator success rate ({e(str(sc['source'] or 'no success source'))})</td><td>{rate}</td>"
        f"<td>&ge; {g['min_success_rate']:.0%}</td><td>{success_status}</td></tr>"
        "<tr><td>exploitation of the simulator</td>"
        f"<td>{'flagged' if x['flag'] else 'not flagged'} (p = {_fmt(x['p_value'])})</td><td>not flagged</td>"
        f"<td>{status(not x['flag'])}</td></tr>"
    )
    reasons = "".join(f"<li>{e(t)}</li>" for t in g["reasons"] + g.get("warnings", []))
    ch_rows = "".join(
        f"<tr><td>{e(ch['name'])}</td><td>{e(_fmt(ch['simulator_q05_q50_q95']))}</td>"
        f"<td>{e(_fmt(ch['model_q05_q50_q95']))}</td>"
        f"<td>{_fmt(ch.get('simulator_inside_model_q01_q99'))}</td></tr>"
        for ch in v["per_channel"]
    )
    ep_rows = "".join(
        f"<tr><td>{ep['id']}</td><td>{_fmt(ep['simulator_return'])}</td>"
        f"<td>{_fmt(ep['model_return'])} {e(_fmt(ep['model_return_range']))}</td>"
        f"<td>{_fmt(ep['split_step'])}</td><td>{e(_fmt(ep.get('simulator_state')))}</td>"
        f"<td>{e(_fmt(ep.get('model_state')))}</td>"
        f"<td>{'yes' if ep['through_flagged_block'] else 'no'}</td></tr>"
        for ep in x["episodes"]
    )
    ep_table = (
        (
            "<table id='policy-episodes'><tr><th>episode</th><th>simulator return</th><th>model return (range)"
            "</th><th>split step</th>"
            "<th>simulator state there</th><th>model state there</th><th>through a flagged block</th>"
            f"</tr>{ep_rows}</table>"
        )
        if ep_rows
        else "<p>No high-return episode scores above every model rollout.</p>"
    )
    model_rate = (
        "" if sc["model_rate"] is None else f" The same success rule on the model's rollouts: {sc['model_rate']:.1%}."
    )
    body = f"""<div id="policy"><p>Policy <code>{e(pol["policy"])}</code> in <code>{e(pol["env"])}</code>:
{pol["episodes"]} simulator episodes; inside the world model
from the same initial conditions ({pol["context_steps"]} observed steps, then the policy acts on the model's
predictions), {pol["closed_loop_samples"]} rollouts per episode.{model_rate}</p>
<table id="policy-gate"><tr><th>policy gate</th><th>this check</th><th>required</th><th>status</th></tr>{gate_rows}</table>
{f'<ul class="warn">{reasons}</ul>' if reasons else ""}
<p><b>Returns</b>: simulator mean {_fmt(r["simulator"]["mean"])}, model mean {_fmt(r["model"]["mean"])}; paired
difference (simulator - model) {_fmt(r["paired_difference_mean"])}
(90% interval {e(_fmt(r["paired_difference_ci"]))}); the model resolves differences beyond {_fmt(r.get("model_resolution"))} (its reward error on real data),
sign-flip p = {_fmt(r["p_value"])} that the difference exceeds that{", significant" if r["differs"] else ""};
{_fmt(r["inside_model_range"])} of the simulator returns lie inside the model's range
(expected {_fmt(r["inside_model_range_expected"])} if the simulator behaved like reality).</p>
<p><b>Exploitation</b>: {e(x["explanation"])}.</p>
<p><b>Coverage</b>: {_fmt(c["fraction_in_support"])} of the policy's simulator steps lie inside the real logs'
support ({_fmt(c["successful_fraction_in_support"])} on its successful episodes).
<b>State visitation</b>, simulator vs model closed loop: block MMD p = {_fmt(v["p_value"])}{" (differs)" if v["differs"] else ""}.</p>
<figure>{figure_img(policy_return_figure(report), "policy returns")}<figcaption>Each point is one initial
condition: its return in the simulator and inside the model (bar: range over the model's
rollouts).</figcaption></figure>
<table><tr><th>channel</th><th>simulator q05, q50, q95</th><th>model q05, q50, q95</th><th>simulator inside model's 1-99%</th></tr>{ch_rows}</table>
<h3>High-return episodes above every model rollout</h3>
{ep_table}</div>
"""
    return section("Policy, closed loop: simulator vs the model of reality", body, "policy-section")


def regime_figure(channel: dict, obs: str):
    """Median error of the checked observation vs the model's prediction per bin of one control
    channel (with its block-bootstrap interval), next to the model's own error on real data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [b for b in channel["bins"] if b["effect"][obs]["checked_median_error"] is not None]
    x = np.arange(len(bins))
    med = np.array([b["effect"][obs]["checked_median_error"] for b in bins], float)
    ci = np.array([[np.nan if v is None else v for v in b["effect"][obs]["ci"]] for b in bins], float).reshape(-1, 2)
    ref = np.array(
        [
            np.nan if b["effect"][obs]["real_median_error"] is None else b["effect"][obs]["real_median_error"]
            for b in bins
        ],
        float,
    )
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 3.6))
    ax.axhline(0, color="0.6", lw=0.8)
    ax.errorbar(
        x,
        med,
        yerr=np.abs(np.stack([med - ci[:, 0], ci[:, 1] - med])),
        fmt="o",
        color="#c62828",
        capsize=3,
        label="checked - model prediction (median, 95% CI)",
    )
    ax.plot(x, ref, "s", color="k", ms=4, label="real held-out - model prediction (median)")
    for i, b in enumerate(bins):
        if b["flagged"]:
            ax.axvspan(i - 0.45, i + 0.45, color="#c62828", alpha=0.12)
    ax.set_xticks(x, [f"{b['range'][0]:.3g}-{b['range'][1]:.3g}" for b in bins], rotation=30, fontsize=7)
    unit = channel.get("unit") or ""
    ax.set_xlabel(f"{channel['name']} ({unit})" if unit else channel["name"])
    ounit = bins[0]["effect"][obs]["unit"] if bins else ""
    ax.set_ylabel(f"{obs} error ({ounit})" if ounit else f"{obs} error", fontsize=8)
    ax.legend(fontsize=6)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def regime_section(report: dict) -> str:
    """HTML: the flagged regimes, where the model is not competent, and one figure per channel
    with a flagged regime (or, when none is flagged, the channel with the smallest p-value)."""
    reg = report.get("regimes")
    e = html.escape
    if not reg:
        return "<p>Not computed: the calibration predates regime analysis; re-run <code>wmcheck calibrate</code>.</p>"
    items = (
        "".join(f"<li class='v-divergent'>{e(r['text'])}</li>" for r in reg["regimes"])
        or "<li>No operating regime differs significantly from reality at the calibrated threshold.</li>"
    )
    nc = (
        "".join(
            f"<li class='v-unverifiable'>{e(r['text'])}</li>"
            for r in reg["not_competent"] + reg.get("outside_training_range", [])
        )
        or "<li>The model is competent over the checked operating range, which lies inside the training logs' range.</li>"
    )
    order = list(dict.fromkeys(r["channel"] for r in reg["regimes"]))  # strongest regime's channel first
    by_name = {c["name"]: c for c in reg["channels"]}
    chans = [by_name[n] for n in order if n in by_name]
    if not chans and reg["channels"]:
        chans = [
            min(
                reg["channels"],
                key=lambda c: min([b["p_value"] for b in c["bins"] if b["p_value"] is not None] or [1.0]),
            )
        ]
    obs_names = list(reg["channels"][0]["bins"][0]["effect"]) if reg["channels"] and reg["channels"][0]["bins"] else []
    figs = "".join(
        f"<figure>{figure_img(regime_figure(c, o), 'regime ' + c['name'])}<figcaption>{e(o)} error by "
        f"{e(c['name'])} bin (bins: held-out real quantiles; shaded: flagged at the calibrated threshold)."
        "</figcaption></figure>"
        for c in chans[:4]
        for o in obs_names[:2]
    )
    return (
        f"<p>Where, in the operating conditions, the checked data part ways with reality as the model knows it "
        f"({e(reg.get('method', ''))}; alpha per test {reg['alpha_per_test']:.2g}).</p>"
        f"<ul id='regimes'>{items}</ul><p>Where the model is not competent:</p><ul id='not-competent'>{nc}</ul>{figs}"
    )


def _folds_note(th: dict) -> str:
    k = th.get("calibration_folds") or 0
    return (
        f"; cross-fitted: each real and each checked episode scored by one of {k} fold models, "
        "never by one that trained on it"
        if k
        else ""
    )


def _coverage_note(th: dict) -> str:
    """The calibrated interval's measured coverage on the real blocks (calibration.interval_coverage)."""
    cov = th.get("interval_coverage") or {}
    if cov.get("min") is None:
        return ""
    lo, hi = cov["min"], cov["max"]
    span = f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}&ndash;{hi:.2f}"
    return (
        f" <span id='interval-coverage'>The model's calibrated {cov['level']:.0%} interval covered {span} of "
        f"held-out real truth per imagined step (cross-fitted over {cov['episodes']} episodes: the spread "
        "scaled on one half, measured on the other).</span>"
    )


def _power_note(pw: dict) -> str:
    """What limits the power table: fewer injected blocks than the check has, or an unreliable control."""
    first = next(iter(pw["gaps"].values()), None)
    if not first:
        return " Not measured: calibration needs at least 2 held-out real episodes."
    note = ""
    if first.get("blocks_used") and first["blocks_used"] < pw["n_blocks"]:
        note += f" Measured with the {first['blocks_used']} injected blocks available (a lower bound for {pw['n_blocks']} blocks)."
    if first.get("control_detection") is not None:
        note += f" With no gap injected, {first['control_detection']:.0%} of draws are flagged (the control"
        note += (
            "; above alpha, so the sizes are optimistic)."
            if first["control_detection"] > pw.get("alpha", 0.05)
            else ")."
        )
    if not first.get("reliable", True):
        note += " <b>Unreliable</b>: the held-out real episodes differ among themselves; no smallest size is claimed."
    return note


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(
            f"{k}: {_fmt(x)}"
            for k, x in v.items()
            if k not in ("per_channel", "per_horizon_ratio", "photometric", "per_episode_distance_ratio") and x != {}
        )
    return str(v)


def _estimate_text(gap: str, row: dict) -> str:
    """A gap row's estimate as the table shows it: the distribution, latency and actuator rows in
    words, the others as their key figures (the JSON keeps everything)."""
    est = row.get("estimate")
    if gap == "actuator" and isinstance(est, dict) and est.get("kind") and est.get("value") is not None:
        return f"{est['kind']} {est['value']:.3g} on {est['channel']}"
    if gap == "latency" and isinstance(est, dict) and est.get("steps") is not None:
        ms = f" ({est['seconds'] * 1000:.0f} ms)" if est.get("seconds") is not None else ""
        return f"{est['steps']:.3g} steps{ms}: {est['direction']}"
    if gap != "distribution" or not isinstance(est, dict) or "coverage" not in est:
        return _fmt(est)
    text = (
        f"{est['coverage']:.0%} of checked steps inside the real support; visited states "
        f"{'differ' if row['verdict'] == 'present' else 'alike'} (MMD p {_fmt(est.get('p_value'))})"
    )
    ps = est.get("policy_shift")
    if ps and ps.get("declared", "auto") != "auto":
        text += f"; commands: {'another policy than the logs' if ps['shifted'] else 'the logs'}' (declared)"
    elif ps and ps.get("undetermined"):
        text += f"; commands: undetermined on a closed loop, taken as another policy's (p {_fmt(ps['p_value'])})"
    elif ps and ps.get("testable"):
        text += (
            f"; commands: {'another policy than the logs' if ps['shifted'] else 'the logs'}' (p {_fmt(ps['p_value'])})"
        )
    return text


def _quality_html(q: dict | None) -> str:
    """The model's own quality on held-out real episodes (training/quality.py), next to ARX."""
    if not q:
        return "<p>No quality card (the run was trained before wmcheck wrote one): retrain to get it.</p>"
    steps = list(q["at_steps"])
    cell = lambda v, f="{:.3f}": "–" if v is None else f.format(v)  # noqa: E731
    rows = "".join(
        f"<tr><td>{label}</td>" + "".join(f"<td>{cell(q['at_steps'][h][k], f)}</td>" for h in steps) + "</tr>"
        for label, k, f in (
            ("NRMSE world model", "world_model", "{:.3f}"),
            ("NRMSE linear ARX", "arx", "{:.3f}"),
            ("NRMSE persistence", "persistence", "{:.3f}"),
            ("90% interval coverage, raw", "coverage90_raw", "{:.2f}"),
            ("90% interval coverage, calibrated", "coverage90_calibrated", "{:.2f}"),
        )
    )
    cls = "" if q["competent"] else " class='warn'"
    return (
        f"<p{cls} id='model-quality'>Open loop on {q['heldout_episodes']} held-out real episodes "
        f"({q['train_episodes']} training episodes): {html.escape(q['sentence'])}.</p>"
        "<table id='quality-table'><tr><th>imagined step</th>"
        + "".join(f"<th>{h}</th>" for h in steps)
        + f"</tr>{rows}</table>"
    )


def render_html(report: dict) -> str:
    e = html.escape
    s = report["summary"]
    v = report["verdict"]
    rows = []
    un = s.get("unattributed")
    if un:  # a FAIL no gap row explains is a red row of its own, never an all-green table
        rows.append(
            f"<tr id='unattributed'><td><b>divergence, no gap named</b></td><td><span class='dot' "
            f"style='background:{COLORS['present']}'></span>present</td><td>{e(', '.join(un['failing']))}</td>"
            f"<td>–</td><td>–</td><td>{e(un['explanation'])}</td><td>{e(un['next_step'])}</td></tr>"
        )
    if "policy_gate" in s.get("failing", []):  # a failed policy gate fails the run: the table says so too
        rows.append(
            f"<tr id='policy-gate-row'><td><b><a href='#policy-section'>policy gate</a></b></td><td><span class='dot' "
            f"style='background:{COLORS['present']}'></span>not met</td><td>–</td><td>–</td><td>–</td>"
            f"<td>{e('; '.join((report.get('policy') or {}).get('gate', {}).get('reasons', [])))}</td>"
            f"<td>{e(POLICY_GATE_NEXT_STEP)}</td></tr>"
        )
    for gap, g in report["gaps"].items():
        status = "confounded" if g.get("confounded_with") or g.get("confounded_with_policy") else g["verdict"]
        # Estimates are shown for gaps the evidence supports (the JSON keeps them all).
        shown = g["verdict"] in ("present", "tolerated") or gap == "distribution"
        rows.append(
            f"<tr><td><b>{e(gap)}</b></td><td><span class='dot' style='background:{COLORS.get(status, '#aaa')}'>"
            f"</span>{e(status)}</td>"
            f"<td>{_fmt(g.get('evidence'))}</td><td>{e(_estimate_text(gap, g) if shown else '–')}</td>"
            f"<td>{e(_fmt(g.get('ci')) if shown else '–')}</td>"
            f"<td>{e(g.get('explanation', ''))}</td>"
            f"<td>{e(g.get('next_step', ''))}</td></tr>"
        )
    drill = (report.get("figures") or {}).get("episodes") or {}
    drilled = {d["episode"] for d in drill.get("episodes", [])}

    def plots_cell(eid) -> str:
        return f"<a href='#episode-{int(eid)}'>episode plots</a>" if eid in drilled else "–"

    ep_rows = "".join(
        f"<tr><td>{int(ep['id'])}</td><td>{e(str(ep.get('name') or ''))}</td>"
        f"<td class='v-{e(ep['verdict'])}'>{e(ep['verdict'])}</td>"
        f"<td>{ep['score']:.3f}</td><td>{_fmt(ep['divergence_onset_step'])}</td>"
        f"<td>{ep['outside_competence_fraction']:.0%}</td><td>{plots_cell(ep['id'])}</td></tr>"
        for ep in sorted(report["episodes"], key=lambda x: -x["score"])[:50]
    )
    names = ((report.get("figures") or {}).get("worst_blocks") or {}).get("names", [])
    by_id = {ep["id"]: ep for ep in report["episodes"]}
    drill_items = "".join(
        f"<details class='episode' id='episode-{int(d['episode'])}'><summary>episode {int(d['episode'])}"
        f"{e(' (' + str(by_id[d['episode']]['name']) + ')') if by_id.get(d['episode'], {}).get('name') else ''}: "
        f"{e(by_id.get(d['episode'], {}).get('verdict', ''))}, score {_fmt(by_id.get(d['episode'], {}).get('score'))}"
        f"</summary><figure>{figure_img(episode_figure(d, drill, names), 'episode ' + str(d['episode']))}"
        f"<figcaption>Top: the divergence score of each block of episode {d['episode']} along the episode, against"
        f" the held-out real blocks' median and quantile. Below: its most divergent block"
        f" ({e(_block_span(d['worst_block']))}); black: the checked trajectory, blue: the world model's"
        f" prediction under the same commands.</figcaption></figure></details>"
        for d in drill.get("episodes", [])
    )
    pw = report["power"]
    power_rows = "".join(
        f"<tr><td>{e(g)}</td><td>{e(p['units'])}</td>"
        + "".join(f"<td>{size:g}: {prob:.0%}</td>" for size, prob in zip(p["sizes"], p["detection_probability"]))
        + f"<td><b>{_fmt(p['smallest_detected'])}</b></td></tr>"
        for g, p in pw["gaps"].items()
    )
    figs = []
    if report["divergence_curve"]["horizon_steps"]:  # empty when no block could be scored
        figs.append(
            f"<figure>{figure_img(divergence_figure(report), 'divergence vs horizon')}"
            "<figcaption>Standardised open-loop error vs horizon: checked episodes against held-out real episodes."
            "</figcaption></figure>"
        )
    if drilled:
        figs.append(
            "<p>The worst blocks against the model's prediction are in the <a href='#drilldown'>episode drill-down</a>"
            " below: the episodes holding the three most divergent blocks come first.</p>"
        )
    elif "episodes" not in (report.get("figures") or {}):  # a report.json from before the drill-down
        for caption, fig in overlay_figures(report):
            figs.append(
                f"<figure>{figure_img(fig, 'overlay')}<figcaption>Worst block: {e(caption)}. Black: the checked"
                " trajectory; blue: what the world model (trained on real logs) predicts under the same commands."
                "</figcaption></figure>"
            )
    prov = report["provenance"]
    th = report["thresholds"]
    warning = f"<p class='warn'>{e(th['calibration_warning'])}</p>" if th.get("calibration_warning") else ""
    banner = f"Verdict: <b>{e(v.upper())}</b> &nbsp; score {_fmt(s['score'])} &nbsp; top gap: {e(s['top_gap'])}"
    regimes_h = section("Where it diverges (operating regimes)", regime_section(report), "regimes-section")
    drill_h = section(
        "Episode drill-down",
        (
            f"<p>{len(drill.get('episodes', []))} episodes one by one: those holding the three most divergent blocks,"
            f" then the worst by score (open one, or follow an episode's link in the table above).</p>{drill_items}"
        )
        if drill_items
        else (
            "<p>No episode was long enough for a block.</p>"
            if "episodes" in (report.get("figures") or {})
            else "<p>Not in this report (written before the drill-down): re-run the check.</p>"
        ),
        "drilldown",
    )
    power_h = section(
        "What a pass is worth (power)",
        f"""<p>Detection probability of gaps injected into held-out real episodes, for a check of {pw["n_blocks"]} blocks, at
the calibrated threshold; the last column is the smallest gap detected (the smallest size, or the
largest where the sizes fall, as in motion_smaller) with probability &ge;
{pw["target"]:.0%}.{_power_note(pw)}</p>
<table id="power-table"><tr><th>gap</th><th>units</th><th colspan="4">size: detection probability</th>
<th>smallest gap detected</th></tr>{power_rows}</table>""",
        "power",
    )
    body = f"""<p id="message">{e(s["message"])}</p>
<p>{s["episodes"]} episodes checked: {s["consistent"]} consistent, {s["divergent"]} divergent, {
        s["unverifiable"]
    } unverifiable;
{s.get("competent_blocks", 0)} of {
        s.get("blocks", 0)
    } blocks inside the model's competence. False-alarm budget alpha = {s["alpha"]} per run
(thresholds from {e(str(th["source"]))}, {th.get("calibration_blocks")} held-out real blocks of
{th.get("calibration_episodes", "?")} real episodes the model never trained on{_folds_note(th)}).{
        _coverage_note(th)
    }</p>{warning}
{
        section(
            "Reality-gap table",
            '<table id="gap-table"><tr><th>gap</th><th>status</th><th>evidence (&ge;1 = present)</th><th>estimate</th>'
            "<th>90% interval</th><th>evidence detail</th><th>what to do next</th></tr>" + "".join(rows) + "</table>",
            "gaps",
        )
    }
{regimes_h}
{section("Divergence vs horizon", "".join(figs), "overlays")}
{_policy_html(report)}
{
        section(
            "Episodes (worst first)",
            "<table id='episode-table'><tr><th>id</th><th>name</th><th>verdict</th><th>score</th>"
            "<th>divergence onset (step)</th><th>outside competence</th><th>plots</th></tr>" + ep_rows + "</table>",
            "episodes",
        )
    }
{drill_h}
{power_h}
{section("The model (quality card)", _quality_html(prov.get("model_quality")), "quality")}
{
        section(
            "Provenance",
            f"<p><code>{e(prov['command'])}</code><br>wmcheck {e(prov['wmcheck_version'])}; model sha256 "
            f"{e(prov['model_sha256'][:16])}…; training data sha256 {e(prov['training_data_sha256'][:16])}…; rollouts "
            f"{e(prov['rollouts'])} ({e(prov['rollouts_sha256'][:16])}…); {prov['seconds']} s.</p>",
            "provenance",
        )
    }
{OPEN_TARGET_JS}
<script type="application/json" id="report-json">{
        e(json.dumps({k: report[k] for k in ("verdict", "summary")}))
    }</script>"""
    return page(f"wmcheck report: {v}", VERDICT_COLORS[v], banner, body)
