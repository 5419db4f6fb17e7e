"""The README's main-job command and the synthetic demo, with tiny training budgets: real data in,
a model trained, a simulator and a policy checked, reports written, paths printed."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from wmcheck.checks.report_write import schema as load_schema


def _demo(tmp_path, *extra):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wmcheck.scripts.cli",
            "--threads",
            "1",
            "demo",
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    # the demo exits 0 when it ran, whatever its checks found (a found gap is its result)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return out, proc


@pytest.mark.slow
def test_wind_demo_runs_end_to_end(tmp_path):
    out, proc = _demo(tmp_path, "--max-steps", "20")
    assert "episodes         20 produced" in proc.stdout  # the embedded subset, cut into weeks
    assert "findings: 0 error(s)" in proc.stdout
    assert (out / "run" / "model.pt").exists() and (out / "la-haute-borne-R80721.h5").exists()
    reports = []
    for name in ("report-simulator", "report-policy"):
        report = json.loads((out / name / "report.json").read_text())
        jsonschema.validate(report, load_schema())
        assert (out / name / "report.html").exists() and (out / name / "tb").is_dir()
        assert report["regimes"] is not None and report["regimes"]["channels"]
        assert str(out / name / "report.html") in proc.stdout
        reports.append(report)
    assert (
        reports[0]["provenance"]["rollouts_source"] == "sim" and reports[1]["provenance"]["rollouts_source"] == "policy"
    )
    # the simulator replays the held-out weeks' logged weather and commands: every block has a real
    # twin and the pooled test is paired; the policy's yaw changes the vane angle, so it has none
    assert reports[0]["summary"]["pooled_test"].startswith("paired"), reports[0]["summary"]["pooled_test"]
    assert reports[1]["summary"]["pooled_test"].startswith("unpaired"), reports[1]["summary"]["pooled_test"]
    # and so is the open-loop bias test of the dynamics row, whose cells are in the channel's units
    bias = [r["gaps"]["dynamics"]["estimate"]["bias"] for r in reports]
    assert bias[0]["paired"] is True and bias[1]["paired"] is False, bias
    overall = [c for c in bias[0]["cells"] if c["where"] is None]
    assert sorted(c["channel"] for c in overall) == sorted(c["name"] for c in reports[0]["channels"]), overall
    assert all(c["ci95"][0] <= c["difference"] <= c["ci95"][1] for c in overall), overall
    # the last line names each check's verdict, as its report says it
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("demo finished: "), last
    assert f"power-curve simulator: {reports[0]['verdict'].upper()}" in last
    assert f"yaw/pitch policy: {reports[1]['verdict'].upper()}" in last
    assert f"tensorboard --logdir {out}" in proc.stdout


@pytest.mark.slow
def test_synthetic_demo_prints_findings_next_to_the_truth(tmp_path):
    out, proc = _demo(tmp_path, "--synthetic", "--max-steps", "20", "--episodes", "6")
    assert "injected truth" in proc.stdout
    for folder in ("faithful", "latency-2", "weak-actuator"):
        report = json.loads((out / f"report-{folder}" / "report.json").read_text())
        assert report["verdict"] in ("pass", "fail", "unverifiable", "inconclusive")
    assert "latency: 2 steps" in proc.stdout and "actuator: gain 0.5" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("demo finished: ")
