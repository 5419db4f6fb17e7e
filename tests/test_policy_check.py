"""The closed-loop policy check end to end: a swing-up controller on Pendulum-v1, no mocks.

"Reality" is Pendulum-v1; its logs are recorded under sample-and-hold torques and under the
swing-up controller with held torque noise (an operator's controller with excitation), so the world
model has seen the states the policy visits. The checked policy is the noise-free controller
(`policy_helpers:swing_up`). The check runs it in a simulator and inside the world model from the
same initial conditions. A faithful simulator must not be flagged (a detector that flags everything
fails here); a simulator whose pendulum is much lighter (the same torque swings it up far faster,
so the policy's success there owes much to the simulator) must be (one that flags nothing fails
there). The gate's policy requirements fail the check when unmet and pass it when met.
"""

from __future__ import annotations

import json
from pathlib import Path

import browser
import numpy as np
import pytest

from wmcheck.checks.check import run_check
from wmcheck.checks.config import POLICY_GATE_DEFAULTS, Gate
from wmcheck.checks.policy_check import PolicyRun, gate_power, policy_gate
from wmcheck.checks.reality import RealityProfile, reality_env_args, record_reality
from wmcheck.checks.report_write import schema, write_outputs
from wmcheck.datasets.episode import LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import write_log
from wmcheck.datasets.record import record_to_log
from wmcheck.scripts.cli import main

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
LIGHTER = RealityProfile(physics={"m": {"scale": 0.4}}, name="pendulum mass x0.4")


@pytest.fixture(autouse=True)
def _helpers_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # policy_helpers:... as the CLI's module:callable


@pytest.fixture(scope="module")
def swing_reality(tmp_path_factory, check_trainer):
    import sys

    sys.path.insert(0, str(HERE))
    from policy_helpers import NoisySwingUp

    tmp = tmp_path_factory.mktemp("swing")
    hold = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=30, max_steps=200, seed=0)
    ctrl = record_reality("Pendulum-v1", RealityProfile(), NoisySwingUp(), episodes=30, max_steps=200, seed=100)
    for i, e in enumerate(hold + ctrl):
        e.id = i
    meta = LogMeta(
        source="real", dt=0.05, observation_names=["cos_theta", "sin_theta", "theta_dot"], action_names=["torque"]
    )
    write_log(tmp / "real.h5", hold + ctrl, meta)
    return check_trainer(tmp, tmp / "real.h5", 2000), tmp


def test_faithful_simulator_policy_passes_cli(swing_reality, tmp_path):
    run, _ = swing_reality
    gate = tmp_path / "gate.yaml"
    gate.write_text("policy: {min_episodes: 8, min_success_rate: 0.85}\n")
    out = tmp_path / "report"
    code = main(
        [
            "check",
            str(run),
            "--env",
            "Pendulum-v1",
            "--policy",
            "policy_helpers:swing_up",
            "--success",
            "policy_helpers:upright",
            "--episodes",
            "8",
            "--max-steps",
            "200",
            "--seed",
            "5000",
            "--gate",
            str(gate),
            "--out",
            str(out),
            "--no-tensorboard",
        ]
    )
    report = json.loads((out / "report.json").read_text())
    pol = report["policy"]
    # the paired comparison is present and sensible: same initial conditions, returns close
    r = pol["returns"]
    assert pol["episodes"] == 8 and pol["closed_loop_episodes"] == 8 and pol["closed_loop_samples"] == 8
    assert r["simulator"]["mean"] < 0 and r["model"]["mean"] < 0  # Pendulum's rewards are costs
    assert not r["differs"], r
    lo, hi = r["paired_difference_ci"]
    assert lo <= r["paired_difference_mean"] <= hi
    assert not pol["exploitation"]["flag"], pol["exploitation"]
    # success from the callable, in the simulator and (the same rule) inside the model
    assert pol["success"]["source"] == "callable" and pol["success"]["simulator_rate"] >= 0.85
    assert pol["success"]["model_rate"] is not None and pol["success"]["model_rate"] >= 0.5
    assert pol["coverage"]["fraction_in_support"] > 0.8
    g = pol["gate"]
    assert g["passed"] and g["min_episodes"] == 8 and g["min_success_rate"] == 0.85 and g["episodes"] == 8
    assert code == report["exit_code"] and (code == 0) == (report["verdict"] == "pass")
    assert "policy gate" not in report["summary"]["message"]
    # report.json validates against the versioned schema; the HTML shows the section and its figures
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, schema())
    page = (out / "report.html").read_text()
    assert 'id="policy"' in page and 'id="policy-gate"' in page and "&ge; 8" in page
    dom = browser.dom((out / "report.html"), tmp_path)
    assert 'id="policy-gate"' in dom and "simulator success rate (callable)" in dom and 'alt="policy returns"' in dom


