"""Detection benchmark: how often a check is right, on realities whose gaps we injected ourselves.

For each system (Pendulum-v1; HalfCheetah-v5 in the gpu config):
  1. the "reality" is the simulator plus a `RealityProfile` with a few gaps (latency, actuator gain,
     a physical parameter, sensor noise); real logs are recorded from it under an exciting
     behaviour policy (random commands held K steps), a world model is trained on them and
     calibrated on its held-out episodes (`wmcheck.training.run.train`, `checks.calibration.calibrate`);
  2. simulators are checked against it with `wmcheck.checks.check.run_check`:
     (a) faithful controls: the reality's own profile, new episode and sensor-noise seeds;
     (b) the nominal simulator: no gaps at all (it differs from reality by every gap of the profile);
     (c) single-gap variants: the reality's profile with one gap made larger, four severities per
         gap type: latency (+steps), actuator (reality's gain / size: commands lose effect),
         sensor noise (independent noise of size x each channel's training std on top of reality's)
         and dynamics (a physical parameter scaled by 1 + size). Latency, actuator and sensor-noise
         sizes are those of calibration's power table, so its predicted detection probability can
         be set against the measured detection rate;
     (d) a simple controller's closed-loop rollouts in the faithful simulator;
  3. on the same checked logs the two baselines of `checks.baselines` run against the held-out real
     episodes: a block MMD two-sample test on visited states, and a one-step MLP ensemble's residual
     rank test (fitted once on the training episodes).

A check "flags" a simulator when its verdict is not `pass` (exit code 1 under the default gate:
`fail` or `unverifiable`); baselines flag at p < alpha. Reported per gap type and severity: detection
rate, AUROC of `summary.score` (and of the baselines' scores) against the faithful controls (rank
based, no point adjustment), attribution accuracy (`summary.top_gap` is the injected gap type),
estimate error where the report has an estimate in the gap's units, calibration's predicted
detection probability vs the measured rate; for the controls, the false-alarm rate with its Wilson
95% interval.

    .venv/bin/python scripts/bench_detection.py                    # cpu config (~30 min, 1 thread)
    .venv/bin/python scripts/bench_detection.py --config gpu         # GPU machine: trains on cuda, 14 check workers
    .venv/bin/python scripts/bench_detection.py --quick            # a smoke test of the script (~1 min)

Writes OUT/bench_detection.json and OUT/bench_detection.md (atomically); logs, runs and checked
rollouts go to OUT/work/<system>/ (`--reuse` keeps a trained, calibrated run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.baselines import MLPBaseline, mmd_baseline
from wmcheck.checks.calibration import POWER_SIZES, calibrate
from wmcheck.checks.check import run_check
from wmcheck.checks.config import CheckConfig
from wmcheck.checks.reality import RealityProfile, reality_env_args
from wmcheck.checks.stats import rank_auc
from wmcheck.datasets.episode import LogMeta
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.record import Recorder
from wmcheck.datasets.split import split_episodes
from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.checkpoint import load_model
from wmcheck.training.config import TrainConfig
from wmcheck.training.run import build_run_config, train

BENCH_VERSION = 1
GAP_TYPES = ("latency", "actuator", "sensor_noise", "dynamics")  # the report's gap names
UNITS = {
    "latency": "extra steps",
    "actuator": "gain 1/size",
    "sensor_noise": "x channel std",
    "dynamics": "parameter x (1 + size)",
}


# ---- controllers for the policy checks (d) ---------------------------------------------------------


def pendulum_pd(obs) -> np.ndarray:
    """PD torque towards upright, saturated at Pendulum's 2 N m (it cannot lift from the bottom in
    one go: it pumps and falls back, a closed-loop behaviour unlike the random logs)."""
    theta = math.atan2(float(obs[1]), float(obs[0]))
    return np.array([np.clip(-6.0 * theta - 1.5 * float(obs[2]), -2.0, 2.0)], np.float32)


class CheetahGait:
    """An open-loop sinusoidal gait (period 20 steps, back/front legs in antiphase) with damping on
    the joint velocities: a simple, deterministic controller for HalfCheetah."""

    def __init__(self):
        self.t = 0
        self.phase = np.array([0.0, 0.5, 1.0, math.pi, math.pi + 0.5, math.pi + 1.0])

    def reset(self, seed: int) -> None:
        self.t = 0

    def __call__(self, obs) -> np.ndarray:
        a = 0.7 * np.sin(2 * math.pi * self.t / 20 + self.phase) - 0.05 * np.asarray(obs[11:17], float)
        self.t += 1
        return np.clip(a, -1, 1).astype(np.float32)


CONTROLLERS = {"pendulum_pd": lambda: pendulum_pd, "cheetah_gait": CheetahGait}


# ---- what a system's benchmark does ----------------------------------------------------------------


@dataclass
class SystemSpec:
    """One system: its reality, real logs, world model and how many checks of each kind."""

    name: str
    env_id: str
    reality: dict  # RealityProfile fields: the real system relative to the nominal simulator
    dynamics_param: str  # physical parameter the dynamics variants scale
    dynamics_sizes: tuple[float, ...]  # relative changes (scale 1 + size, on top of reality's)
    controller: str  # key of CONTROLLERS
    episodes: int = 48  # real episodes (train + held out)
    max_steps: int = 200
    policy: str = "hold:5"  # exciting behaviour policy of the real logs and the checked simulators
    preset: str = "debug"
    steps: int = 3000
    batch_size: int = 32
    seq_len: int = 32
    lr: float = 1e-3
    warmup: int = 100
    val_fraction: float = 0.3  # 48 episodes: 16 held out, 24 blocks per power half
    check_episodes: int = 6  # episodes per checked simulator
    controls: int = 10  # faithful simulators (new seeds)
    reps: int = 1  # checks per gap type and severity
    policy_checks: int = 1
    sizes: dict = field(
        default_factory=lambda: {g: tuple(POWER_SIZES[g]) for g in ("latency", "actuator", "sensor_noise")}
    )

    def gap_sizes(self) -> dict[str, tuple]:
        return {**{g: tuple(s) for g, s in self.sizes.items()}, "dynamics": tuple(self.dynamics_sizes)}


PENDULUM = SystemSpec(
    "pendulum",
    "Pendulum-v1",
    reality={"latency_steps": 1, "actuator_gain": 0.85, "sensor_noise_std": 0.01, "physics": {"m": {"scale": 1.2}}},
    # Gravity, not mass: Pendulum-v1's mass only divides the torque term, so a mass change is an
    # actuator gain in disguise (a first run with m measured exactly that); g acts on the unforced motion.
    dynamics_param="g",
    dynamics_sizes=(0.05, 0.1, 0.25, 0.5),
    controller="pendulum_pd",
    check_episodes=8,
    controls=20,
    reps=3,
    policy_checks=2,
)
HALFCHEETAH = SystemSpec(
    "halfcheetah",
    "HalfCheetah-v5",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.9,
        "sensor_noise_std": 0.01,
        "physics": {"dof_damping": {"scale": 1.3}},
    },
    dynamics_param="dof_damping",
    dynamics_sizes=(0.25, 0.5, 1.0, 2.0),
    controller="cheetah_gait",
    episodes=60,
    max_steps=400,
    preset="size1m",
    steps=3000,
    batch_size=16,
    seq_len=64,
    check_episodes=4,
)

# Check geometry: the defaults, with coarser attribution grids (each still holds the identity and
# the sizes injected here) so a check costs ~20-40 s on one CPU thread.
CHECK_CONFIG = CheckConfig(
    gain_grid=(0.5, 0.63, 0.8, 0.9, 1.0, 1.12, 1.25, 1.6, 2.0),
    offset_grid=(-0.5, -0.1, 0.0, 0.1, 0.5),
    deadband_grid=(0.0, 0.25),
    bootstrap=200,
)

CONFIGS = {
    # 2-core CPU, 1 thread, < 30 min: Pendulum only (HalfCheetah's larger model and longer episodes
    # do not fit next to it; run `--systems halfcheetah` separately or the gpu config).
    "cpu": {"pendulum": PENDULUM},
    # GPU machine (training on the GPU, checks on CPU worker processes): both systems, more seeds.
    # Not yet run on a GPU (no device in the session that wrote it): sized by the CPU timings
    # (~10 s per Pendulum check on one thread, 14 workers) to stay well inside 10 minutes.
    "gpu": {
        "pendulum": dataclasses.replace(
            PENDULUM, episodes=60, preset="size1m", steps=3000, controls=40, reps=6, policy_checks=4
        ),
        "halfcheetah": dataclasses.replace(HALFCHEETAH, steps=2500, controls=20, reps=3, policy_checks=2),
    },
}


def quick(spec: SystemSpec) -> SystemSpec:
    """A ~1-minute version (smoke test): tiny logs and model, one severity per gap type."""
    # 14 held-out episodes of 200 steps: 21 blocks per power half and 12 per check, enough for the
    # rank tests' normal approximation (with < 12 blocks their Monte-Carlo permutation version makes
    # the power table of every check cost over a minute).
    return dataclasses.replace(
        spec,
        episodes=20,
        max_steps=200,
        preset="debug",
        steps=30,
        batch_size=8,
        seq_len=16,
        warmup=5,
        val_fraction=0.6,
        check_episodes=4,
        controls=2,
        reps=1,
        policy_checks=1,
        sizes={g: (s[-1],) for g, s in spec.sizes.items()},
        dynamics_sizes=spec.dynamics_sizes[-1:],
    )


# ---- simulators ------------------------------------------------------------------------------------


def _scaled(value, factor):
    """A per-channel value (None = 1, number or list) times `factor`."""
    if value is None:
        value = 1.0
    return [v * factor for v in value] if isinstance(value, list) else value * factor


def variant(reality: RealityProfile, gap: str, size: float, obs_std: np.ndarray, param: str) -> RealityProfile:
    """The reality's profile with one gap made larger by `size` (see the module docstring)."""
    r = reality
    if gap == "latency":
        kw = {"latency_steps": r.latency_steps + int(size)}
    elif gap == "actuator":
        kw = {"actuator_gain": _scaled(r.actuator_gain, 1.0 / size)}
    elif gap == "sensor_noise":
        base = np.broadcast_to(
            np.asarray(0.0 if r.sensor_noise_std is None else r.sensor_noise_std, float), obs_std.shape
        )
        kw = {"sensor_noise_std": np.sqrt(base**2 + (size * obs_std) ** 2).tolist()}  # independent noise adds variances
    elif gap == "dynamics":
        physics = dict(r.physics)
        old = physics.get(param, {"scale": 1.0})
        physics[param] = {"scale": _scaled(old["scale"], 1.0 + size)}
        kw = {"physics": physics}
    else:
        raise ValueError(f"unknown gap {gap!r}")
    return dataclasses.replace(r, **kw, name=f"{gap}={size:g}")


