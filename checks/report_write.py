"""Writing a check's outputs: report.json (schema-versioned), report.html and a TensorBoard run.

Owns the output folder layout (REPORTDIR/report.json, report.html, tb/: one TensorBoard run, no
sub-runs) and atomic writes: each file is written under a temporary name and renamed, so a killed
check never leaves a half report, and the old pair is removed first, so a report.json never sits
beside another run's report.html.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np

from wmcheck.checks.report_html import (
    divergence_figure,
    overlay_figures,
    policy_return_figure,
    regime_figure,
    render_html,
)
from wmcheck.datasets.atomic import write_text_atomic


def schema() -> dict:
    return json.loads((resources.files("wmcheck.checks") / "schema" / "report.schema.json").read_text())


def public_report(report: dict) -> dict:
    return {k: v for k, v in report.items() if not k.startswith("_")}


def write_outputs(report: dict, out_dir: str | Path, tensorboard: bool = True) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "html": out / "report.html"}
    # Both texts are made before anything is touched (a failure leaves the old set as it was); then
    # the old set is removed and the HTML written before the JSON, so a report.json on disk always
    # has its own report.html beside it: a kill between the two leaves no JSON, never a mixed pair.
    text_json = json.dumps(public_report(report), indent=2, allow_nan=False)
    text_html = render_html(report)
    for old in (paths["json"], paths["html"]):
        old.unlink(missing_ok=True)
    write_text_atomic(paths["html"], text_html)
    write_text_atomic(paths["json"], text_json)
    if tensorboard:
        paths["tensorboard"] = write_tensorboard(report, out / "tb")
    return paths


DIVERGENCE_TAG = "check/divergence_vs_horizon"
"""Scalar tags `<tag>/checked` and `<tag>/real`: mean standardised error by open-loop horizon (x = steps)."""


def write_tensorboard(report: dict, logdir: Path) -> Path:
    """The check as ONE TensorBoard run in `logdir` (every summary in this writer's own folder)."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(logdir))
    s = report["summary"]
    if s["score"] is not None:
        w.add_scalar("check/score", s["score"], 0)
    w.add_scalar("check/pass", 1.0 if report["verdict"] == "pass" else 0.0, 0)
    for key in ("divergent", "unverifiable", "consistent"):
        w.add_scalar(f"check/episodes_{key}", s[key], 0)
    for gap, g in report["gaps"].items():
        if g.get("evidence") is not None:
            w.add_scalar(f"check/evidence/{gap}", g["evidence"], 0)
    curve = report["divergence_curve"]
    # Two plain tags and a Custom Scalars chart overlaying them, in this one run: `add_scalars` would
    # write each curve into a sub-folder of its own (tb/check_divergence_vs_horizon_checked, ..._real),
    # which TensorBoard lists as two more runs beside the check's.
    for h, c, r in zip(curve["horizon_steps"], curve["checked_mean"], curve["real_mean"]):
        w.add_scalar(f"{DIVERGENCE_TAG}/checked", c, h)
        w.add_scalar(f"{DIVERGENCE_TAG}/real", r, h)
    if curve["horizon_steps"]:
        w.add_custom_scalars(
            {"check": {"divergence vs horizon": ["Multiline", [f"{DIVERGENCE_TAG}/checked", f"{DIVERGENCE_TAG}/real"]]}}
        )
        w.add_figure("check/divergence_vs_horizon_fig", divergence_figure(report), 0)
    for i, (_caption, fig) in enumerate(overlay_figures(report)):
        w.add_figure(f"check/worst_block_{i}", fig, 0)
    reg = report.get("regimes")
    if reg:
        w.add_scalar("check/regimes/diverging", len(reg["regimes"]), 0)
        w.add_scalar("check/regimes/not_competent", len(reg["not_competent"]), 0)
        flagged = {r["channel"] for r in reg["regimes"]}
        obs = list(reg["channels"][0]["bins"][0]["effect"]) if reg["channels"] and reg["channels"][0]["bins"] else []
        for c in reg["channels"]:
            if c["name"] in flagged:
                for o in obs:
                    w.add_figure(f"check/regimes/{o}_by_{c['name']}", regime_figure(c, o), 0)
        if reg["regimes"] or reg["not_competent"]:
            w.add_text("check/regimes", "\n\n".join(r["text"] for r in reg["regimes"] + reg["not_competent"]), 0)
    emb = report.get("_embedding")
    if emb is not None:
        w.add_embedding(np.asarray(emb["features"]), metadata=emb["labels"], tag="check/latent_states")
    pol = report.get("policy")
    if pol:
        g, r, x = pol["gate"], pol["returns"], pol["exploitation"]
        scalars = {
            "episodes": g["episodes"],
            "success_rate": g["success_rate"],
            "model_success_rate": pol["success"]["model_rate"],
            "gate_passed": float(g["passed"]),
            "return_simulator": r["simulator"]["mean"],
            "return_model": r["model"]["mean"],
            "return_difference": r["paired_difference_mean"],
            "return_p_value": r["p_value"],
            "inside_model_range": r["inside_model_range"],
            "exploitation_flag": float(x["flag"]),
            "exploitation_p_value": x["p_value"],
            "coverage": pol["coverage"]["fraction_in_support"],
            "visitation_p_value": pol["visitation"]["p_value"],
        }
        for key, value in scalars.items():
            if value is not None:
                w.add_scalar(f"check/policy/{key}", float(value), 0)
        if (report.get("figures") or {}).get("policy_returns"):
            w.add_figure("check/policy/returns_fig", policy_return_figure(report), 0)
    for key, frames in (report.get("_video") or {}).items():  # camera models: worst blocks, true / pred / error
        from wmcheck.training.openloop_video import log_video

        log_video(w, f"check/openloop_video/{key}", frames, 0)
    w.add_text("check/summary", s["message"], 0)
    w.close()
    return logdir