@pytest.fixture(scope="module")
def lighter_report(swing_reality):
    """The policy in a simulator whose pendulum is 0.4x as heavy as reality's; success read from the
    env's info (`policy_helpers:UprightPendulum` reports is_success)."""
    run, tmp = swing_reality
    env_id, kwargs = reality_env_args("policy_helpers:UprightPendulum", LIGHTER)
    outcomes = {}
    path = tmp / "lighter.h5"
    record_to_log(
        path,
        env_id,
        "policy_helpers:swing_up",
        episodes=40,
        max_steps=200,
        seed=5000,
        env_kwargs=kwargs,
        source="policy",
        outcomes=outcomes,
    )
    policy = PolicyRun(env_id, "policy_helpers:swing_up", kwargs, None, outcomes)
    return run_check(run, path, Gate(policy={"min_episodes": 8, "min_success_rate": 0.85}), policy=policy)


def test_simulator_artefact_exploitation_flagged(lighter_report, tmp_path):
    report = lighter_report
    pol = report["policy"]
    assert pol["success"]["source"] == "info:is_success" and pol["success"]["simulator_rate"] >= 0.85
    assert pol["success"]["model_rate"] is None  # an info-based rule cannot judge the model's rollouts
    x = pol["exploitation"]
    assert x["flag"] and x["p_value"] < 0.05, x
    assert pol["returns"]["paired_difference_mean"] > 0 and pol["returns"]["paired_difference_ci"][0] > 0
    assert x["above_model_range"] >= 1 and x["episodes"], x
    split = [e for e in x["episodes"] if e["split_step"] is not None]
    assert split and all(16 <= e["split_step"] <= 200 for e in split)
    assert set(split[0]["simulator_state"]) == {"cos_theta", "sin_theta", "theta_dot"}
    # the gate fails on exploitation even though episodes and success rate meet it
    assert report["verdict"] == "fail" and report["exit_code"] == 1
    assert not pol["gate"]["passed"] and any("relies on the simulator" in r for r in pol["gate"]["reasons"])
    assert "policy gate is not met" in report["summary"]["message"]
    paths = write_outputs(report, tmp_path / "r")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "r" / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "check/policy/exploitation_flag",
        "check/policy/success_rate",
        "check/policy/return_difference",
        "check/policy/coverage",
        "check/policy/gate_passed",
    } <= tags, tags
    assert events.Scalars("check/policy/exploitation_flag")[0].value == 1.0
    assert "High-return episodes above every model rollout" in paths["html"].read_text()


def test_policy_gate_requirements():
    success = {"simulator_rate": 0.9, "successes": 900, "known": 1000}
    none = {"simulator_rate": None, "successes": 0, "known": 0}
    assert policy_gate({}, 1000, success, False)["passed"]  # field practice: defaults met
    # the default episode minimum warns, with the power the episodes buy; set in the gate file it binds
    power = {"text": "a return excess smaller than 3 per episode would go unseen"}
    few = policy_gate({}, 999, success, False, power)
    assert few["passed"] and not few["reasons"] and "1000" in few["warnings"][0] and "unseen" in few["warnings"][0]
    binding = policy_gate({"min_episodes": 1000}, 999, success, False, power)
    assert not binding["passed"] and "at least 1000" in binding["reasons"][0] and binding["binding"] == ["min_episodes"]
    # a low success rate fails where success is defined, by default or by the gate file
    assert not policy_gate({}, 1000, {"simulator_rate": 0.5, "successes": 500, "known": 1000}, False)["passed"]
    low = policy_gate({"min_success_rate": 0.95}, 1000, success, False)
    assert not low["passed"] and "90.0%" in low["reasons"][0] and "95%" in low["reasons"][0]
    # no success signal: not evaluated under the default, a failure when the gate file asks for a rate
    unknown = policy_gate({"min_episodes": 5}, 10, none, False)
    assert unknown["passed"] and not unknown["success_evaluated"]
    required = policy_gate({"min_success_rate": 0.85}, 10, none, False)
    assert not required["passed"] and "--success" in required["reasons"][0] and required["success_evaluated"]
    assert policy_gate({"min_success_rate": 0.0}, 10, none, False)["passed"]
    assert not policy_gate({"min_episodes": 5}, 10, success, True)["passed"]
    assert Gate().policy == {} and POLICY_GATE_DEFAULTS == {"min_episodes": 1000, "min_success_rate": 0.85}
    assert Gate().policy_requirement("min_episodes") == 1000


