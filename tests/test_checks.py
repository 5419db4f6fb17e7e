"""The consistency check end to end on a known "reality" (gymnasium + injected gaps, no mocks).

A world model is trained once on Pendulum-v1 logs recorded under an exciting policy; simulators
are then built from the same env with known gaps. The check must pass faithful simulators (a
detector that flags everything fails here), detect each gap at a clear size and attribute it with
a sensible estimate (one that flags nothing fails there), and call a simulator that visits states
the real logs never saw `unverifiable`, never `pass`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import browser
import numpy as np
import pytest

from wmcheck.checks.check import run_check
from wmcheck.checks.config import Gate
from wmcheck.checks.reality import RealityProfile, record_reality
from wmcheck.checks.report_write import schema, write_outputs
from wmcheck.datasets.episode import LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.record import record_episodes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pendulum(pendulum_checked):
    return pendulum_checked  # conftest: trained once per session, shared with the policy tests


def _sim(
    tmp: Path,
    meta: LogMeta,
    name: str,
    profile: RealityProfile,
    policy="hold:5",
    seed=5000,
    env="Pendulum-v1",
    episodes=8,
) -> Path:
    eps = record_reality(env, profile, policy, episodes=episodes, max_steps=200, seed=seed)
    path = tmp / f"{name}.h5"
    write_log(path, eps, LogMeta(**{**meta.__dict__, "source": "sim"}))
    return path


def _present(report) -> set[str]:
    return {g for g, e in report["gaps"].items() if e["verdict"] == "present"}


def test_faithful_simulator_passes(pendulum, tmp_path):
    from wmcheck.scripts.cli import main

    run, meta, tmp = pendulum
    sim = _sim(tmp, meta, "faithful", RealityProfile())
    code = main(["check", str(run), "--rollouts", str(sim), "--out", str(tmp_path / "ok"), "--no-tensorboard"])
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert (tmp_path / "ok" / "report.html").exists()
    assert report["summary"]["top_gap"] == "none"
    assert _present(report) == set()
    assert report["summary"]["score"] < 0.75
    # No pass without power: a pass states what it would have caught; where the power table shows a
    # gap type this check could not have seen, the verdict is inconclusive (exit 3), never pass.
    power = report["power"]["gaps"]
    if all(p["reliable"] and p["smallest_detected"] is not None for p in power.values()):
        assert report["verdict"] == "pass" and report["exit_code"] == 0 and code == 0, report["summary"]
        assert "would have caught" in report["summary"]["message"]
        assert "dynamics row's power is measured as a plant that moves" in report["summary"]["message"]  # and no more
    else:
        assert report["verdict"] == "inconclusive" and report["exit_code"] == 3 and code == 3, report["summary"]
        assert report["summary"]["missing_power"] and "INCONCLUSIVE" in report["summary"]["message"]
    # the team may accept a partial pass explicitly: no gap type required
    partial = run_check(run, sim, Gate(require_power=[]))
    assert partial["verdict"] == "pass" and partial["exit_code"] == 0
    # what the pass says it would have caught is what its power table shows detected (never a 0 % size)
    caught = re.search(r"would have caught: (.*?)\.(?: |$)", partial["summary"]["message"]).group(1)
    claims = [] if caught == "none of the injected gap sizes" else caught.split(", ")
    for claim in claims:
        gap, size = re.match(r"(\w+) [<>]= ([\d.e+-]+) ", claim).groups()
        row = partial["power"]["gaps"][gap]
        at = int(np.argmin(np.abs(np.asarray(row["sizes"], float) - float(size))))
        assert np.isclose(row["sizes"][at], float(size)), (claim, row["sizes"])
        assert row["detection_probability"][at] >= partial["power"]["target"], (claim, row)
    undetected = [g for g, row in partial["power"]["gaps"].items() if row["smallest_detected"] is None]
    assert sorted(c.split(" ")[0] for c in claims) == sorted(set(partial["power"]["gaps"]) - set(undetected))
    if undetected:  # and the types it could not have seen are named as such
        said = partial["summary"]["message"].split("Not detectable at the tested sizes: ")
        assert len(said) == 2 and all(g in said[1] for g in undetected), partial["summary"]["message"]
    quality = report["provenance"]["model_quality"]  # a pass needs a model better than ARX (R9)
    assert quality["competent"] and quality["nrmse_world_model"] < quality["nrmse_arx"]


def test_a_starved_model_makes_the_check_inconclusive(pendulum, check_trainer, tmp_path):
    """A model trained 50 steps predicts held-out real episodes worse than a linear ARX model (its
    quality card says so); a faithful simulator checked on it is inconclusive with that reason,
    not pass, even when the gate requires no power."""
    run, meta, tmp = pendulum
    starved = check_trainer(tmp_path, tmp / "real.h5", 50)
    from wmcheck.training.quality import read_card

    card = read_card(starved)
    assert not card.competence(48).competent
    report = run_check(starved, _sim(tmp, meta, "faithful_starved", RealityProfile()), Gate(require_power=[]))
    assert report["verdict"] == "inconclusive" and report["exit_code"] == 3, report["summary"]
    assert "no better than a linear ARX model" in report["summary"]["message"]
    assert report["provenance"]["model_quality"]["competent"] is False


def test_the_checked_policy_the_team_declares_reaches_the_decision_and_the_report(pendulum, tmp_path):
    """`wmcheck check --checked-policy other`: the decision treats the checked commands as another
    policy's whatever the policy-shift test says, and the report says who said so."""
    from wmcheck.scripts.cli import main

    run, meta, tmp = pendulum
    sim = _sim(tmp, meta, "faithful_declared", RealityProfile(), seed=5200)
    out = tmp_path / "declared"
    main(
        ["check", str(run), "--rollouts", str(sim), "--out", str(out), "--no-tensorboard", "--checked-policy", "other"]
    )
    report = json.loads((out / "report.json").read_text())
    shift = report["gaps"]["distribution"]["estimate"]["policy_shift"]
    assert shift["declared"] == "other" and shift["shifted"] and not shift["test_rejects"], shift
    assert "--checked-policy other" in report["gaps"]["distribution"]["explanation"]
    with pytest.raises(UserError, match="--checked-policy"):
        run_check(run, sim, checked_policy="the logs")