def record(
    env_id: str, profile: RealityProfile, policy, episodes: int, max_steps: int, seed: int, path: Path, source: str
) -> LogMeta:
    rid, kw = reality_env_args(env_id, profile)
    with Recorder(rid, policy, seed, kw, max_steps) as rec:
        meta = rec.meta(source)
        eps = list(rec.episodes(episodes))
    write_log(path, eps, meta)
    return meta


# ---- one check (runs in a worker process when --workers > 1) -------------------------------------------


@dataclass
class CheckJob:
    """One checked simulator: how to record it and what it truly differs in."""

    system: str
    group: str  # control | nominal | gap | policy
    name: str
    profile: dict
    policy: str  # a behaviour policy spec, or "controller:<key>"
    seed: int
    gap: str | None = None
    size: float | None = None


def _policy(spec: str):
    return CONTROLLERS[spec.split(":", 1)[1]]() if spec.startswith("controller:") else spec


_BASELINE_CACHE: dict = {}


def _baselines(run_dir: Path, log_path: Path):
    """(norm, held-out real episodes, fitted MLP baseline) for a run, built once per process."""
    key = str(run_dir)
    if key not in _BASELINE_CACHE:
        bundle = load_model(run_dir)
        norm = Normalizer.from_dict(bundle.normalizer)
        t = bundle.run_config["train"]
        with open_log(log_path) as log:
            train_ids, val_ids = split_episodes(log.episode_ids, t["val_fraction"], t["seed"])
            tr, held = list(log.episodes(train_ids)), list(log.episodes(val_ids))
        block = CHECK_CONFIG.context + CHECK_CONFIG.horizon
        _BASELINE_CACHE[key] = (norm, held, MLPBaseline(tr, held, norm, block=block, seed=0))
    return _BASELINE_CACHE[key]