def test_gate_power_is_measured():
    # The smallest detectable excess shrinks as 1/sqrt(n) and grows with the spread of the differences;
    # the success interval is Wilson's (at p = 0.5, n = 100: +-9.6%).
    rng = np.random.default_rng(0)
    d = rng.normal(0, 1, 400)
    p100 = gate_power(d[:100], np.zeros(100), 0.05, {"simulator_rate": 0.5, "known": 100}, 100)
    p400 = gate_power(d, np.zeros(400), 0.05, {"simulator_rate": 0.5, "known": 400}, 400)
    ratio = p100["min_detectable_return_excess"] / p400["min_detectable_return_excess"]
    assert 1.8 < ratio < 2.2, ratio
    assert abs(p100["min_detectable_return_excess"] - 2.486 * np.std(d[:100], ddof=1) / 10) < 1e-3
    assert abs(p100["success_rate_halfwidth"] - 0.0962) < 2e-3
    wide = gate_power(3 * d[:100], np.zeros(100), 0.05, {"simulator_rate": None, "known": 0}, 100)
    assert wide["min_detectable_return_excess"] > 2.5 * p100["min_detectable_return_excess"]
    assert wide["success_rate_halfwidth"] is None and "unseen" in wide["text"]


def test_gate_file_policy_keys(tmp_path):
    good = tmp_path / "g.yaml"
    good.write_text("policy: {min_episodes: 5}\n")
    assert Gate.load(good).policy == {"min_episodes": 5}  # only what the file sets binds
    assert Gate.load(good).policy_requirement("min_success_rate") == 0.85
    for text, match in (
        ("policy: {min_episodes: 0}\n", "min_episodes"),
        ("policy: {min_success_rate: 1.5}\n", "min_success_rate"),
        ("policy: {episodes: 5}\n", "unknown policy keys"),
        ("policy: 5\n", "mapping"),
    ):
        bad = tmp_path / "b.yaml"
        bad.write_text(text)
        with pytest.raises(UserError, match=match):
            Gate.load(bad)


def test_default_gate_fails_few_episodes_and_low_success_cli(swing_reality, tmp_path):
    # A policy that cannot swing the pendulum up, 3 episodes, the default gate (1000 episodes, 85%):
    # both requirements fail, the report says so, and the exit code is 1.
    run, _ = swing_reality
    out = tmp_path / "weak"
    code = main(
        [
            "check",
            str(run),
            "--env",
            "policy_helpers:UprightPendulum",
            "--policy",
            "policy_helpers:idle",
            "--episodes",
            "3",
            "--max-steps",
            "200",
            "--out",
            str(out),
            "--no-tensorboard",
        ]
    )
    report = json.loads((out / "report.json").read_text())
    g = report["policy"]["gate"]
    assert code == 1 and report["exit_code"] == 1 and report["verdict"] == "fail"
    assert report["policy"]["success"]["source"] == "info:is_success"
    assert g["episodes"] == 3 and g["success_rate"] == 0.0 and not g["passed"]
    assert any("85%" in r for r in g["reasons"]) and not any("1000" in r for r in g["reasons"])
    # too few episodes under the default minimum: a warning naming what 3 episodes can resolve
    assert any("field practice is at least 1000" in w and "unseen" in w for w in g["warnings"]), g["warnings"]
    assert "Policy gate warning" in report["summary"]["message"]
    assert "policy gate is not met" in report["summary"]["message"]


def test_policy_cli_bad_input_exit_2(swing_reality, tmp_path):
    run, _ = swing_reality
    base = ["check", str(run), "--out", str(tmp_path / "x"), "--no-tensorboard"]
    assert main(base + ["--policy", "policy_helpers:swing_up"]) == 2  # a policy needs --env
    assert main(base + ["--env", "Pendulum-v1", "--policy", "hold:5", "--success", "policy_helpers:upright"]) == 2
    assert (
        main(
            base
            + [
                "--env",
                "Pendulum-v1",
                "--policy",
                "policy_helpers:swing_up",
                "--success",
                "policy_helpers:nope",
                "--episodes",
                "1",
                "--max-steps",
                "80",
            ]
        )
        == 2
    )
    assert not (tmp_path / "x" / "report.json").exists()