def test_a_check_too_small_to_see_a_gap_is_inconclusive(pendulum, tmp_path):
    """One checked episode (3 blocks): nothing diverges, but the power table for a check of 3 blocks
    does not reach the target for every injected gap type, so the run cannot pass (rule R7). Nor
    could one episode that terminated have shown a simulator that ends where reality never does
    (Fisher p 1 / (n_real + 1) at best): the ending is missing too, with its reason."""
    run, meta, tmp = pendulum
    eps = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=1, max_steps=200, seed=7000)
    write_log(tmp_path / "one.h5", eps, LogMeta(**{**meta.__dict__, "source": "sim"}))
    report = run_check(run, tmp_path / "one.h5")
    power = report["power"]["gaps"]
    assert report["power"]["n_blocks"] == 3
    missing = report["summary"]["missing_power"]
    assert report["verdict"] == "inconclusive" and report["exit_code"] == 3, (report["summary"], power)
    table = [g for g in missing if g != "ending"]
    assert table and all(power[g]["smallest_detected"] is None for g in table), (missing, power)
    assert all(power[g]["smallest_detected"] is not None for g in power if g not in missing)
    ending = report["gaps"]["ending"]["estimate"]["power"]
    assert "ending" in missing and ending["blind"] == ["sooner"] and ending["later_p_value"] is None, ending
    message = report["summary"]["message"]
    assert "INCONCLUSIVE" in message and ", ".join(missing) in message and "had the 1 judged" in message


def test_episodes_shorter_than_a_block_are_checked_with_a_shorter_horizon(check_trainer, tmp_path):
    """Real episodes of 50 steps (51 observations) cannot hold a block of 16 + 48 steps: calibration
    used to stop with "held-out episodes too short". It now imagines 35 steps (CheckConfig.fitted_to),
    stores that geometry, and a check of a simulator with 2 steps of latency uses it and finds the
    latency in its 50-step episodes."""
    meta = LogMeta(
        source="real", dt=0.05, observation_names=["cos_theta", "sin_theta", "theta_dot"], action_names=["torque"]
    )
    eps = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=60, max_steps=50, seed=0)
    write_log(tmp_path / "real.h5", eps, meta)
    run = check_trainer(tmp_path, tmp_path / "real.h5", 600)
    cal = json.loads((run / "calibration.json").read_text())
    assert (cal["config"]["context"], cal["config"]["horizon"]) == (16, 35), cal["config"]
    late = record_reality("Pendulum-v1", RealityProfile(latency_steps=2), "hold:5", episodes=16, max_steps=50, seed=9)
    write_log(tmp_path / "late.h5", late, LogMeta(**{**meta.__dict__, "source": "sim"}))
    report = run_check(run, tmp_path / "late.h5")
    assert report["summary"]["blocks"] == 16, report["summary"]
    assert report["verdict"] == "fail" and report["summary"]["top_gap"] == "latency", report["summary"]
    # a 600-step model: the estimate was -2.21 before the scan's rewrite (thirty-second session) and
    # -2.31 after it, the same training up to float rounding. This test rests on training seed 0:
    # with seeds 1 and 2 that model is not competent enough and the check is `inconclusive` (both codes)
    assert report["gaps"]["latency"]["estimate"]["steps"] == pytest.approx(-2, abs=0.4)


