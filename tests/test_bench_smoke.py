"""Smoke tests of the benchmark scripts: each runs end to end with --quick (seconds) and writes
JSON with the expected keys and finite numbers, plus the Markdown table."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str, quick: bool = True) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *(["--quick"] if quick else []), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_bench_train_quick(tmp_path):
    _run("bench_train.py", "--out", str(tmp_path))
    data = json.loads((tmp_path / "bench_train.json").read_text())
    assert data["benchmark"] == "train_speed" and data["version"] == 1 and data["quick"] is True
    assert {"date", "torch", "cpu_count", "torch_threads", "device"} <= set(data["machine"])
    assert len(data["rows"]) >= 2
    for row in data["rows"]:
        for key in (
            "preset",
            "B",
            "T",
            "device",
            "precision",
            "params",
            "timed_steps",
            "s_per_step",
            "env_steps_per_s",
            "ref_env_steps_per_s",
            "ratio",
        ):
            assert key in row, key
        assert _finite(row["s_per_step"]) and row["s_per_step"] > 0
        assert _finite(row["env_steps_per_s"]) and row["env_steps_per_s"] > 0
        assert row["env_steps_per_s"] == pytest.approx(row["B"] * row["T"] / row["s_per_step"])
        assert row["timed_steps"] >= 2
    assert "env-steps/s" in (tmp_path / "bench_train.md").read_text()


def test_bench_train_reference_ratio():
    """The ratio column compares with the issue's figures (no timing involved)."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_train import reference
    finally:
        sys.path.pop(0)
    ref = reference("size1m", 16, 64, torch.device("cpu"))
    assert ref["ref_s_per_step"] == 0.27 and ref["ref_env_steps_per_s"] == pytest.approx(1024 / 0.27)
    assert reference("size12m", 256, 64, torch.device("cpu"))["ref_note"] == "B=16 ref"
    assert reference("size1m", 256, 64, torch.device("cuda"))["ref_env_steps_per_s"] == pytest.approx(256 * 64 / 0.28)


def test_bench_worldmodel_quick(tmp_path):
    systems = ["pendulum", "lhb"]
    if importlib.util.find_spec("mujoco") is not None:
        systems.insert(1, "halfcheetah")
    _run("bench_worldmodel.py", "--out", str(tmp_path), "--systems", ",".join(systems))
    data = json.loads((tmp_path / "bench_worldmodel.json").read_text())
    assert data["benchmark"] == "worldmodel_openloop" and data["version"] == 2
    assert [s["system"] for s in data["systems"]] == systems
    for s in data["systems"]:
        assert s["context"] == 16 and s["horizons"][0] == 1 and len(s["horizons"]) >= 2
        assert s["train_episodes"] >= 1 and s["heldout_episodes"] >= 1
        assert set(s["runs"]) == {"fixed", "defaults", "defaults-openloop"}
        assert s["runs"]["defaults"]["train"]["patience"] > 0 and s["runs"]["fixed"]["train"]["patience"] == 0
        assert s["runs"]["defaults"]["train"]["stop_on"] == "loss"
        assert s["runs"]["defaults-openloop"]["train"]["stop_on"] == "openloop"
        for run in s["runs"].values():
            card = run["card"]
            H = len(card["coverage_raw"])
            for method in ("world_model", "persistence", "arx"):
                means = card["nrmse"][method]
                assert len(means) == H and all(_finite(v) and v >= 0 for v in means), (method, means)
                assert np.array(card["nrmse_channel"][method], float).shape == (H, len(s["observation_names"]))
            assert all(0.0 <= c <= 1.0 for c in card["coverage_raw"])
            assert run["stop_reason"] in ("max_steps", "early_stopping", "time_budget")
    lhb = data["systems"][-1]
    assert lhb["observation_names"] == ["P_avg"]
    md = (tmp_path / "bench_worldmodel.md").read_text()
    assert "| horizon | world model | ARX | persistence |" in md


