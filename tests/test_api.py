"""The Python API (`import wmcheck`): cheap to import, versioned, and the same verdict as the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest

import wmcheck
from wmcheck.scripts.cli import main


def test_import_is_cheap_and_versioned():
    code = "import sys, wmcheck; print(wmcheck.__version__); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == wmcheck.__version__ and out[0] != "0+unknown" and out[1] == "False"
    assert {"train", "calibrate", "check", "load_report", "Report", "GapRow"} <= set(dir(wmcheck))
    with pytest.raises(AttributeError):
        wmcheck.no_such_thing  # noqa: B018


def test_check_from_python_matches_the_cli(pendulum_checked, tmp_path):
    run, _, _ = pendulum_checked
    env = gym.make("Pendulum-v1")  # an Env instance: recorded, and left open for the caller
    report = wmcheck.check(
        run, tmp_path / "api", env=env, policy="hold:5", episodes=6, max_steps=200, seed=3, tensorboard=False
    )
    env.reset(seed=0)
    assert report.verdict in ("pass", "fail", "unverifiable", "inconclusive")
    assert report.exit_code == {"pass": 0, "fail": 1, "unverifiable": 1, "inconclusive": 3}[report.verdict]
    assert set(report.gaps) >= {"latency", "actuator", "sensor_noise", "dynamics", "distribution"}
    assert all(g.status in ("present", "absent", "tolerated", "not_checked") for g in report.gaps.values())
    assert report.paths["json"].is_file() and report.paths["html"].is_file()
    # the saved report reads back equal; the CLI on the same rollouts gives the same verdict
    again = wmcheck.load_report(tmp_path / "api")
    assert again.data == report.data and again.verdict == report.verdict and again.message == report.message
    code = main(
        [
            "check",
            str(run),
            "--rollouts",
            str(tmp_path / "api" / "rollouts.h5"),
            "--seed",
            "3",
            "--out",
            str(tmp_path / "cli"),
            "--no-tensorboard",
        ]
    )
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert code == report.exit_code and cli["verdict"] == report.verdict and cli["gaps"].keys() == report.gaps.keys()
    # bad input is a UserError naming the fix
    with pytest.raises(wmcheck.UserError, match="give one of rollouts and env"):
        wmcheck.check(run, tmp_path / "x")
    with pytest.raises(wmcheck.UserError, match="unknown keys"):
        wmcheck.check(run, tmp_path / "x", rollouts=tmp_path / "api" / "rollouts.h5", gate={"alhpa": 0.01})
    with pytest.raises(wmcheck.UserError, match="no report"):
        wmcheck.load_report(tmp_path / "nothing")