def test_a_hopper_that_falls_within_a_block_is_trained_calibrated_and_checked_on_short_blocks(check_trainer, tmp_path):
    """Hopper-v5 under held random torques falls within 7-40 steps (median 15): shorter than a block
    of 16 + 48 and even than 16 + 8. Calibration used to stop with "held-out episodes too short"
    (exit 2), so no simulator of such a system could be checked. Training now fits its open-loop
    context to the held-out episodes (the card rests on many of them, not on the one longest),
    calibration fits blocks of 8 + 8, and a simulator with 2 more steps of latency fails with its
    delay estimated."""
    meta = LogMeta(
        source="real", dt=0.008, observation_names=[f"obs{i}" for i in range(11)], action_names=["thigh", "leg", "foot"]
    )
    reality = RealityProfile(latency_steps=1, actuator_gain=0.9, process_noise_std=0.05, sensor_noise_std=0.01)
    eps = record_reality("Hopper-v5", reality, "hold:5", episodes=400, max_steps=200, seed=0)
    assert np.median([e.num_steps for e in eps]) < 16 + 8 and all(bool(e.terminations[-1]) for e in eps)
    write_log(tmp_path / "real.h5", eps, meta)
    run = check_trainer(tmp_path, tmp_path / "real.h5", 600)
    train_cfg = json.loads((run / "config.json").read_text())["train"]
    card = json.loads((run / "quality.json").read_text())
    assert train_cfg["openloop_context"] == card["context"] < 16, (train_cfg["openloop_context"], card["context"])
    assert card["heldout_episodes"] >= 20, card["heldout_episodes"]  # not the one longest held-out episode
    cal = json.loads((run / "calibration.json").read_text())
    assert cal["config"]["horizon"] == 8 and 4 <= cal["config"]["context"] < 16, cal["config"]
    late = record_reality(
        "Hopper-v5", dataclasses.replace(reality, latency_steps=3), "hold:5", episodes=16, max_steps=200, seed=100
    )
    write_log(tmp_path / "late.h5", late, LogMeta(**{**meta.__dict__, "source": "sim"}))
    report = run_check(run, tmp_path / "late.h5", checked_policy="logs")
    assert report["summary"]["blocks"] >= 5, report["summary"]
    assert report["verdict"] == "fail" and report["summary"]["top_gap"] == "latency", report["summary"]
    assert report["gaps"]["latency"]["estimate"]["steps"] == pytest.approx(-2, abs=0.6)
    same = record_reality("Hopper-v5", reality, "hold:5", episodes=16, max_steps=200, seed=100)
    write_log(tmp_path / "same.h5", same, LogMeta(**{**meta.__dict__, "source": "sim"}))
    faithful = run_check(run, tmp_path / "same.h5", checked_policy="logs")
    assert faithful["verdict"] != "fail", faithful["summary"]
    # most of these episodes fall before a block fits: the summary says how many, and what they hold
    skipped = faithful["summary"]["skipped_short_episodes"]
    assert len(skipped) >= 4, skipped
    said = f"{len(skipped)} of the 16 checked episodes are shorter than a block ({cal['config']['context'] + 8} steps"
    assert said in faithful["summary"]["message"], faithful["summary"]["message"]
    assert "shorter than a block" not in report["summary"]["message"] or report["summary"]["skipped_short_episodes"]


def test_a_simulator_that_ends_where_reality_does_not_fails_on_the_ending_row(pendulum, tmp_path):
    """The simulator terminates when |theta_dot| > 2 (the real pendulum never terminates): its
    episodes are often too short for a block, yet the check gives a verdict, not exit 2."""
    jsonschema = pytest.importorskip("jsonschema")
    run, meta, tmp = pendulum
    eps = record_reality(
        "Pendulum-v1",
        RealityProfile(termination_bounds=[None, None, 2.0]),
        "hold:5",
        episodes=8,
        max_steps=200,
        seed=8000,
    )
    terminated = sum(bool(e.terminations[-1]) for e in eps)
    assert terminated >= 6, terminated
    path = tmp_path / "ends.h5"
    write_log(path, eps, LogMeta(**{**meta.__dict__, "source": "sim"}))
    report = run_check(run, path)
    row = report["gaps"]["ending"]
    assert row["verdict"] == "present" and row["estimate"]["checked_terminated"] == terminated, row
    assert row["estimate"]["real_termination_rate"] == 0.0 and row.get("next_step")
    assert report["verdict"] == "fail" and "ending" in report["summary"]["failing"], report["summary"]
    # the real pendulum never ends, so the continue head expects none of these terminations: the
    # ending is not one that a failing state explains (endings.py), and the report says the cause is open
    assert row["estimate"]["checked_expected_terminations"] == 0 and not row["estimate"]["ends_where_reality_ends"]
    assert row["estimate"]["checked_probed_terminations"] >= 1 and "is not identified" in report["summary"]["message"]
    paths = write_outputs(report, tmp_path / "ends-report")
    jsonschema.validate(json.loads(paths["json"].read_text()), schema())
    # the same episodes cut by a time limit (truncated, not terminated) end like reality's: nothing to fail
    short = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=6, max_steps=40, seed=8100)
    write_log(tmp_path / "short.h5", short, LogMeta(**{**meta.__dict__, "source": "sim"}))
    cut = run_check(run, tmp_path / "short.h5")  # every episode shorter than a block (64 steps)
    assert cut["verdict"] == "inconclusive" and cut["exit_code"] == 3, cut["summary"]
    assert cut["summary"]["score"] is None and cut["gaps"]["ending"]["verdict"] == "absent"
    assert "64 steps a block needs" in cut["summary"]["message"]
    paths = write_outputs(cut, tmp_path / "short-report")
    jsonschema.validate(json.loads(paths["json"].read_text()), schema())


