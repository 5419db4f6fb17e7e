"""The shadow report's outputs: shadow.json and a self-contained shadow.html (written atomically)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from wmcheck.checks.report_html import FIG_WIDTH, figure_img, page
from wmcheck.datasets.atomic import write_text_atomic

COLORS = {"better": "#2e7d32", "no difference": "#2e7d32", "worse": "#c62828", "unverifiable": "#ef6c00"}


def difference_figure(report: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = report["per_start"]
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 3.6))
    ok = [d for d, out in zip(ps["difference"], ps["leaves"]) if not out]
    gone = [d for d, out in zip(ps["difference"], ps["leaves"]) if out]
    ax.hist([ok, gone], bins=30, stacked=True, label=["inside competence", "proposals leave competence"])
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(f"predicted return difference per {report['return_difference']['per']} (proposals - baseline)")
    ax.set_ylabel("starts")
    ax.legend(fontsize=8)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def render_shadow_html(report: dict) -> str:
    e = html.escape
    v, rd, comp = report["verdict"], report["return_difference"], report["competence"]
    rows = "".join(
        f"<tr><td>{e(c['name'])}</td><td>{e(str(c['unit'] or ''))}</td><td>{_f(c['mean_difference'])}</td>"
        f"<td>{_f(c['mean_abs_difference'])}</td></tr>"
        for c in report["over_the_horizon"]
    )
    ci = "–" if rd["ci95"] is None else f"{rd['ci95'][0]:+.3g} to {rd['ci95'][1]:+.3g}"
    body = f"""<p id="message">{e(report["message"])}</p>
<p>Objective: {e(report["objective"])}.</p>
<table id="summary"><tr><th>episodes</th><th>starts</th><th>judged (inside competence)</th><th>return difference per {e(rd["per"])}</th>
<th>95 % CI</th><th>model's error on the logged return</th><th>proposals leave competence</th><th>baseline leaves competence</th></tr>
<tr><td>{report["episodes"]}</td><td>{report["starts"]}</td><td>{report["competent_starts"]}</td><td>{_f(rd["mean"])}</td><td>{ci}</td>
<td>{_f(rd["model_resolution"])}</td><td>{comp["proposals_leave"]:.0%}</td><td>{comp["baseline_leaves"]:.0%}</td></tr></table>
<h2>Where the proposals lead (predicted observations over the horizon, proposals minus baseline)</h2>
<table><tr><th>channel</th><th>unit</th><th>mean difference</th><th>mean |difference|</th></tr>{rows}</table>
<figure>{figure_img(difference_figure(report), "return differences")}<figcaption>Predicted return difference
of every start: following the logged proposals against the logged baseline commands, from the same latent state.</figcaption></figure>
<h2>Provenance</h2><p><code>{e(str(report["provenance"]["command"]))}</code><br>wmcheck {e(report["provenance"]["wmcheck_version"])};
model sha256 {e(report["provenance"]["model_sha256"][:16])}…; log {e(report["provenance"]["log"])}</p>"""
    return page(f"wmcheck shadow: {v}", COLORS[v], f"Shadow: <b>{e(v.upper())}</b>", body)


def _f(x) -> str:
    return "–" if x is None else f"{x:+.4g}"


def write_shadow_outputs(report: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "shadow.json", "html": out_dir / "shadow.html"}
    text = json.dumps(report, indent=2, allow_nan=False)
    write_text_atomic(paths["html"], render_shadow_html(report))
    write_text_atomic(paths["json"], text)
    return paths
