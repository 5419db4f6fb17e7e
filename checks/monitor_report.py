"""The monitor's outputs: monitor.json, monitor.html (self-contained, trend plots over looks) and
TensorBoard scalars with the look number as the step (only the looks this run added: earlier runs
wrote theirs). Each file is written under a temporary name and renamed."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from wmcheck.checks.report_html import FIG_WIDTH, figure_img, page
from wmcheck.datasets.atomic import write_text_atomic

COLORS = {"stable": "#2e7d32", "drifted": "#c62828", "off-support": "#ef6c00", "inconclusive": "#6d4c41"}


def p_value_figure(report: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    looks = report["looks"]
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 3.6))
    x = [lk["look"] for lk in looks]
    for w in report["settings"]["windows"]:
        p = [lk["windows"][str(w)]["p_value"] for lk in looks]
        ax.semilogy(x, p, "o-", label=f"{w}-period window")
    if looks:
        ax.axhline(
            looks[0]["windows"][str(report["settings"]["windows"][0])]["level"], color="k", ls="--", label="level"
        )
    for lk in looks:
        if lk["verdict"] != "stable":
            ax.axvspan(lk["look"] - 0.4, lk["look"] + 0.4, color=COLORS[lk["verdict"]], alpha=0.15)
    ax.set_xlabel("look")
    ax.set_ylabel("p-value (max over features)")
    ax.legend(fontsize=8)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def bias_figure(report: dict, max_channels: int = 6):
    """Per observation channel, the one-period bias estimate over looks (physical units)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f for f in report["features"] if f.startswith("bias:")][:max_channels]
    looks = report["looks"]
    fig, axes = plt.subplots(len(names), 1, figsize=(FIG_WIDTH, 1.8 * len(names) + 0.6), sharex=True, squeeze=False)
    x = [lk["look"] for lk in looks]
    for ax, name in zip(axes[:, 0], names):
        ax.plot(x, [lk["estimates"][name] for lk in looks], "o-")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_ylabel(name.split(":", 1)[1], fontsize=8)
    axes[-1, 0].set_xlabel("look")
    fig.suptitle("bias against the model's prediction, per period", fontsize=9)
    fig.set_layout_engine("tight")  # laid out in the one draw that renders it (report_html._png)
    return fig


def render_monitor_html(report: dict) -> str:
    e = html.escape
    v = report["verdict"] or "no looks yet"
    wins = report["settings"]["windows"]
    rows = "".join(
        f"<tr><td>{lk['look']}</td><td>{e(lk['label'])}</td><td>{lk['episodes']}</td>"
        f"<td style='color:{COLORS[lk['verdict']]}'><b>{e(lk['verdict'])}</b></td>"
        + "".join(
            f"<td>{lk['windows'][str(w)]['p_value']:.2g}{'' if lk['windows'][str(w)]['can_fire'] else ' (cannot reach level)'}</td>"
            for w in wins
        )
        + f"<td>{e(lk['sentence'])}</td></tr>"
        for lk in reversed(report["looks"])
    )
    figs = ""
    if report["looks"]:
        figs = (
            f"<figure>{figure_img(p_value_figure(report), 'p-values over looks')}<figcaption>Each window's "
            "p-value per look against the level every test is run at; shaded looks did not come out stable.</figcaption></figure>"
            f"<figure>{figure_img(bias_figure(report), 'bias over looks')}<figcaption>The one-period bias "
            "estimate of each channel (checked truth minus the model's open-loop prediction, physical units).</figcaption></figure>"
        )
    color = COLORS.get(report["verdict"], "#555")
    prov = report["provenance"]
    body = f"""<p id="message">{e(report["message"])}</p>
<p>Reference: {report["reference"]["episodes"]} {e(report["reference"]["what"])}. {e(report["guarantee"])}.
{report["pending_episodes"]} episode(s) wait for a full period; {len(report["short_episodes"])} were too short to score in this run.</p>
<h2>Looks (latest first)</h2>
<table id="looks"><tr><th>look</th><th>period</th><th>episodes</th><th>verdict</th>
{"".join(f"<th>p, {w}-period window</th>" for w in wins)}<th>what it says</th></tr>{rows}</table>
<h2>Trends</h2>
{figs}
<h2>Provenance</h2>
<p><code>{e(str(prov["command"]))}</code><br>wmcheck {e(prov["wmcheck_version"])}; model sha256 {e(prov["model_sha256"][:16])}…; {prov["seconds"]} s.</p>
<script type="application/json" id="monitor-json">{e(json.dumps({"verdict": report["verdict"], "exit_code": report["exit_code"]}))}</script>"""
    return page(f"wmcheck monitor: {v}", color, f"Latest look: <b>{e(v.upper())}</b>", body)


def write_monitor_outputs(report: dict, out_dir: Path, tensorboard: bool = True) -> dict[str, Path]:
    paths = {"json": out_dir / "monitor.json", "html": out_dir / "monitor.html"}
    text_json = json.dumps(report, indent=2, allow_nan=False)
    write_text_atomic(paths["html"], render_monitor_html(report))
    write_text_atomic(paths["json"], text_json)
    if tensorboard and report["new_looks"]:
        paths["tensorboard"] = _tensorboard(report, out_dir / "tb")
    return paths


def _tensorboard(report: dict, logdir: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(logdir))
    code = {"stable": 0.0, "drifted": 1.0, "off-support": 2.0, "inconclusive": -1.0}
    for lk in report["looks"]:
        if lk["look"] not in report["new_looks"]:
            continue
        step = lk["look"]
        w.add_scalar("monitor/verdict", code[lk["verdict"]], step)
        for win, t in lk["windows"].items():
            w.add_scalar(f"monitor/p_value/window_{win}", t["p_value"], step)
        for name, value in lk["estimates"].items():
            if np.isfinite(value):
                w.add_scalar(f"monitor/estimate/{name.replace(':', '/')}", value, step)
        w.add_text("monitor/look", f"{lk['label']}: {lk['verdict']}. {lk['sentence']}", step)
    w.close()
    return logdir