@pytest.fixture(scope="module")
def latency_report(pendulum):
    run, meta, tmp = pendulum
    sim = _sim(tmp, meta, "latency", RealityProfile(latency_steps=2))
    return run_check(run, sim), sim


def test_latency_gap_detected_and_estimated(latency_report):
    report, _ = latency_report
    assert report["verdict"] == "fail" and report["exit_code"] == 1
    assert report["summary"]["top_gap"] == "latency", report["gaps"]
    est = report["gaps"]["latency"]["estimate"]
    # the simulator responds 2 steps later than reality: the correction shifts the commands by -2
    assert -3 <= est["steps"] <= -1, est
    assert report["summary"]["score"] > 0.8


def test_latency_fit_reports_an_interval_that_covers_the_truth(latency_report):
    """The corrections' fit (sysid.py): a fractional delay with a sandwich interval, and the score
    test's words."""
    report, _ = latency_report
    row = report["gaps"]["latency"]
    assert row["estimate"]["method"] == "fit" and row["ci"][0] <= -2 <= row["ci"][1], row
    assert "Welch t" in row["explanation"] and "joint fit" in row["explanation"], row["explanation"]


def test_a_sub_step_delay_is_corrected_before_the_dynamics_row(pendulum):
    """A true extra delay of 0.4 steps (exact on Pendulum's one Euler step per command): the fit
    finds a delay under half a step, which is applied before the residual and bias tests, so the
    dynamics row judges only what the delay leaves and stays absent; the latency finding is listed
    with dynamics (a slower response gives a fraction of a step too), not named."""
    run, meta, tmp = pendulum
    report = run_check(run, _sim(tmp, meta, "latency04", RealityProfile(latency_steps=0.4)))
    lat = report["gaps"]["latency"]
    assert report["verdict"] == "fail" and lat["verdict"] == "present", report["gaps"]
    assert -0.5 < lat["estimate"]["steps"] < -0.2, lat["estimate"]
    applied = report["gaps"]["dynamics"]["estimate"]["after_corrections"]
    assert any(a.startswith("delay ") for a in applied), applied
    assert report["gaps"]["dynamics"]["verdict"] == "absent", report["gaps"]["dynamics"]
    assert report["summary"]["top_gap"] == "none", report["summary"]
    assert {"latency", "dynamics"} <= set(report["summary"]["confounded"]), report["summary"]


def test_grid_attribution_fallback_still_finds_the_latency(pendulum, latency_report, light_config, tmp_path):
    """`attribution: grid` (one release): the same model calibrated for the former grid searches."""
    from dataclasses import replace

    from wmcheck.checks.calibration import calibrate

    run, meta, tmp = pendulum
    grid_run = tmp_path / "run-grid"
    shutil.copytree(run, grid_run)
    calibrate(
        grid_run,
        tmp / "real.h5",
        replace(light_config, attribution="grid"),
        verbose=False,
        extra_real=[tmp / "real_extra.h5"],  # the same held-out episodes as the fixture's calibration
    )
    report = run_check(grid_run, latency_report[1])
    assert report["summary"]["top_gap"] == "latency", report["gaps"]
    est = report["gaps"]["latency"]["estimate"]
    assert "method" not in est and -3 <= est["steps"] <= -1, est


def test_sensor_noise_gap_detected(pendulum):
    run, meta, tmp = pendulum
    report = run_check(run, _sim(tmp, meta, "noise", RealityProfile(sensor_noise_std=[0.1, 0.1, 0.5], seed=3)))
    assert report["verdict"] == "fail"
    assert report["summary"]["top_gap"] == "sensor_noise", report["gaps"]
    assert report["gaps"]["sensor_noise"]["estimate"]["noise_ratio"] > 1.5


def test_actuator_gain_gap_detected(pendulum):
    run, meta, tmp = pendulum
    report = run_check(run, _sim(tmp, meta, "gain", RealityProfile(actuator_gain=0.3)))
    assert report["verdict"] == "fail"
    assert report["summary"]["top_gap"] == "actuator", report["gaps"]
    est = report["gaps"]["actuator"]["estimate"]
    assert est["kind"] == "gain" and 0.2 <= est["value"] <= 0.5, est


def test_a_weaker_gain_with_a_sub_step_lag_is_listed_with_dynamics(pendulum):
    """Torque 0.3 steps late and 0.75x as strong: the fit finds a delay of a fraction of a step and
    a gain below 1, the two halves of a slower plant (gap_tests.bandwidth_lookalike), so the run
    fails with actuator, latency and dynamics listed rather than actuator named (a gain alone is
    named: test_actuator_gain_gap_detected)."""
    run, meta, tmp = pendulum
    sim = _sim(tmp, meta, "lag_weak", RealityProfile(latency_steps=0.3, actuator_gain=0.75), seed=77, episodes=16)
    report = run_check(run, sim)
    s, gaps = report["summary"], report["gaps"]
    assert report["verdict"] == "fail" and {"latency", "actuator"} <= set(s["failing"]), s
    assert s["top_gap"] == "none" and set(s["confounded"]) == {"actuator", "latency", "dynamics"}, s
    assert -0.5 < gaps["latency"]["estimate"]["steps"] < 0, gaps["latency"]["estimate"]
    act = gaps["actuator"]
    assert act["estimate"]["kind"] == "gain" and act["estimate"]["value"] < 1, act["estimate"]
    assert "rather than named actuator" in act["explanation"], act["explanation"]
    assert "listed with dynamics, not named" in s["message"], s["message"]


