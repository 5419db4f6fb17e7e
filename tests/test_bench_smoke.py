"""Smoke tests of the benchmark scripts: each runs end to end with --quick (seconds) and writes
JSON with the expected keys and finite numbers, plus the Markdown table."""
from __future__ import annotations

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


def _run(script: str, *args: str) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--quick", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
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
        for key in ("preset", "B", "T", "device", "precision", "params", "timed_steps", "s_per_step",
                    "env_steps_per_s", "ref_env_steps_per_s", "ratio"):
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
    assert data["benchmark"] == "worldmodel_openloop" and data["version"] == 1
    assert [s["system"] for s in data["systems"]] == systems
    for s in data["systems"]:
        assert s["context"] == 16 and s["horizons"][0] == 1 and len(s["horizons"]) >= 2
        assert s["split"]["train_episodes"] >= 1 and s["split"]["val_episodes"] >= 1
        assert not set(s["split"]["train_ids"]) & set(s["split"]["val_ids"])  # held-out episodes are unseen
        for method in ("world_model", "persistence", "arx", "arx22"):
            means = s["methods"][method]["nrmse_mean"]
            assert len(means) == len(s["horizons"])
            assert all(_finite(v) and v >= 0 for v in means), (method, means)
            per_channel = np.array(s["methods"][method]["nrmse_per_channel"], float)
            assert per_channel.shape == (len(s["horizons"]), s["dims"]["obs"])
        assert 0.0 <= s["world_model_coverage90"] <= 1.0
        assert all(0.0 <= c <= 1.0 for c in s["world_model_coverage90_by_horizon"])
        assert s["arx"]["p"] >= 1 and s["arx"]["q"] >= 0
        assert set(s["world_model_beats_both"]) == {f"h{h}" for h in s["horizons"]}
    lhb = data["systems"][-1]
    assert lhb["dims"] == {"obs": 1, "action": 2, "input": 3}
    md = (tmp_path / "bench_worldmodel.md").read_text()
    assert "| horizon | world model | persistence | ARX |" in md


def test_arx_recovers_a_linear_system_and_rolls_it_forward():
    """On data from a known ARX(2, 1) system without noise, the fit is exact and the open-loop
    rollout reproduces the trajectory; the order selection picks an order that contains it."""
    from wmcheck.scripts.baselines_openloop import ARX, StepSeq, persistence, select_arx

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