def run_one(job: CheckJob, spec: SystemSpec, run_dir: Path, log_path: Path, work: Path, threads: int) -> dict:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    path = work / "checked" / f"{job.name}.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    record(
        spec.env_id,
        RealityProfile.from_dict(job.profile),
        _policy(job.policy),
        spec.check_episodes,
        spec.max_steps,
        job.seed,
        path,
        "policy" if job.group == "policy" else "sim",
    )
    report = run_check(run_dir, path, seed=job.seed)
    norm, held, mlp = _baselines(run_dir, log_path)
    with open_log(path) as log:
        checked = list(log)
    alpha = report["summary"]["alpha"]
    mmd = mmd_baseline(held, checked, norm, block=CHECK_CONFIG.context + CHECK_CONFIG.horizon, seed=job.seed)
    mlp_r = mlp.test(checked)
    s = report["summary"]
    gaps = report["gaps"]
    out = {
        **dataclasses.asdict(job),
        "verdict": report["verdict"],
        # a flag is a finding (fail or unverifiable); inconclusive (no power) is neither a pass nor a finding
        "flagged": report["verdict"] in ("fail", "unverifiable"),
        "score": s["score"],
        "top_gap": s["top_gap"],
        "confounded": s["confounded"],
        "present": sorted(g for g, e in gaps.items() if e["verdict"] in ("present", "tolerated")),
        "episodes": {k: s[k] for k in ("episodes", "consistent", "divergent", "unverifiable")},
        "blocks": s["blocks"],
        "competent_blocks": s["competent_blocks"],
        "estimates": {
            g: gaps[g]["estimate"] for g in ("latency", "actuator", "sensor_noise") if gaps[g].get("estimate")
        },
        "baselines": {
            "mmd": {"p": mmd.p_value, "score": mmd.score, "flagged": bool(mmd.p_value < alpha)},
            "mlp": {"p": mlp_r.p_value, "score": mlp_r.score, "flagged": bool(mlp_r.p_value < alpha)},
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }
    power = report["power"]["gaps"]
    if job.gap in power and job.size in [float(x) for x in power[job.gap]["sizes"]]:
        i = [float(x) for x in power[job.gap]["sizes"]].index(job.size)
        out["power_predicted"] = power[job.gap]["detection_probability"][i]
    path.unlink()  # the checked rollouts are re-creatable from (profile, policy, seed)
    return out


# ---- statistics of the results -----------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.959964) -> list[float] | None:
    """Wilson score 95% interval of a binomial proportion k / n."""
    if n == 0:
        return None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def estimate_error(gap: str, size: float, est: dict | None) -> dict | None:
    """The report's estimate against the injected truth, in the gap's units (None where the report
    gives no estimate in units of the injected change: sensor noise ratios and dynamics)."""
    if not est:
        return None
    if gap == "latency":  # the simulator responds `size` steps later: the correction shifts by -size
        return {"truth": -int(size), "estimate": est["steps"], "abs_error": abs(est["steps"] + int(size))}
    if gap == "actuator" and est.get("kind") == "gain":  # commands must be scaled by 1/size to match reality
        truth = 1.0 / size
        return {
            "truth": truth,
            "estimate": est["value"],
            "abs_error": abs(est["value"] - truth),
            "rel_error": abs(est["value"] / truth - 1),
        }
    if gap == "actuator":
        return {"truth": 1.0 / size, "estimate": None, "kind": est.get("kind"), "abs_error": None}
    return None


def summarise(spec: SystemSpec, results: list[dict], alpha: float) -> dict:
    controls = [r for r in results if r["group"] == "control"]
    ctrl_scores = {
        "wmcheck": [r["score"] for r in controls],
        **{b: [r["baselines"][b]["score"] for r in controls] for b in ("mmd", "mlp")},
    }

    def rate(rows, key=lambda r: r["flagged"]):
        k = sum(bool(key(r)) for r in rows)
        return {"n": len(rows), "k": k, "rate": k / len(rows) if rows else None, "ci95": wilson(k, len(rows))}

    summary = {
        "false_alarms": {
            "wmcheck": rate(controls),
            "wmcheck_fail_only": rate(controls, lambda r: r["verdict"] == "fail"),
            "wmcheck_inconclusive": rate(controls, lambda r: r["verdict"] == "inconclusive"),
            **{b: rate(controls, lambda r, b=b: r["baselines"][b]["flagged"]) for b in ("mmd", "mlp")},
        },
        "cells": [],
    }
    for gap, sizes in spec.gap_sizes().items():
        for size in sizes:
            rows = [r for r in results if r["group"] == "gap" and r["gap"] == gap and r["size"] == float(size)]
            if not rows:
                continue
            errs = [estimate_error(gap, size, r["estimates"].get(gap)) for r in rows]
            abs_errs = [e["abs_error"] for e in errs if e and e.get("abs_error") is not None]
            pred = [r["power_predicted"] for r in rows if r.get("power_predicted") is not None]
            cell = {
                "gap": gap,
                "size": float(size),
                "units": UNITS[gap],
                "n": len(rows),
                "detection": rate(rows),
                "auroc": rank_auc([r["score"] for r in rows], ctrl_scores["wmcheck"]) if controls else None,
                "attribution": rate(rows, lambda r, gap=gap: r["top_gap"] == gap),
                "attribution_among_detected": rate(
                    [r for r in rows if r["flagged"]], lambda r, gap=gap: r["top_gap"] == gap
                ),
                "top_gaps": [r["top_gap"] for r in rows],
                "estimate_mean_abs_error": _mean(abs_errs),
                "estimates": [e for e in errs if e],
                "power_predicted": _mean(pred),
                "power_gap": (abs(_mean(pred) - rate(rows)["rate"]) if pred else None),
                "baselines": {
                    b: {
                        "detection": rate(rows, lambda r, b=b: r["baselines"][b]["flagged"]),
                        "auroc": rank_auc([r["baselines"][b]["score"] for r in rows], ctrl_scores[b])
                        if controls
                        else None,
                    }
                    for b in ("mmd", "mlp")
                },
            }
            if gap == "sensor_noise":
                cell["noise_ratio_estimates"] = [
                    r["estimates"].get("sensor_noise", {}).get("noise_ratio") for r in rows
                ]
            summary["cells"].append(cell)
    summary["targets"] = targets(spec, summary, alpha)
    return summary


def targets(spec: SystemSpec, summary: dict, alpha: float) -> list[dict]:
    """The issue's targets, each with the measured figure and met / missed."""
    out = []
    fa = summary["false_alarms"]["wmcheck"]
    if fa["n"]:
        # "<= alpha plus sampling error": alpha inside (or above) the Wilson interval of the rate
        out.append(
            {
                "target": f"false-alarm rate on faithful controls <= {alpha} (+ sampling error)",
                "measured": f"{fa['k']}/{fa['n']} = {fa['rate']:.2f}, 95% CI [{fa['ci95'][0]:.2f}, {fa['ci95'][1]:.2f}]",
                "met": bool(fa["ci95"][0] <= alpha),
            }
        )
    sizes = spec.gap_sizes()
    for gap in GAP_TYPES:
        cells = [c for c in summary["cells"] if c["gap"] == gap]
        if not cells:
            continue
        big = max(cells, key=lambda c: c["size"])
        small = min(cells, key=lambda c: c["size"])
        out.append(
            {
                "target": f"{gap} at the largest size ({big['size']:g}) detected in >= 95% of checks",
                "measured": f"{big['detection']['k']}/{big['n']}",
                "met": bool(big["detection"]["rate"] >= 0.95),
            }
        )
        out.append(
            {
                "target": f"{gap} at the largest size attributed correctly in >= 90% of checks",
                "measured": f"{big['attribution']['k']}/{big['n']}",
                "met": bool(big["attribution"]["rate"] >= 0.9),
            }
        )
        if small["auroc"] is not None and len(sizes[gap]) > 0:
            base = max(
                v for v in (small["baselines"]["mmd"]["auroc"], small["baselines"]["mlp"]["auroc"]) if v is not None
            )
            out.append(
                {
                    "target": f"{gap} at the smallest size ({small['size']:g}): wmcheck AUROC >= the baselines'",
                    "measured": f"{small['auroc']:.2f} vs {base:.2f} (best baseline)",
                    "met": bool(small["auroc"] >= base),
                }
            )
    gaps_pw = [c for c in summary["cells"] if c["power_predicted"] is not None]
    if gaps_pw:
        worst = max(gaps_pw, key=lambda c: c["power_gap"])
        out.append(
            {
                "target": "predicted power within 0.1 of the measured detection rate",
                "measured": f"{sum(c['power_gap'] <= 0.1 for c in gaps_pw)}/{len(gaps_pw)} cells within 0.1; "
                f"worst {worst['gap']}={worst['size']:g}: predicted {worst['power_predicted']:.2f}, "
                f"measured {worst['detection']['rate']:.2f}",
                "met": bool(all(c["power_gap"] <= 0.1 for c in gaps_pw)),
            }
        )
    return out


# ---- Markdown --------------------------------------------------------------------------------------


def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _rate(r: dict) -> str:
    return "–" if not r["n"] else f"{r['rate']:.2f} ({r['k']}/{r['n']})"


def system_markdown(s: dict) -> str:
    spec, summ = s["spec"], s["summary"]
    fa = summ["false_alarms"]
    lines = [
        f"### {spec['name']}: {spec['env_id']}",
        "",
        f"Reality: {s['reality']}. Real logs: {spec['episodes']} episodes x {spec['max_steps']} steps under "
        f"{spec['policy']}; world model {spec['preset']}, {spec['steps']} steps (train {s['seconds']['train']:.0f} s, "
        f"calibration {s['seconds']['calibrate']:.0f} s on {s['calibration_blocks']} held-out blocks); "
        f"{spec['check_episodes']} episodes per checked simulator; {len(s['checks'])} checks "
        f"({s['seconds']['checks']:.0f} s).",
        "",
        f"Faithful controls: false alarms {_rate(fa['wmcheck'])}, Wilson 95% CI "
        f"[{_f(fa['wmcheck']['ci95'][0])}, {_f(fa['wmcheck']['ci95'][1])}] (of them `fail`: {fa['wmcheck_fail_only']['k']}); "
        f"MMD baseline {_rate(fa['mmd'])}, MLP baseline {_rate(fa['mlp'])}.",
        "",
        "| gap | size | n | detected | AUROC | attributed | est. abs. error | predicted power | MMD det. / AUROC | MLP det. / AUROC |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summ["cells"]:
        b = c["baselines"]
        lines.append(
            f"| {c['gap']} | {c['size']:g} ({c['units']}) | {c['n']} | {_f(c['detection']['rate'])} | {_f(c['auroc'])} | "
            f"{_f(c['attribution']['rate'])} | {_f(c['estimate_mean_abs_error'])} | {_f(c['power_predicted'])} | "
            f"{_f(b['mmd']['detection']['rate'])} / {_f(b['mmd']['auroc'])} | {_f(b['mlp']['detection']['rate'])} / {_f(b['mlp']['auroc'])} |"
        )
    for group, label in (("nominal", "Nominal simulator"), ("policy", "Controller rollouts (faithful simulator)")):
        rows = [r for r in s["checks"] if r["group"] == group]
        if rows:
            lines += [
                "",
                f"{label}: "
                + "; ".join(
                    f"{r['verdict']} (score {r['score']:.2f}, top gap {r['top_gap']}, present: {', '.join(r['present']) or 'none'}; "
                    f"MMD p {r['baselines']['mmd']['p']:.3g}, MLP p {r['baselines']['mlp']['p']:.3g})"
                    for r in rows
                )
                + ".",
            ]
    lines += ["", "Targets:", ""] + [
        f"- {'met' if t['met'] else 'MISSED'}: {t['target']} — {t['measured']}" for t in summ["targets"]
    ]
    return "\n".join(lines) + "\n"


# ---- driver ----------------------------------------------------------------------------------------


def jobs_for(spec: SystemSpec, reality: RealityProfile, obs_std: np.ndarray) -> list[CheckJob]:
    jobs = []
    for k in range(spec.controls):
        prof = dataclasses.replace(reality, seed=1000 + k, name=f"faithful-{k}")
        jobs.append(CheckJob(spec.name, "control", f"control{k}", prof.to_dict(), spec.policy, 10_000 + 100 * k))
    jobs.append(
        CheckJob(spec.name, "nominal", "nominal", RealityProfile(name="nominal").to_dict(), spec.policy, 20_000)
    )
    for g, (gap, sizes) in enumerate(spec.gap_sizes().items()):
        for i, size in enumerate(sizes):
            for rep in range(spec.reps):
                prof = variant(
                    dataclasses.replace(reality, seed=2000 + 100 * g + 10 * i + rep),
                    gap,
                    float(size),
                    obs_std,
                    spec.dynamics_param,
                )
                jobs.append(
                    CheckJob(
                        spec.name,
                        "gap",
                        f"{gap}{i}r{rep}",
                        prof.to_dict(),
                        spec.policy,
                        30_000 + 1000 * g + 100 * i + 10 * rep,
                        gap,
                        float(size),
                    )
                )
    for k in range(spec.policy_checks):
        prof = dataclasses.replace(reality, seed=3000 + k, name=f"controller-{k}")
        jobs.append(
            CheckJob(
                spec.name, "policy", f"policy{k}", prof.to_dict(), f"controller:{spec.controller}", 40_000 + 100 * k
            )
        )
    return jobs


def run_system(spec: SystemSpec, work: Path, args) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    log_path, run_dir = work / "real.h5", work / "run"
    reality = RealityProfile(**spec.reality, seed=0)
    t0 = time.perf_counter()
    have_run = args.reuse and (run_dir / "calibration.json").exists() and log_path.exists()
    if not have_run:
        for stale in (log_path, run_dir):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        print(
            f"[{spec.name}] recording {spec.episodes} real episodes from {spec.env_id} with {reality.describe()}",
            flush=True,
        )
        record(spec.env_id, reality, spec.policy, spec.episodes, spec.max_steps, 0, log_path, "real")
    t_data = time.perf_counter() - t0
    cfg = TrainConfig(
        preset=spec.preset,
        max_steps=spec.steps,
        batch_size=spec.batch_size,
        seq_len=spec.seq_len,
        lr=spec.lr,
        warmup=spec.warmup,
        val_fraction=spec.val_fraction,
        seed=0,
        val_every=spec.steps,
        ckpt_every=spec.steps,
        progress_bar=False,
        accelerator="cpu" if args.device == "cpu" else "auto",
    )
    t1 = time.perf_counter()
    if not have_run:
        print(
            f"[{spec.name}] training {spec.preset} for {spec.steps} steps (B={spec.batch_size}, T={spec.seq_len})",
            flush=True,
        )
        train(log_path, run_dir, build_run_config(cfg))
    t_train = time.perf_counter() - t1
    t2 = time.perf_counter()
    if not have_run:
        print(f"[{spec.name}] calibrating", flush=True)
        calibrate(run_dir, log_path, CHECK_CONFIG, verbose=False)
    t_cal = time.perf_counter() - t2
    cal_info = json.loads((run_dir / "calibration.json").read_text())["info"]
    obs_std = Normalizer.from_dict(load_model(run_dir).normalizer).std["obs"].astype(float)

    jobs = jobs_for(spec, reality, obs_std)
    print(f"[{spec.name}] {len(jobs)} checks ({args.workers} worker(s))", flush=True)
    t3 = time.perf_counter()
    results = []

    def done(r):
        results.append(r)
        extra = f" {r['gap']}={r['size']:g}" if r["gap"] else ""
        print(
            f"[{spec.name}] {len(results)}/{len(jobs)} {r['group']}{extra}: {r['verdict']} score {r['score']:.2f} "
            f"top {r['top_gap']} | MMD p {r['baselines']['mmd']['p']:.3g} MLP p {r['baselines']['mlp']['p']:.3g} "
            f"({r['seconds']:.0f} s, {time.perf_counter() - t3:.0f} s in)",
            flush=True,
        )

    if args.workers > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            futs = [pool.submit(run_one, j, spec, run_dir, log_path, work, 1) for j in jobs]
            for f in futs:
                done(f.result())
    else:
        for j in jobs:
            done(run_one(j, spec, run_dir, log_path, work, args.threads))
    t_checks = time.perf_counter() - t3
    order = {j.name: i for i, j in enumerate(jobs)}
    results.sort(key=lambda r: order[r["name"]])
    alpha = CHECK_CONFIG.alpha
    return {
        "system": spec.name,
        "spec": dataclasses.asdict(spec),
        "reality": reality.describe(),
        "reality_profile": reality.to_dict(),
        "check_config": CHECK_CONFIG.to_dict(),
        "calibration_blocks": cal_info["blocks"],
        "calibration_warning": cal_info.get("warning"),
        "reused_run": bool(have_run),
        "checks": results,
        "summary": summarise(spec, results, alpha),
        "seconds": {"data": t_data, "train": t_train, "calibrate": t_cal, "checks": t_checks},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="cpu",
        help="cpu: Pendulum, < 30 min on 1 thread; gpu: both systems, more seeds",
    )
    p.add_argument(
        "--systems",
        default=None,
        help="comma-separated subset of the config's systems (or halfcheetah in the cpu config)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="training device: cpu (cpu config's default) or cuda (gpu config's default; "
        "Lightning picks the GPU, bf16; checks stay on CPU)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="check worker processes, 1 torch thread each (cpu config: 1, sequential; gpu config: CPU count - 2)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads of this process (default 1; see README troubleshooting)",
    )
    p.add_argument("--quick", action="store_true", help="tiny logs and model, one size per gap: a smoke test")
    p.add_argument("--reuse", action="store_true", help="keep OUT/work logs and calibrated runs (not retrained)")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if args.config == "gpu" else "cpu"
    if args.workers is None:
        args.workers = max(1, (os.cpu_count() or 1) - 2) if args.config == "gpu" else 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = dict(CONFIGS[args.config])
    if args.systems:
        names = [s.strip() for s in args.systems.split(",") if s.strip()]
        known = {**CONFIGS["cpu"], "halfcheetah": HALFCHEETAH, **CONFIGS[args.config]}
        bad = [n for n in names if n not in known]
        if bad:
            p.error(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(known)}")
        specs = {n: known[n] for n in names}
    out = Path(args.out)
    started = time.perf_counter()
    info = machine_info(
        device=args.device,
        workers=args.workers,
        config=args.config,
        command=" ".join(["scripts/bench_detection.py", *(argv if argv is not None else sys.argv[1:])]),
    )
    systems = []
    for name, spec in specs.items():
        if args.quick:
            spec = quick(spec)
        r = run_system(spec, out / "work" / name, args)
        systems.append(r)
        print(system_markdown(r), flush=True)
    finish(info, started)
    md = "\n".join(
        [
            f"# Detection benchmark ({info['date']}, config {args.config}{', quick' if args.quick else ''})",
            "",
            f"A check flags a simulator when its verdict is not `pass`; baselines flag at p < alpha = {CHECK_CONFIG.alpha}. "
            "AUROC: `summary.score` (baselines: their block scores) of the gapped simulators against the faithful controls. "
            "Attributed: `summary.top_gap` is the injected gap type. Predicted power: calibration's power table in each report "
            f"(mean over the cell's checks). {info['cpu_count']} CPUs, {info['torch_threads']} torch thread(s), "
            f"{args.workers} check worker(s), training on {args.device}; total {info['total_seconds']:.0f} s.",
            "",
        ]
        + [system_markdown(s) for s in systems]
    )
    write_results(
        out,
        "bench_detection",
        {"benchmark": "detection", "version": BENCH_VERSION, "machine": info, "quick": args.quick, "systems": systems},
        md,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