def test_a_parameter_the_model_cannot_judge_is_not_tested(pendulum, monkeypatch):
    """A command parameter whose judgeable box is the identity alone (sysid.bounds: lo = hi) is left
    out of the actuator score test and listed as untested; the gain of 0.3 is still found."""
    from wmcheck.checks import sysid

    run, meta, tmp = pendulum
    sim = _sim(tmp, meta, "gain_boxed", RealityProfile(actuator_gain=0.3))
    real_bounds = sysid.bounds

    def offset_boxed(norm, episodes, layout, cfg, alpha):
        lo, hi = real_bounds(norm, episodes, layout, cfg, alpha)
        for j, p in enumerate(layout.params):
            if p.kind == "offset":
                lo[j] = hi[j] = 0.0
        return lo, hi

    assert run_check(run, sim)["gaps"]["actuator"]["estimate"]["untested"] == []
    monkeypatch.setattr(sysid, "bounds", offset_boxed)
    report = run_check(run, sim)
    row = report["gaps"]["actuator"]
    assert row["estimate"]["untested"] == ["offset on torque"], row["estimate"]
    assert set(row["estimate"]["scores"]["torque"]) == {"gain", "deadband"}
    assert "not tested" in row["explanation"] and row["verdict"] == "present", row


def test_dynamics_gap_attributed_to_dynamics_not_sensor_noise(pendulum):
    """Gravity x1.5: the one-step residuals grow, as with sensor noise, but they are coloured (the
    error is a smooth function of the state), so the whiteness test gives them to dynamics."""
    run, meta, tmp = pendulum
    report = run_check(run, _sim(tmp, meta, "gravity", RealityProfile(physics={"g": {"scale": 1.5}})))
    assert report["verdict"] == "fail"
    assert report["summary"]["top_gap"] == "dynamics", report["gaps"]
    assert report["gaps"]["sensor_noise"]["verdict"] == "absent", report["gaps"]["sensor_noise"]
    dyn = report["gaps"]["dynamics"]["estimate"]
    assert dyn["residual_ratio"] > 1.5 and dyn["residual_ac1"] > dyn["real_residual_ac1"], dyn
    # a gap this size shows in single episodes, each with the step where its divergence starts
    divergent = [e for e in report["episodes"] if e["verdict"] == "divergent"]
    assert divergent and all(e["divergence_onset_step"] is not None for e in divergent), report["episodes"]


def test_report_files_schema_html_and_gate(pendulum, latency_report, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    run, meta, tmp = pendulum
    report, sim = latency_report
    paths = write_outputs(report, tmp_path / "report")
    data = json.loads(paths["json"].read_text())
    jsonschema.validate(data, schema())
    assert data["verdict"] == "fail" and set(data["gaps"]) >= {
        "latency",
        "actuator",
        "sensor_noise",
        "dynamics",
        "distribution",
        "visual",
    }
    bad = dict(data, verdict="maybe")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema())
    assert any(p.name.startswith("events") for p in (tmp_path / "report" / "tb").iterdir())
    # The HTML report renders in a real headless browser and shows the verdict and the gap table.
    dom = browser.dom(paths["html"], tmp_path)
    assert 'id="verdict"' in dom and "FAIL" in dom
    assert 'id="gap-table"' in dom and dom.count("<tr>") >= 7 and "latency" in dom
    assert '<img src="data:image/png;base64,' in dom  # figures embedded, no network
    # the distribution row's estimate is a sentence (coverage, states, the policy-shift test), not a dict
    shift = data["gaps"]["distribution"]["estimate"]["policy_shift"]
    said = "commands: another policy than the logs'" if shift["shifted"] else "commands: the logs'"
    assert "of checked steps inside the real support" in dom and said in dom and shift["testable"] is True
    assert "outside_competence_fraction" not in dom and "policy_shift" not in dom
    # A gate that tolerates a 2-step latency turns the same finding into a pass (amber row).
    gate_file = tmp_path / "gate.yaml"
    gate_file.write_text("tolerances:\n  latency: {max_steps: 3}\n")
    gated = run_check(run, sim, Gate.load(gate_file))
    assert gated["gaps"]["latency"]["verdict"] == "tolerated"
    bad_gate = tmp_path / "bad.yaml"
    bad_gate.write_text("alpha: 2\n")
    with pytest.raises(UserError):
        Gate.load(bad_gate)