def test_arx_recovers_a_linear_system_and_rolls_it_forward():
    """On data from a known ARX(2, 1) system without noise, the fit is exact and the open-loop
    rollout reproduces the trajectory; the order selection picks an order that contains it."""
    from wmcheck.training.openloop_baselines import ARX, StepSeq, persistence, select_arx

    rng = np.random.default_rng(0)
    A1 = np.array([[1.5, -0.2], [0.1, 0.6]])
    A2 = np.array([[-0.6, 0.0], [0.0, 0.1]])
    B1 = np.array([[0.5], [-0.3]])

    def simulate(T):
        u = np.repeat(rng.uniform(-1, 1, (T // 5 + 1, 1)), 5, 0)[:T]  # held random input
        y = np.zeros((T, 2))
        y[:2] = rng.normal(size=(2, 2))
        ctrl = np.zeros((T, 1))
        ctrl[1:] = u[:-1]  # ctrl[t] = u_{t-1} (training-view alignment)
        for t in range(2, T):
            y[t] = A1 @ y[t - 1] + A2 @ y[t - 2] + B1 @ ctrl[t] + 0.05
        return StepSeq(y, ctrl)

    seqs = [simulate(120) for _ in range(6)]
    m = ARX(2, 1, ridge=0.0).fit(seqs)
    pred, y = m.one_step(seqs)
    assert np.abs(pred - y).max() < 1e-8
    test = simulate(100)
    obs, ctrl = test.obs[None], test.ctrl[None]  # (1, T, D), (1, T, U)
    roll = m.openloop(obs, ctrl, context=16)
    assert roll.shape == (1, 84, 2) and np.abs(roll - obs[:, 16:]).max() < 1e-6
    assert np.array_equal(persistence(obs, 16), np.repeat(obs[:, 15:16], 84, 1))
    sel = select_arx(seqs[:4], seqs[4:], orders_p=(1, 2, 3), orders_q=(0, 1, 2), horizon=32)
    assert sel.p >= 2 and sel.q >= 1 and sel.scores[f"{sel.p},{sel.q}"] < 1e-10
    assert sel.scores["1,0"] > 1e-3  # a wrong order is measurably worse


def test_bench_detection_quick(tmp_path):
    """The detection benchmark end to end on a tiny budget: every family runs, the JSON has per-row
    rates in [0, 1], AUROCs against the controls, the three baselines and the targets."""
    _run("bench_detection.py", "--out", str(tmp_path))
    data = json.loads((tmp_path / "bench_detection.json").read_text())
    assert data["benchmark"] == "detection" and data["version"] == 2 and data["quick"] is True
    assert data["machine"]["config"] == "cpu" and data["machine"]["torch_threads"] == 1
    (s,) = data["systems"]
    assert s["system"] == "pendulum" and s["calibration_blocks"] >= 24
    families = [c["family"] for c in s["checks"]]
    assert families.count("control") == 2 and families.count("ending") == 1
    assert families.count("other_policy") == 2  # the largest dynamics and actuator gaps under the controller
    assert families.count("deterministic") == 4  # twin, one biased physics, no latency, nominal
    assert sorted(c["gap"] for c in s["checks"] if c["family"] == "perturbation") == sorted(
        ["latency", "actuator", "sensor_noise", "dynamics"]
    )
    for c in s["checks"]:
        assert c["verdict"] in ("pass", "fail", "unverifiable", "inconclusive", "error")
        assert c["flagged"] == (c["verdict"] in ("fail", "unverifiable"))
        if c["verdict"] == "error" or c.get("blocks") == 0:  # nothing could be scored
            assert c["score"] is None
        else:
            assert 0.0 <= c["score"] <= 1.0 and c["strength"] > 0.0
            # the decision's evidence strength is >= 1 exactly when some test fired
            if c["failing"]:
                assert c["strength"] >= 1.0
        for b in ("arx", "mmd", "mlp"):
            if c["family"] != "ending":  # episodes may be shorter than a block: nothing to test
                assert 0.0 < c["baselines"][b]["p"] <= 1.0 and c["baselines"][b]["score"] >= 0.0
        if c["family"] == "deterministic":
            assert "sensor_noise" in c["truth"]  # a noise-free simulator has a sensor-noise gap
    (ending,) = [c for c in s["checks"] if c["family"] == "ending"]
    assert ending["truth"] == ["ending"] and ending["verdict"] in ("fail", "inconclusive")  # a verdict, never exit 2
    summ = s["summary"]
    fa = summ["false_alarms"]["wmcheck"]
    assert fa["n"] == 2 and 0.0 <= fa["rate"] <= 1.0 and fa["ci95"][0] <= fa["rate"] <= fa["ci95"][1]
    assert [c["gap"] for c in summ["cells"]] == ["latency", "actuator", "sensor_noise", "dynamics"]
    for cell in summ["cells"] + summ["deterministic"]:
        assert cell["n"] == 1
        for key in ("detection", "attribution", "sensor_noise_row"):
            assert 0.0 <= cell[key]["rate"] <= 1.0
        assert 0.0 <= cell["auroc"] <= 1.0 and 0.0 <= cell["auroc_strength"] <= 1.0
        for b in ("arx", "mmd", "mlp"):
            assert (
                0.0 <= cell["baselines"][b]["detection"]["rate"] <= 1.0 and 0.0 <= cell["baselines"][b]["auroc"] <= 1.0
            )
    for cell in summ["cells"]:
        if cell["gap"] == "dynamics":
            assert cell["power_predicted"] is None  # calibration does not inject dynamics gaps
        else:
            assert 0.0 <= cell["power_predicted"] <= 1.0
    assert all(isinstance(t["met"], bool) and t["measured"] for t in summ["targets"])
    assert [o["row"] for o in summ["other_policy"]] == [
        "dynamics=0.5 under controller pendulum_pd",
        "actuator=2 under controller pendulum_pd",
    ]
    md = (tmp_path / "bench_detection.md").read_text()
    assert "**Deterministic simulators**" in md and "**Faithful controls**" in md and "| gap | size | n |" in md
    assert "**Gaps checked under another policy only**" in md

    # replicates pool every check into one summary and keep each replicate's false alarms
    from wmcheck.scripts import bench_detection as bd
    from wmcheck.scripts.bench_families import PENDULUM, quick

    second = json.loads(json.dumps(s))
    for c in second["checks"]:
        c["replicate"], c["flagged"], c["verdict"] = 1, True, "fail"
    second.update(replicate=1, summary=bd.summarise(quick(PENDULUM), second["checks"], 0.05))
    pooled = bd.pool_replicates(quick(PENDULUM), [s, second])
    assert len(pooled["checks"]) == 2 * len(s["checks"])
    n_controls = families.count("control")
    assert pooled["summary"]["false_alarms"]["wmcheck"]["n"] == 2 * n_controls
    assert pooled["summary"]["false_alarms"]["wmcheck"]["k"] == fa["k"] + n_controls
    assert [r["false_alarms"]["wmcheck_fail_only"]["k"] for r in pooled["replicates"]] == [
        s["summary"]["false_alarms"]["wmcheck_fail_only"]["k"],
        n_controls,
    ]
    assert "**Replicates** (2:" in bd.replicates_markdown(pooled)
    job = bd.jobs_for(quick(PENDULUM), bd.RealityProfile(**PENDULUM.reality, seed=0), np.ones(3))[0]
    moved = bd._replicate_job(job, 2)
    assert moved.seed == job.seed + 2 * bd.REPLICATE_SEED and moved.profile["seed"] != job.profile["seed"]
    assert bd._replicate_job(job, 0) is job


def test_bench_detection_statistics():
    """The benchmark's own statistics: the Wilson interval, variant profiles and estimate errors."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_detection as bd
        import bench_families as bf
    finally:
        sys.path.pop(0)
    from wmcheck.checks.reality import RealityProfile

    lo, hi = bd.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.161, abs=1e-3)  # the textbook value for 0/20
    lo, hi = bd.wilson(10, 20)
    assert lo == pytest.approx(0.299, abs=1e-3) and hi == pytest.approx(0.701, abs=1e-3)
    r = RealityProfile(
        latency_steps=1, actuator_gain=0.8, sensor_noise_std=0.03, process_noise_std=0.1, physics={"m": {"scale": 1.2}}
    )
    std = np.array([0.1, 0.2, 0.4])
    assert bf.variant(r, "latency", 2, std, "m").latency_steps == 3
    assert bf.variant(r, "actuator", 2.0, std, "m").actuator_gain == pytest.approx(0.4)
    noisy = bf.variant(r, "sensor_noise", 0.5, std, "m").sensor_noise_std
    assert noisy == pytest.approx(np.sqrt(0.03**2 + (0.5 * std) ** 2).tolist())
    assert bf.variant(r, "dynamics", 0.5, std, "m").physics == {"m": {"scale": pytest.approx(1.8)}}
    v = bf.variant(r, "actuator", 1.25, std, "m")
    assert (v.latency_steps, v.sensor_noise_std, v.physics) == (1, 0.03, {"m": {"scale": 1.2}})  # the rest stays
    twin = bf.deterministic(r)
    assert twin.sensor_noise_std is None and twin.process_noise_std is None and twin.latency_steps == 1
    # every family, each row with its truth
    jobs = bf.jobs_for(bf.PENDULUM, RealityProfile(**bf.PENDULUM.reality), np.ones(3))
    fams = {j.family for j in jobs}
    assert fams == {"control", "deterministic", "perturbation", "other_policy", "ending"}
    assert all(j.truth == () for j in jobs if j.family == "control")
    assert sorted((j.gap, j.policy) for j in jobs if j.family == "other_policy") == [
        ("actuator", "controller:pendulum_pd"),
        ("actuator", "hold:2"),
        ("dynamics", "controller:pendulum_pd"),
        ("dynamics", "hold:2"),
    ]
    assert all(j.truth == (j.gap,) for j in jobs if j.family == "other_policy")
    assert {j.condition for j in jobs if j.family == "control"} >= {
        "4 episodes",
        "32 episodes",
        "policy hold:2",
        "policy controller pendulum_pd",
    }
    assert len({j.seed for j in jobs}) == len(jobs) and len({j.name for j in jobs}) == len(jobs)
    # latency: a simulator 2 steps slower is corrected by shifting its commands by -2
    assert bd.estimate_error("latency", 2, {"steps": -2})["abs_error"] == 0
    assert bd.estimate_error("latency", 2, {"steps": 1})["abs_error"] == 3
    e = bd.estimate_error("actuator", 2.0, {"kind": "gain", "value": 0.63})
    assert e["truth"] == 0.5 and e["abs_error"] == pytest.approx(0.13)
    assert bd.estimate_error("dynamics", 1.0, {"x": 1}) is None
    # a detector that flags everything fails the false-alarm target; one that flags nothing fails detection
    spec = bf.quick(bf.PENDULUM)
    quick_jobs = bf.jobs_for(spec, RealityProfile(**spec.reality), np.ones(3))

    def fake(flag):
        rows = []
        for j in quick_jobs:
            bad = flag and j.family != "control" or (flag and j.family == "control")
            rows.append(
                {
                    **dataclasses.asdict(j),
                    "flagged": bad,
                    "verdict": "fail" if bad else "pass",
                    "score": 0.9 if bad else 0.5,
                    "top_gap": (j.truth[0] if j.truth and bad else "none"),
                    "present": list(j.truth) if bad else [],
                    "estimates": {},
                    "baselines": {b: {"flagged": False, "score": 0.5} for b in ("arx", "mmd", "mlp")},
                }
            )
        return {t["target"]: t["met"] for t in bd.summarise(spec, rows, 0.05)["targets"]}

    always, never = fake(True), fake(False)
    fa_key = next(k for k in always if k.startswith("false-alarm"))
    assert always[fa_key] is False and never[fa_key] is True
    det = [k for k in always if "detected >=" in k]
    assert len(det) >= 4 and all(always[k] for k in det) and not any(never[k] for k in det)


def test_bench_twins_truth_and_method_of_bins():
    """The twins benchmark's own pieces, without training: the method-of-bins curve reproduces a
    known power curve, and the twin truth per bin is the measured simulator - real difference."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_twins as bt
    finally:
        sys.path.pop(0)
    from wmcheck.datasets.episode import Episode

    rng = np.random.default_rng(0)
    names = {"Ws_avg": 0, "Va_avg": 1, "Ot_avg": 2}

    def week(i, offset=0.0):
        v = rng.uniform(0, 12, 300)
        p = np.clip(2.0 * v**3, 0, 2050) + offset  # a known curve (15 degC: rho close to rho_ref)
        inputs = np.stack([v, np.zeros(300), np.full(300, 15.0)], 1).astype(np.float32)
        obs = np.concatenate([[0.0], p])[:, None].astype(np.float32)
        return Episode(obs, np.zeros((300, 2), np.float32), inputs=inputs, id=i)

    real = [week(i) for i in range(6)]
    mob = bt.MethodOfBins(names, rho_ref=1.225).fit(real)
    sim = [mob.replay(e) for e in real]
    err = np.concatenate([s.observations[1:, 0] - r.observations[1:, 0] for s, r in zip(sim, real)])
    assert np.median(np.abs(err)) < 60  # within a 0.5 m/s bin of a cubic curve
    biased = [dataclasses.replace(e, observations=e.observations + 100.0) for e in real]
    truth = bt.twin_truth(biased, real, names, [(0, 6), (6, 12)])
    assert [t["median"] for t in truth] == pytest.approx([100.0, 100.0], abs=1e-3)
    assert all(t["ci"][0] <= 100.0 + 1e-3 and t["ci"][1] >= 100.0 - 1e-3 and t["steps"] > 0 for t in truth)


def test_bench_check_small(tmp_path):
    """bench_check.py end to end on a tiny Pendulum run: every stage it times is found in checks.check
    (a renamed function made it crash before it printed anything) and the stages add up to the total."""
    args = ["--episodes", "3", "--real-episodes", "8", "--train-steps", "20", "--no-tensorboard"]
    _run("bench_check.py", *args, "--out", str(tmp_path), quick=False)  # no --quick there: these make it small
    data = json.loads((tmp_path / "bench_check.json").read_text())
    assert data["benchmark"] == "check_speed"
    checks = data["systems"][0]["checks"]
    assert [c["episodes"] for c in checks] == [3, 3] and [c["power_cached"] for c in checks] == [False, True]
    for c in checks:
        stages = c["stages"]
        assert {"scoring", "attribution", "power", "statistics", "report", "other"} <= set(stages)
        assert stages["scoring"] > 0 and stages["report"] > 0 and all(v >= 0 for v in stages.values())
        assert math.isclose(sum(stages.values()), c["seconds"], rel_tol=0.05, abs_tol=0.05)
    assert (tmp_path / "bench_check.md").read_text().count("| 3 |") == 2


def test_bench_coverage_table_counts_steps_within_the_target():
    """bench_coverage.markdown: the mean, the steps within 0.90 +- 0.03 and a step's sampling
    error come from the calibration's per-step coverage (a run without a measurable coverage
    shows dashes, not zeros dressed as figures)."""
    from wmcheck.scripts.bench_coverage import markdown

    cov = {"per_step": [0.9, 0.86, 0.95, 0.91], "per_channel": [0.9, 0.9], "min": 0.86, "max": 0.95, "episodes": 20}
    none = {"per_step": [None] * 4, "per_channel": [None, None], "min": None, "max": None, "episodes": 1}
    case = {
        "name": "folds 5",
        "held_out_episodes": 20,
        "blocks": 200,
        "coverage": cov,
        "card_coverage": None,
        "seconds": 1.0,
    }
    empty = {**case, "name": "split", "held_out_episodes": 1, "blocks": 2, "coverage": none}
    rows = markdown({"lhb": [case, empty]}).splitlines()
    assert "| 0.905, 0.86-0.95 | 0.050 | 2/4 | 0.015 |" in rows[2]  # s.e. sqrt(0.09 / (200 blocks x 2 channels))
    assert "| - | - | 0/4 |" in rows[3]


def test_bench_estimates_pairs_the_errors_and_counts_only_found_rows():
    """The fit / grid comparison is paired over checks where both found the row; an unfound row's
    estimate never enters a mean, and the off-grid set is kept apart from the on-grid one."""
    from wmcheck.scripts import bench_estimates as be

    def row(gap, size, on, fit, grid):
        truth = -size if gap == "latency" else 1 / size

        def attempt(est, seconds):
            return be.Attempt(
                verdict="fail",
                row="present" if est is not None else "absent",
                found=est is not None,
                estimate=est,
                truth=truth,
                abs_error=None if est is None else abs(est - truth),
                seconds=seconds,
            )

        return be.TruthCheck(gap, size, on, 0, 1600, attempt(fit, 2.0), attempt(grid, 6.0))

    rows = [
        row("latency", 1.5, False, -1.45, -1.0),  # errors 0.05 and 0.5
        row("latency", 1.5, False, -1.55, -2.0),  # 0.05 and 0.5
        row("latency", 1.5, False, -1.4, None),  # grid misses: not paired, fit's own mean only
        row("latency", 1.0, True, -1.1, -1.0),  # 0.1 and 0
    ]
    s = be.summarise(rows)
    off = s["sets"]["latency off the grid"]
    assert off["paired"] == 2 and off["grid"]["found"] == 2 and off["fit"]["estimated"] == 3
    assert abs(off["fit"]["mae_paired"] - 0.05) < 1e-9 and abs(off["grid"]["mae_paired"] - 0.5) < 1e-9
    assert abs(off["grid_over_fit"] - 10.0) < 1e-6
    assert abs(off["fit"]["mae"] - (0.05 + 0.05 + 0.1) / 3) < 1e-9
    on = s["sets"]["latency on the grid"]
    assert on["grid"]["mae_paired"] == 0.0 and on["grid_over_fit"] == 0.0
    assert s["median_check_seconds"] == {"fit": 2.0, "grid": 6.0}
    md = be.table("pendulum", s)
    assert "| latency off the grid | 3 |" in md and "grid / fit 3.00x" in md


def test_bench_estimates_quick(tmp_path):
    """bench_estimates end to end on a tiny budget: both attributions check each truth, every row's
    estimate is counted only where its row is found, and the summary's pairing matches the rows."""
    _run("bench_estimates.py", "--out", str(tmp_path))
    data = json.loads((tmp_path / "bench_estimates.json").read_text())
    assert data["benchmark"] == "estimates" and data["quick"] is True
    rows = data["systems"]["pendulum"]["rows"]
    assert [(r["gap"], r["on_grid"]) for r in rows] == [("latency", False), ("actuator", False)]
    for r in rows:
        for m in ("fit", "grid"):
            a = r[m]
            assert a["verdict"] in ("pass", "fail", "unverifiable", "inconclusive")
            assert a["found"] == (a["row"] in ("present", "tolerated"))
            assert (a["estimate"] is None) == (a["abs_error"] is None)
            if a["estimate"] is not None:
                assert a["found"] and abs(abs(a["estimate"] - a["truth"]) - a["abs_error"]) < 1e-9
            assert a["seconds"] > 0
    summary = data["systems"]["pendulum"]["summary"]
    for t in summary["truths"]:
        paired = sum(all(r[m]["abs_error"] is not None for m in ("fit", "grid")) for r in rows if r["gap"] == t["gap"])
        assert t["paired"] == paired and t["n"] == 1
    md = (tmp_path / "bench_estimates.md").read_text()
    assert "## pendulum" in md and "Median check time: fit" in md


def test_bench_twins_compare_bias_keeps_response_cells_apart():
    """A response cell (a slope factor, no level) is listed apart from the level cells and never
    compared with a twin mean; the level cells' coverage counts significant regime cells only."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_twins as bt
    finally:
        sys.path.pop(0)
    from wmcheck.datasets.episode import Episode

    names = {"Ws_avg": 0, "Va_avg": 1, "Ot_avg": 2}
    v = np.linspace(0, 12, 200)
    inputs = np.stack([v, np.zeros(200), np.full(200, 15.0)], 1).astype(np.float32)
    real = [
        Episode(np.zeros((201, 1), np.float32), np.zeros((200, 2), np.float32), inputs=inputs, id=i) for i in range(3)
    ]
    sim = [dataclasses.replace(e, observations=e.observations + 50.0) for e in real]
    level = {"channel": "P_avg", "kind": "overall", "where": None, "difference": 49.0, "ci95": [45.0, 55.0]}
    level.update(relative=0.1, significant=True)
    regime = dict(level, kind="regime", where={"control": "Ws_avg", "range": [0.0, 6.0]}, ci95=[10.0, 20.0])
    response = {"channel": "P_avg", "kind": "response", "where": None, "difference": -0.2, "ci95": [-0.3, -0.1]}
    response.update(response_factor=0.8, response_factor_ci95=[0.7, 0.9], significant=True)
    report = {"gaps": {"dynamics": {"estimate": {"bias": {"cells": [level, response, regime], "paired": True}}}}}
    out = bt.compare_bias(report, sim, real, names)
    assert [c["range"] for c in out["cells"]] == [None, [0.0, 6.0]]
    assert out["cells"][0]["covered"] and not out["cells"][1]["covered"]  # truth +50 is outside [10, 20]
    assert out["significant_regime_cells"] == 1 and out["coverage_significant"] == 0.0
    assert out["response"] == [{"factor": 0.8, "ci": [0.7, 0.9]}]


def test_bench_guard_e_detector_is_valid_on_uniform_p_values_and_fires_on_small_ones():
    """The e-detector bench_guard measures beside the guard's rule: its e-value has mean at most 1
    under a uniform p (so Doob bounds its false alarms by windows / threshold), and it fires on a
    run of small p-values."""
    from wmcheck.scripts.bench_guard import E_DETECTOR_THRESHOLD, mixture_e_value, shiryaev_roberts_alarm

    x = np.geomspace(1e-9, 60.0, 400_001)  # p = exp(-x): the heavy tail near p = 0 on a log grid
    g = np.array([mixture_e_value(np.exp(-v)) * np.exp(-v) for v in x])
    mean = float(np.sum(0.5 * (g[1:] + g[:-1]) * np.diff(x)))
    assert 0.95 < mean <= 1.0, mean  # below 1 only by the p < 1e-12 clip
    rng = np.random.default_rng(0)
    alarms = np.mean([shiryaev_roberts_alarm(rng.uniform(size=21), E_DETECTOR_THRESHOLD) for _ in range(4000)])
    assert alarms <= 21 / E_DETECTOR_THRESHOLD, alarms
    assert shiryaev_roberts_alarm([0.5] * 10 + [0.002] * 3, E_DETECTOR_THRESHOLD)
    assert not shiryaev_roberts_alarm([0.5] * 10 + [0.002], E_DETECTOR_THRESHOLD)


def test_detection_auroc_against_the_logs_policy_controls_leaves_the_other_policies_out():
    """`auroc_logs` ranks a row against the controls recorded under the logs' own policy only; under
    another policy every detector flags a faithful simulator, which the all-controls AUROC mixes in."""
    from wmcheck.scripts import bench_detection as bd

    def row(score, policy="hold:5"):
        base = {b: {"score": score, "flagged": False, "p": 0.5} for b in bd.BASELINES}
        return {
            "score": score,
            "strength": score,
            "policy": policy,
            "baselines": base,
            "verdict": "fail",
            "flagged": True,
            "truth": ["latency"],
            "top_gap": "latency",
            "present": [],
        }

    controls = [row(0.1), row(0.2), row(0.95, "hold:2"), row(0.99, "hold:2")]
    logs = [c for c in controls if c["policy"] == "hold:5"]
    stats = bd._row_stats([row(0.5)], controls, logs)
    assert stats["auroc"] == 0.5 and stats["auroc_logs"] == 1.0
    assert stats["auroc_strength"] == 0.5 and stats["auroc_strength_logs"] == 1.0
    assert stats["baselines"]["arx"]["auroc"] == 0.5 and stats["baselines"]["arx"]["auroc_logs"] == 1.0
    assert bd._row_stats([row(0.5)], controls)["auroc_logs"] == 0.5  # without the split: all controls


def test_the_double_pendulums_lqr_balances_its_reality_and_falls_with_one_more_step_of_latency():
    """The double-pendulum system's logs come from an LQR designed for the reality's one step of
    command latency (scripts/bench_families.py). It must balance that reality (else its logs are not
    a balancing plant's), and a simulator with one more step of latency must make it fall (the
    benchmark's early endings). The gain must stabilise the linearisation it was designed on."""
    from wmcheck.checks.reality import RealityProfile, record_reality
    from wmcheck.scripts.bench_families import (
        DOUBLE_PENDULUM,
        DoublePendulumLQR,
        _step_linearisation,
        delayed_lqr_gain,
    )

    A, B = _step_linearisation(DoublePendulumLQR.ENV)
    K = delayed_lqr_gain(A, B, (1, 50, 50, 1, 5, 5), 1.0, delay=1)
    n, m = A.shape[0], B.shape[1]
    closed = np.zeros((n + m, n + m))  # z = (x, the pending command): x' = A x + B u_pending, u' = -K z
    closed[:n, :n], closed[:n, n:] = A, B
    closed[n:] = -K
    assert np.abs(np.linalg.eigvals(closed)).max() < 1.0
    assert np.abs(np.linalg.eigvals(A)).max() > 1.0  # the plant alone is unstable

    quiet = DoublePendulumLQR(amp=0.0)
    reality = RealityProfile(**DOUBLE_PENDULUM.reality)
    held = record_reality(DOUBLE_PENDULUM.env_id, reality, quiet, episodes=8, max_steps=200, seed=0)
    balanced = sum(e.num_steps == 200 and not e.termination_array().any() for e in held)
    assert balanced >= 6, [e.num_steps for e in held]  # a start far from upright can still fall
    late = dataclasses.replace(reality, latency_steps=2)
    fell = record_reality(DOUBLE_PENDULUM.env_id, late, quiet, episodes=8, max_steps=200, seed=0)
    assert all(e.num_steps < 60 and e.termination_array()[-1] for e in fell), [e.num_steps for e in fell]