def test_the_html_report_can_be_read_and_navigated_in_a_browser(latency_report, tmp_path):
    """Sections collapse; every episode row that has plots links to them and the link opens them;
    figures are at least 900 CSS px wide and drawn at twice that (sharp on high-DPI screens)."""
    report, _ = latency_report
    paths = write_outputs(report, tmp_path / "report", tensorboard=False)
    html_text = paths["html"].read_text()
    dom = browser.dom(paths["html"], tmp_path)
    sections = re.findall(r'<details class="section" id="([\w-]+)" open="">', dom)
    assert {"gaps", "regimes-section", "overlays", "episodes", "drilldown", "power", "quality"} <= set(sections)
    drilled = [d["episode"] for d in report["figures"]["episodes"]["episodes"]]
    worst_blocks = list(dict.fromkeys(b["episode"] for b in report["figures"]["worst_blocks"]["worst_blocks"]))
    assert drilled[: len(worst_blocks)] == worst_blocks[:4]  # the worst blocks' episodes first, then by score:
    score = {e["id"]: e["score"] for e in report["episodes"]}  # no episode left out scores above one drawn
    rest = [score[i] for i in drilled[len(worst_blocks) :]]
    left_out = [s for i, s in score.items() if i not in drilled]
    assert len(drilled) == min(4, len(score)) and (not rest or not left_out or min(rest) >= max(left_out))
    for d in report["figures"]["episodes"]["episodes"]:  # each drawn with its own most divergent block
        assert d["worst_block"]["episode"] == d["episode"]
        assert d["divergence"][d["block_start"].index(d["worst_block"]["start"])] == max(d["divergence"])
    for eid in drilled:  # each drilled episode: a link in its row, and the target it points to
        assert f'<a href="#episode-{eid}">episode plots</a>' in dom
        assert f'<details class="episode" id="episode-{eid}">' in dom  # closed until asked for
    est = report["gaps"]["latency"]["estimate"]  # the latency row's estimate is a sentence, not a dict
    assert f"{est['steps']:.3g} steps" in dom and "score_t" not in dom and "fitted_with" not in dom
    opened = browser.dom(paths["html"], tmp_path, fragment=f"episode-{drilled[-1]}")
    assert f'<details class="episode" id="episode-{drilled[-1]}" open="">' in opened
    assert f'<details class="episode" id="episode-{drilled[0]}">' in opened  # the others stay closed
    images = browser.layout(paths["html"], tmp_path)
    assert len(images) == html_text.count("<img ") >= 1 + len(drilled)
    for alt, shown, natural_w, _natural_h in images:
        assert shown >= 900, (alt, shown)
        assert natural_w >= 2 * shown - 2, (alt, shown, natural_w)  # 2x for high-DPI screens
    # on a narrow screen the figures shrink to fit instead of overflowing
    narrow = browser.layout(paths["html"], tmp_path, window=(700, 900))
    assert all(shown <= 700 for _alt, shown, _w, _h in narrow)


def test_an_unattributed_failure_is_a_red_row_with_what_to_do_next(latency_report, tmp_path):
    """A FAIL that no gap row explains never sits above an all-green table: the rule (report_build.
    unattributed) and its row in the HTML, with its next step."""
    from wmcheck.checks import report_build as rb
    from wmcheck.checks.decision import Decision

    absent = dict.fromkeys(("latency", "actuator", "sensor_noise", "dynamics"), "absent")
    dec = Decision("fail", 1, {}, absent, failing=("pooled",))
    assert rb.unattributed(dec)
    assert not rb.unattributed(Decision("fail", 1, {}, absent, top_gap="dynamics", failing=("pooled",)))
    assert not rb.unattributed(Decision("fail", 1, {}, absent, failing=("latency",)))
    assert not rb.unattributed(Decision("fail", 1, {}, absent, confounded=["latency", "actuator"], failing=("pooled",)))
    assert not rb.unattributed(Decision("pass", 0, {}, absent))
    report, _ = latency_report
    assert report["summary"]["unattributed"] is None  # attributed (latency): no extra row
    for row in report["gaps"].values():  # and every present gap says what to do next
        assert row["verdict"] != "present" or row.get("next_step"), row
    green = json.loads(write_outputs(report, tmp_path / "as-written", tensorboard=False)["json"].read_text())
    for row in green["gaps"].values():
        row["verdict"] = "absent" if row["verdict"] == "present" else row["verdict"]
    green["summary"]["top_gap"] = "none"
    green["summary"]["unattributed"] = {
        "failing": ["pooled"],
        "explanation": "x",
        "next_step": rb.UNATTRIBUTED_NEXT_STEP,
    }
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(green, schema())  # the entry as the schema describes it
    paths = write_outputs(green, tmp_path / "green", tensorboard=False)
    dom = browser.dom(paths["html"], tmp_path)
    row = re.search(r'<tr id="unattributed">(.*?)</tr>', dom, re.S)
    assert row and "present" in row.group(1) and rb.UNATTRIBUTED_NEXT_STEP in html.unescape(row.group(1))
    assert 'id="policy-gate-row"' not in dom
    green["summary"]["failing"] = ["pooled", "policy_gate"]  # a failed policy gate is a red row as well
    dom = browser.dom(write_outputs(green, tmp_path / "gated", tensorboard=False)["html"], tmp_path)
    row = re.search(r'<tr id="policy-gate-row">(.*?)</tr>', dom, re.S)
    assert row and "not met" in row.group(1) and rb.POLICY_GATE_NEXT_STEP in html.unescape(row.group(1))


def test_cli_bad_input_exit_2(pendulum, tmp_path):
    from wmcheck.scripts.cli import main

    run, meta, tmp = pendulum
    assert main(["check", str(run), "--rollouts", str(tmp_path / "missing.h5"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x" / "report.json").exists()
    # wrong channels: a log with 2 observation channels
    eps = record_episodes("MountainCarContinuous-v0", "random", episodes=1, max_steps=80, seed=0)
    write_log(tmp_path / "other.h5", eps, LogMeta(source="sim", dt=1.0))
    assert main(["check", str(run), "--rollouts", str(tmp_path / "other.h5"), "--out", str(tmp_path / "y")]) == 2
    assert main(["check", str(tmp_path), "--rollouts", str(tmp_path / "other.h5"), "--out", str(tmp_path / "z")]) == 2


def _pump(obs):
    """Energy-pumping MountainCar controller: push in the direction of motion."""
    return np.array([1.0 if obs[1] >= 0 else -1.0], np.float32)


def test_out_of_support_simulator_is_unverifiable(tmp_path, check_trainer):
    # Reality: MountainCarContinuous under weak random commands stays in the valley; the checked
    # policy pumps energy and climbs to states no real log contains.
    rng = np.random.default_rng(0)
    eps = record_episodes(
        "MountainCarContinuous-v0",
        lambda obs: rng.uniform(-0.3, 0.3, size=1).astype(np.float32),
        episodes=30,
        max_steps=200,
        seed=0,
    )
    meta = LogMeta(source="real", dt=1.0, observation_names=["position", "velocity"], action_names=["force"])
    write_log(tmp_path / "real.h5", eps, meta)
    with open_log(tmp_path / "real.h5") as log:
        real_max_x = max(float(e.observations[:, 0].max()) for e in log)
    run = check_trainer(tmp_path, tmp_path / "real.h5", 1500)
    sim_eps = record_episodes("MountainCarContinuous-v0", _pump, episodes=8, max_steps=200, seed=100)
    assert max(float(e.observations[:, 0].max()) for e in sim_eps) > real_max_x + 0.2
    write_log(tmp_path / "sim.h5", sim_eps, LogMeta(**{**meta.__dict__, "source": "policy"}))
    report = run_check(run, tmp_path / "sim.h5")
    assert report["verdict"] == "unverifiable", report["summary"]
    assert report["exit_code"] == 1
    assert report["summary"]["unverifiable"] >= 1
    assert report["gaps"]["distribution"]["estimate"]["coverage"] < 0.9
    allowed = run_check(run, tmp_path / "sim.h5", Gate(allow_unverifiable=True))
    assert allowed["verdict"] == "unverifiable" and allowed["exit_code"] == 0


def test_calibrate_with_extra_real_logs_never_on_training_data(pendulum, tmp_path):
    """`calibrate --real EXTRA.h5` adds real episodes the model never saw to the held-out set (the
    thresholds and the power rest on more episodes); a log holding a training episode is refused
    with exit 2 and the episode named, and a simulator log is not real data."""
    from wmcheck.scripts.cli import main

    run, meta, tmp = pendulum
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = json.loads((copy / "calibration.json").read_text())["info"]
    card = json.loads((copy / "quality.json").read_text())
    (copy / "quality.json").unlink()  # as for a run trained before the card: calibrate writes it
    extra = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=4, max_steps=200, seed=9100)
    write_log(tmp_path / "extra.h5", extra, meta)  # meta.source == "real"
    light = ["--max-delay", "2"]
    fixture_extra = ["--real", str(tmp / "real_extra.h5")]  # the fixture's calibration already had these
    code = main(
        ["calibrate", str(copy), str(tmp / "real.h5"), *fixture_extra, "--real", str(tmp_path / "extra.h5"), *light]
    )
    after = json.loads((copy / "calibration.json").read_text())["info"]
    assert code == 0
    assert len(after["held_out_episodes"]) == len(before["held_out_episodes"]) + 4
    assert after["blocks"] > before["blocks"] and [e["episodes"] for e in after["extra_real"]] == [12, 4]
    assert len(set(after["held_out_episodes"])) == len(after["held_out_episodes"])  # ids stay unique
    rewritten = json.loads((copy / "quality.json").read_text())
    assert (
        rewritten["nrmse"]["arx"] == card["nrmse"]["arx"] and rewritten["heldout_episodes"] == card["heldout_episodes"]
    )
    report = run_check(copy, _sim(tmp, meta, "faithful_extra", RealityProfile()), Gate(require_power=[]))
    assert report["thresholds"]["calibration_blocks"] == after["blocks"]
    # the extras are now part of the reference: the monitor never scores them as new real data
    from wmcheck.checks.calibration import Calibration
    from wmcheck.checks.model_log import episode_fingerprint

    known = Calibration.load(copy).known_fingerprints()
    with open_log(tmp_path / "extra.h5") as log:
        assert {episode_fingerprint(e) for e in log} <= known
    with open_log(tmp / "real.h5") as log:
        assert {episode_fingerprint(e) for e in log} <= known and len(known) == len(log.episode_ids) + 12 + 4
    mon = ["monitor", str(copy), "--real", str(tmp_path / "extra.h5"), "--out", str(tmp_path / "mon")]
    assert main([*mon, "--period", "1", "--no-tensorboard"]) == 0
    state = json.loads((tmp_path / "mon" / "monitor_state.json").read_text())
    assert state["looks"] == [] and state["pending"] == []

    # the training log itself holds training episodes: refused, before anything is written
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "wmcheck"), "calibrate", str(copy), "--real", str(tmp / "real.h5")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "same data as training episode" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads((copy / "calibration.json").read_text())["info"] == after
    with open_log(tmp / "real.h5") as log:
        eps = list(log)
    write_log(tmp_path / "sim.h5", eps[:1], LogMeta(**{**meta.__dict__, "source": "sim"}))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "wmcheck"), "calibrate", str(copy), "--real", str(tmp_path / "sim.h5")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "not 'real'" in proc.stderr, proc.stderr


def test_a_calibration_that_does_not_name_its_model_is_refused(pendulum, tmp_path):
    """Deleting `model_sha256` from calibration.json must not bypass the model/calibration match."""
    run, meta, tmp = pendulum
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    cal = json.loads((copy / "calibration.json").read_text())
    del cal["info"]["model_sha256"]
    (copy / "calibration.json").write_text(json.dumps(cal))
    with pytest.raises(UserError, match="belongs to another model.pt"):
        run_check(copy, _sim(tmp, meta, "faithful_nohash", RealityProfile()))


def test_the_power_table_is_computed_once_per_calibration_and_check_size(pendulum, tmp_path):
    """Two checks of the same size share one power table (RUNDIR/power_cache.json), equal to the
    table computed afresh; a new calibration, or a cache written by code whose power table differs
    (POWER_TABLE_VERSION), does not reuse the old tables."""
    from wmcheck.checks.calibration import Calibration
    from wmcheck.checks.power import POWER_CACHE, power_table

    run, meta, tmp = pendulum
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / POWER_CACHE).unlink(missing_ok=True)
    sim = _sim(tmp, meta, "faithful_cache", RealityProfile())
    first = run_check(copy, sim)
    cache = json.loads((copy / POWER_CACHE).read_text())
    assert len(cache["tables"]) == 1
    second = run_check(copy, sim)
    assert second["power"] == first["power"]
    cal = Calibration.load(copy)
    n = first["power"]["n_blocks"]
    fresh = power_table(cal, n, first["summary"]["alpha"], cal.config.power_target, seed=cal.config.seed)
    assert json.loads(json.dumps(fresh)) == first["power"]["gaps"]
    stale = {k: {"latency": {"sizes": [99]}} for k in cache["tables"]}
    for field, value in (("calibration_sha256", "another calibration"), ("power_table_version", 0)):
        (copy / POWER_CACHE).write_text(json.dumps({**cache, field: value, "tables": stale}))
        assert run_check(copy, sim)["power"] == first["power"], field  # the stale tables were not used


def test_the_power_table_measures_the_dynamics_row_by_scaled_motion(pendulum):
    """The motion gaps (power.MOTION_GAPS) are scored as checks would see them: with no gap the
    draws are flagged at most at the control's rate, and a plant that moves twice (or half) as far
    over the horizon as the real Pendulum is caught in every draw of a 16-block check (on the
    benchmark's Pendulum, 0.9x and 1.1x are too, docs/benchmarks.md, thirtieth session)."""
    from wmcheck.checks.calibration import Calibration
    from wmcheck.checks.power import MOTION_GAPS, power_table

    run, _, _ = pendulum
    cal = Calibration.load(run)
    table = power_table(cal, 16, cal.config.alpha, cal.config.power_target, reps=40, seed=cal.config.seed)
    assert set(MOTION_GAPS) <= set(table)
    for gap in MOTION_GAPS:
        row = table[gap]
        assert row["control_detection"] <= 0.1, row
        assert row["detection_probability"][-1] >= row["control_detection"] + 0.8, row
        assert row["smallest_detected"] is not None, row


def test_a_pass_says_what_its_dynamics_power_covers():
    """The physics of a real log cannot be changed: the dynamics row's power is the real horizons'
    motion scaled (power.MOTION_GAPS), in both directions. A pass states what it would have caught,
    with the direction of each bound, and that a physics change which keeps how far the plant moves
    is not bounded (a Hopper with 1.5x gravity passed, docs/benchmarks.md, twenty-ninth session)."""
    from wmcheck.checks.report_build import DYNAMICS_POWER_SCOPE, power_sentence

    row = {"units": "x reality's motion over the horizon", "reliable": True, "control_detection": 0.02}
    power = {
        "latency": {**row, "sizes": [1, 2], "smallest_detected": 1, "units": "steps"},
        "motion_larger": {**row, "sizes": [1.1, 1.25], "smallest_detected": 1.25},
        "motion_smaller": {**row, "sizes": [0.9, 0.8], "smallest_detected": 0.8},
    }
    said = power_sentence(power, 0.05)
    assert said.startswith(
        "This pass would have caught: latency >= 1 steps, motion_larger >= 1.25 x reality's motion over the "
        "horizon, motion_smaller <= 0.8 x reality's motion over the horizon."
    ), said
    assert said.endswith(DYNAMICS_POWER_SCOPE)
