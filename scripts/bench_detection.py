"""Detection benchmark: how often a check is right, on checked simulators that look like the world's.

For each system (Pendulum-v1 in the cpu config; HalfCheetah-v5 and Pusher-v5 too in the gpu config):
  1. the "reality" is the simulator plus a `RealityProfile`: sensor noise, process noise (a random
     force every step), latency, an actuator gain and a physical parameter; real logs are recorded
     from it under an exciting behaviour policy (random commands held K steps), a world model is
     trained on them and calibrated on its held-out episodes;
  2. the checked simulators come in five families (scripts/bench_families.py): deterministic
     simulators (noise-free, as engineering simulators are: the reality's twin, with biased physics,
     missing latency, the nominal env), perturbations of reality (one gap made larger, graded sizes),
     faithful controls under other conditions (the logs' policy, other excitation, a closed-loop
     controller, few and many episodes), the largest dynamics and actuator gaps checked under the
     other policies only, and simulators whose episodes end early; each row has its ground truth
     (the gap types it truly has);
  3. on the same checked logs three baselines run against the held-out real episodes with
     episode-level tests: a linear ARX one-step residual detector (two-sided), a block MMD
     two-sample test on visited states, and a one-step MLP ensemble's residual rank test.

A check "flags" a simulator when its verdict is `fail` or `unverifiable` (`inconclusive`, no pass
without power, is counted apart; a check that cannot run, e.g. episodes shorter than a block, is
recorded as `error`); baselines flag at p < alpha. Reported per family and row: detection rate,
AUROC of `summary.score` (and of the baselines' scores) against all faithful controls, attribution
(`summary.top_gap` is one of the row's true gaps), the sensor-noise row of noise-free simulators,
estimate errors, calibration's predicted power vs the measured rate; for the controls, the
false-alarm rate per condition with its Wilson 95% interval.

    .venv/bin/python scripts/bench_detection.py                    # cpu config (~45 min, 1 thread)
    .venv/bin/python scripts/bench_detection.py --config gpu         # GPU machine: trains on cuda, check workers
    .venv/bin/python scripts/bench_detection.py --quick            # a smoke test of the script (~2 min)

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
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.baselines import ARXBaseline, MLPBaseline, mmd_baseline
from wmcheck.checks.calibration import CALIBRATION_VERSION, calibrate
from wmcheck.checks.check import run_check
from wmcheck.checks.config import CheckConfig
from wmcheck.checks.reality import RealityProfile, reality_env_args
from wmcheck.checks.stats import rank_auc
from wmcheck.datasets.episode import LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.record import Recorder
from wmcheck.datasets.split import split_episodes
from wmcheck.scripts.bench_families import (
    DOUBLE_PENDULUM,
    HALFCHEETAH,
    HOPPER,
    PENDULUM,
    PUSHER,
    CheckJob,
    SystemSpec,
    jobs_for,
    make_policy,
    quick,
)
from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.checkpoint import load_model
from wmcheck.training.config import TrainConfig
from wmcheck.training.run import build_run_config, train

BENCH_VERSION = 2  # 2: families (deterministic, perturbation, control conditions, ending), ARX baseline
GAP_TYPES = ("latency", "actuator", "sensor_noise", "dynamics")  # the report's gap names
UNITS = {
    "latency": "extra steps",
    "actuator": "gain 1/size",
    "sensor_noise": "x channel std",
    "dynamics": "parameter x (1 + size)",
}


# Check geometry: the defaults, with coarser attribution grids (each still holds the identity and
# the sizes injected here) so a check costs ~20-40 s on one CPU thread.
CHECK_CONFIG = CheckConfig(
    gain_grid=(0.5, 0.63, 0.8, 0.9, 1.0, 1.12, 1.25, 1.6, 2.0),
    offset_grid=(-0.5, -0.1, 0.0, 0.1, 0.5),
    deadband_grid=(0.0, 0.25),
    bootstrap=200,
)

CONFIGS = {
    # 2-core CPU, 1 thread, ~45 min: Pendulum only (HalfCheetah's and Pusher's larger models and
    # longer episodes do not fit next to it; run `--systems halfcheetah` separately or the gpu config).
    "cpu": {"pendulum": PENDULUM},
    # GPU machine (training on the GPU, checks on CPU worker processes): every system, more seeds.
    # Not yet run on a GPU (no device in the session that wrote it): sized by the CPU timings
    # (~10 s per Pendulum check on one thread, 14 workers) to stay well inside 10 minutes.
    "gpu": {
        "pendulum": dataclasses.replace(
            PENDULUM,
            episodes=60,
            preset="size1m",
            steps=3000,
            controls=30,
            other_controls=6,
            reps=4,
            deterministic_reps=4,
            ending_reps=2,
        ),
        "halfcheetah": dataclasses.replace(
            HALFCHEETAH, steps=2500, controls=16, other_controls=4, reps=2, deterministic_reps=3
        ),
        "pusher": dataclasses.replace(PUSHER, steps=2500, controls=16, other_controls=4, reps=2, deterministic_reps=3),
        "double_pendulum": dataclasses.replace(
            DOUBLE_PENDULUM, controls=30, other_controls=6, reps=3, deterministic_reps=4
        ),
    },
}


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


_BASELINE_CACHE: dict = {}


def _block_length(run_dir: Path) -> int:
    """The transitions of the run's calibrated blocks (calibration fits them to short held-out
    episodes: CheckConfig.fitted_to), which the baselines test as the check does: a block of
    context + horizon observations spans one transition fewer."""
    cfg = json.loads((run_dir / "calibration.json").read_text())["config"]
    return int(cfg["context"]) + int(cfg["horizon"]) - 1


def _baselines(run_dir: Path, log_path: Path):
    """(norm, held-out real episodes, fitted MLP and ARX baselines, block length) for a run, built
    once per process."""
    key = str(run_dir)
    if key not in _BASELINE_CACHE:
        bundle = load_model(run_dir)
        norm = Normalizer.from_dict(bundle.normalizer)
        t = bundle.run_config["train"]
        with open_log(log_path) as log:
            train_ids, val_ids = split_episodes(log.episode_ids, t["val_fraction"], t["seed"])
            tr, held = list(log.episodes(train_ids)), list(log.episodes(val_ids))
        block = _block_length(run_dir)
        _BASELINE_CACHE[key] = (
            norm,
            held,
            MLPBaseline(tr, held, norm, block=block, seed=0),
            ARXBaseline(tr, held, norm, block=block),
            block,
        )
    return _BASELINE_CACHE[key]


def run_one(
    job: CheckJob, spec: SystemSpec, run_dir: Path, log_path: Path, work: Path, threads: int, declare: bool = False
) -> dict:
    """One check; `declare`: tell it which policy chose the checked commands (--checked-policy logs
    where the job runs the logs' policy, other elsewhere) instead of letting the policy-shift test say."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    path = work / "checked" / f"{job.name}.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    record(
        spec.env_id,
        RealityProfile.from_dict(job.profile),
        make_policy(job.policy),
        job.episodes or spec.check_episodes,
        job.max_steps or spec.max_steps,
        job.seed,
        path,
        "policy" if job.policy.startswith("controller:") else "sim",
    )
    norm, held, mlp, arx, block = _baselines(run_dir, log_path)
    with open_log(path) as log:
        checked = list(log)
    alpha = CHECK_CONFIG.alpha
    if any(e.num_steps >= block for e in checked):
        base = {
            "mmd": mmd_baseline(held, checked, norm, block=block, seed=job.seed),
            "mlp": mlp.test(checked),
            "arx": arx.test(checked),
        }
        baselines = {k: {"p": r.p_value, "score": r.score, "flagged": bool(r.p_value < alpha)} for k, r in base.items()}
    else:  # no episode holds a block: the baselines, like the check, have nothing to test
        baselines = {k: {"p": None, "score": None, "flagged": False} for k in BASELINES}
    checked_policy = ("logs" if job.policy == spec.policy else "other") if declare else "auto"
    out = {**dataclasses.asdict(job), "baselines": baselines, "checked_policy": checked_policy}
    try:
        report = run_check(run_dir, path, seed=job.seed, checked_policy=checked_policy)
    except UserError as exc:  # e.g. episodes shorter than a block: no verdict at all
        out.update(
            verdict="error",
            flagged=False,
            error=exc.problem,
            score=None,
            top_gap="none",
            present=[],
            seconds=round(time.perf_counter() - t0, 1),
        )
        path.unlink()
        return out
    s, gaps = report["summary"], report["gaps"]
    out.update(
        {
            "verdict": report["verdict"],
            # a flag is a finding (fail or unverifiable); inconclusive (no power) is neither a pass nor a finding
            "flagged": report["verdict"] in ("fail", "unverifiable"),
            "score": s["score"],
            "strength": s.get("evidence_strength"),
            "top_gap": s["top_gap"],
            "confounded": s["confounded"],
            "present": sorted(g for g, e in gaps.items() if e["verdict"] in ("present", "tolerated")),
            "failing": s.get("failing", []),
            "missing_power": s.get("missing_power", []),
            "episodes": {k: s[k] for k in ("episodes", "consistent", "divergent", "unverifiable")},
            "blocks": s["blocks"],
            "competent_blocks": s["competent_blocks"],
            # the policy-shift test (policy_match.py): should reject only under other policies than the logs'
            "policy_shift_p": ((gaps["distribution"].get("estimate") or {}).get("policy_shift") or {}).get("p_value"),
            "estimates": {
                g: gaps[g]["estimate"] for g in ("latency", "actuator", "sensor_noise") if gaps[g].get("estimate")
            },
            "seconds": round(time.perf_counter() - t0, 1),
        }
    )
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
    if gap == "latency" and est.get("steps") is None:  # the fit estimates only when its test fires
        return {"truth": -float(size), "estimate": None, "abs_error": None}
    if gap == "latency":  # the simulator responds `size` steps later: the correction shifts by -size
        return {"truth": -float(size), "estimate": est["steps"], "abs_error": abs(est["steps"] + float(size))}
    if (
        gap == "actuator" and est.get("kind") == "gain" and est.get("value") is not None
    ):  # commands must be scaled by 1/size to match reality
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


BASELINES = ("arx", "mmd", "mlp")


def _rate(rows, key=lambda r: r["flagged"]) -> dict:
    k = sum(bool(key(r)) for r in rows)
    return {"n": len(rows), "k": k, "rate": k / len(rows) if rows else None, "ci95": wilson(k, len(rows))}


def _auroc(rows, controls, score) -> float | None:
    x = [score(r) for r in rows if score(r) is not None]
    y = [score(r) for r in controls if score(r) is not None]
    return rank_auc(x, y) if x and y else None


def _row_stats(rows: list[dict], controls: list[dict], logs_controls: list[dict] | None = None) -> dict:
    """Detection, AUROC against the controls and attribution of rows sharing a truth, with baselines.
    `logs_controls`: the controls under the logs' own policy (the `_logs` AUROCs rank against them
    alone; under another policy every detector flags a faithful simulator, so against all controls
    an AUROC also measures whether a gap moves a score further than a change of policy does)."""
    logs_controls = controls if logs_controls is None else logs_controls
    return {
        "n": len(rows),
        "truth": list(rows[0]["truth"]) if rows else [],
        "verdicts": [r["verdict"] for r in rows],
        "detection": _rate(rows),
        "auroc": _auroc(rows, controls, lambda r: r["score"]),
        # the decision's own ranking (decision.strength: the largest test-to-threshold ratio)
        "auroc_strength": _auroc(rows, controls, lambda r: r.get("strength")),
        "auroc_logs": _auroc(rows, logs_controls, lambda r: r["score"]),
        "auroc_strength_logs": _auroc(rows, logs_controls, lambda r: r.get("strength")),
        "attribution": _rate(rows, lambda r: r["top_gap"] in r["truth"]),
        "sensor_noise_row": _rate(rows, lambda r: "sensor_noise" in r["present"]),
        "top_gaps": [r["top_gap"] for r in rows],
        "baselines": {
            b: {
                "detection": _rate(rows, lambda r, b=b: r["baselines"][b]["flagged"]),
                "auroc": _auroc(rows, controls, lambda r, b=b: r["baselines"][b]["score"]),
                "auroc_logs": _auroc(rows, logs_controls, lambda r, b=b: r["baselines"][b]["score"]),
            }
            for b in BASELINES
        },
    }


def summarise(spec: SystemSpec, results: list[dict], alpha: float) -> dict:
    controls = [r for r in results if r["family"] == "control"]
    logs_controls = [r for r in controls if r["policy"] == spec.policy]
    conditions = list(dict.fromkeys(r["condition"] for r in controls))
    summary = {
        "false_alarms": {
            "wmcheck": _rate(controls),
            "wmcheck_fail_only": _rate(controls, lambda r: r["verdict"] == "fail"),
            "wmcheck_inconclusive": _rate(controls, lambda r: r["verdict"] == "inconclusive"),
            **{b: _rate(controls, lambda r, b=b: r["baselines"][b]["flagged"]) for b in BASELINES},
            "by_condition": {
                c: {
                    "wmcheck": _rate([r for r in controls if r["condition"] == c]),
                    "verdicts": [r["verdict"] for r in controls if r["condition"] == c],
                    **{
                        b: _rate(
                            [r for r in controls if r["condition"] == c], lambda r, b=b: r["baselines"][b]["flagged"]
                        )
                        for b in BASELINES
                    },
                }
                for c in conditions
            },
        },
        "deterministic": [],
        "cells": [],
        "other_policy": [],
        "endings": [],
    }
    det = [r for r in results if r["family"] == "deterministic"]
    for cond in dict.fromkeys(r["condition"] for r in det):
        summary["deterministic"].append(
            {"row": cond, **_row_stats([r for r in det if r["condition"] == cond], controls, logs_controls)}
        )
    for gap, sizes in spec.gap_sizes().items():
        for size in sizes:
            rows = [
                r for r in results if r["family"] == "perturbation" and r["gap"] == gap and r["size"] == float(size)
            ]
            if not rows:
                continue
            errs = [estimate_error(gap, size, (r.get("estimates") or {}).get(gap)) for r in rows]
            abs_errs = [e["abs_error"] for e in errs if e and e.get("abs_error") is not None]
            pred = [r["power_predicted"] for r in rows if r.get("power_predicted") is not None]
            cell = {
                "gap": gap,
                "size": float(size),
                "units": UNITS[gap],
                **_row_stats(rows, controls, logs_controls),
                "estimate_mean_abs_error": _mean(abs_errs),
                "estimates": [e for e in errs if e],
                "power_predicted": _mean(pred),
                "power_gap": (abs(_mean(pred) - _rate(rows)["rate"]) if pred else None),
            }
            summary["cells"].append(cell)
    for r in (r for r in results if r["family"] == "other_policy"):
        summary["other_policy"].append(
            {
                "row": r["condition"],
                "replicate": r.get("replicate", 0),
                "verdict": r["verdict"],
                "flagged": r["flagged"],
                "failing": r.get("failing", []),
                "top_gap": r["top_gap"],
                **{b: r["baselines"][b]["flagged"] for b in BASELINES},
            }
        )
    ends = [r for r in results if r["family"] == "ending"]
    for cond in dict.fromkeys(r["condition"] for r in ends):
        rows = [r for r in ends if r["condition"] == cond]
        summary["endings"].append(
            {
                "row": cond,
                "verdicts": [r["verdict"] for r in rows],
                "errors": [r.get("error") for r in rows if r["verdict"] == "error"],
                "got_a_verdict": _rate(rows, lambda r: r["verdict"] != "error"),
                **_row_stats(rows, controls, logs_controls),
            }
        )
    summary["targets"] = targets(spec, summary, alpha)
    return summary


def _target(text: str, measured: str, met: bool) -> dict:
    return {"target": text, "measured": measured, "met": bool(met)}


def targets(spec: SystemSpec, summary: dict, alpha: float) -> list[dict]:
    """The issues' targets (13, 14), each with the measured figure and met / missed."""
    out = []
    fa = summary["false_alarms"]
    w = fa["wmcheck"]
    if w["n"]:  # "<= alpha plus sampling error": alpha inside (or above) the Wilson interval of the rate
        out.append(
            _target(
                f"false-alarm rate over all faithful controls <= {alpha} (+ sampling error)",
                f"{w['k']}/{w['n']} = {w['rate']:.2f}, 95% CI [{w['ci95'][0]:.2f}, {w['ci95'][1]:.2f}]",
                w["ci95"][0] <= alpha,
            )
        )
        out.append(
            _target(
                "no faithful control is `fail`",
                f"{fa['wmcheck_fail_only']['k']}/{w['n']} fail",
                fa["wmcheck_fail_only"]["k"] == 0,
            )
        )
        for c, v in fa["by_condition"].items():
            r = v["wmcheck"]
            out.append(
                _target(
                    f"faithful controls ({c}): false alarms <= {alpha} (+ sampling error)",
                    f"{r['k']}/{r['n']}",
                    r["ci95"][0] <= alpha,
                )
            )
    det = summary["deterministic"]
    if det:
        biased = [d for d in det if d["row"].startswith("physics")]
        if biased:
            mid = biased[len(biased) // 2]
            out.append(
                _target(
                    f"deterministic biased simulator ({mid['row']}, the middle size) detected >= 95%",
                    f"{mid['detection']['k']}/{mid['n']}",
                    (mid["detection"]["rate"] or 0) >= 0.95,
                )
            )
            out.append(
                _target(
                    f"deterministic biased simulator ({mid['row']}) attributed to one of its gaps >= 90%",
                    f"{mid['attribution']['k']}/{mid['n']}",
                    (mid["attribution"]["rate"] or 0) >= 0.9,
                )
            )
        twin = next((d for d in det if d["row"] == "twin"), None)
        if twin:
            out.append(
                _target(
                    "a noise-free twin of reality gets a sensor-noise (too smooth) row",
                    f"{twin['sensor_noise_row']['k']}/{twin['n']}",
                    (twin["sensor_noise_row"]["rate"] or 0) >= 0.9,
                )
            )
    for e in summary["endings"]:
        out.append(
            _target(
                f"early-ending simulator ({e['row']}) gets a verdict, not exit 2",
                f"{e['got_a_verdict']['k']}/{e['n']}",
                e["got_a_verdict"]["rate"] == 1.0,
            )
        )
    rows = [(f"{c['gap']}={c['size']:g}", c) for c in summary["cells"]] + [
        (f"deterministic {d['row']}", d) for d in det
    ]

    def arx(c: dict, key: str) -> float | None:
        return c["baselines"]["arx"].get("auroc_logs" if key.endswith("_logs") else "auroc")

    for key, what in (
        ("auroc", "wmcheck AUROC"),
        ("auroc_strength", "wmcheck AUROC of the decision's evidence strength"),
        ("auroc_logs", "wmcheck AUROC against the controls under the logs' policy"),
        ("auroc_strength_logs", "wmcheck AUROC of the evidence strength against the controls under the logs' policy"),
    ):
        lost = [n for n, c in rows if c.get(key) is not None and arx(c, key) is not None and c[key] < arx(c, key)]
        out.append(
            _target(
                f"{what} >= the linear ARX baseline's on every row",
                f"below ARX on {len(lost)}/{len(rows)} rows" + (f": {', '.join(lost)}" if lost else ""),
                not lost,
            )
        )
    for gap in GAP_TYPES:
        cells = [c for c in summary["cells"] if c["gap"] == gap]
        if cells:
            big = max(cells, key=lambda c: c["size"])
            out.append(
                _target(
                    f"perturbation {gap} at the largest size ({big['size']:g}) detected >= 95%",
                    f"{big['detection']['k']}/{big['n']}",
                    (big["detection"]["rate"] or 0) >= 0.95,
                )
            )
    gaps_pw = [c for c in summary["cells"] if c["power_predicted"] is not None]
    if gaps_pw:
        worst = max(gaps_pw, key=lambda c: c["power_gap"])
        out.append(
            _target(
                "predicted power within 0.1 of the measured detection rate",
                f"{sum(c['power_gap'] <= 0.1 for c in gaps_pw)}/{len(gaps_pw)} cells within 0.1; worst "
                f"{worst['gap']}={worst['size']:g}: predicted {worst['power_predicted']:.2f}, measured "
                f"{worst['detection']['rate']:.2f}",
                all(c["power_gap"] <= 0.1 for c in gaps_pw),
            )
        )
    return out


# ---- Markdown --------------------------------------------------------------------------------------


def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _r(r: dict) -> str:
    return "–" if not r["n"] else f"{r['rate']:.2f} ({r['k']}/{r['n']})"


def _auc2(c: dict) -> str:
    """AUROC of the block score / of the decision's evidence strength against all controls, and in
    brackets against the controls under the logs' policy."""
    return f"{_f(c['auroc'])} / {_f(c['auroc_strength'])} ({_f(c['auroc_logs'])} / {_f(c['auroc_strength_logs'])})"


def _base_cols(c: dict) -> str:
    return " | ".join(
        f"{_f(b['detection']['rate'])} / {_f(b['auroc'])} ({_f(b['auroc_logs'])})"
        for b in (c["baselines"][name] for name in BASELINES)
    )


def _training(s: dict) -> str:
    t = s.get("training") or {}
    c = t.get("config") or {"preset": s["spec"]["preset"], "lr": s["spec"]["lr"]}
    steps = t.get("steps", s["spec"]["steps"])
    how = f", {t['stop_reason']}, weights of step {t['exported_step']}" if t.get("stop_reason") else ""
    return f"{c['preset']}, lr {c['lr']:g}, {steps} steps{how}"


def system_markdown(s: dict) -> str:
    spec, summ = s["spec"], s["summary"]
    fa = summ["false_alarms"]
    head = "| detected | AUROC score / strength | attributed | sensor-noise row | " + " | ".join(
        f"{b.upper()} det. / AUROC" for b in BASELINES
    )
    lines = [
        f"### {spec['name']}: {spec['env_id']}",
        "",
        f"Reality: {s['reality']}. Real logs: {spec['episodes']} episodes x {spec['max_steps']} steps under "
        f"{spec['policy']}; world model {_training(s)} (train {s['seconds']['train']:.0f} s, "
        f"calibration {s['seconds']['calibrate']:.0f} s on {s['calibration_blocks']} held-out blocks); "
        f"{spec['check_episodes']} episodes per checked simulator unless stated; {len(s['checks'])} checks "
        f"({s['seconds']['checks']:.0f} s).",
        "",
        "**Faithful controls** (the reality's full profile, fresh seeds): false alarms "
        f"{_r(fa['wmcheck'])}, Wilson 95% CI [{_f(fa['wmcheck']['ci95'][0])}, {_f(fa['wmcheck']['ci95'][1])}] "
        f"(`fail` {fa['wmcheck_fail_only']['k']}, `inconclusive` {fa['wmcheck_inconclusive']['k']}); "
        + ", ".join(f"{b.upper()} {_r(fa[b])}" for b in BASELINES)
        + ".",
        "",
        "| condition | wmcheck flags | verdicts | " + " | ".join(f"{b.upper()} flags" for b in BASELINES) + " |",
        "|---|---|---|" + "---|" * len(BASELINES),
    ]
    for c, v in fa["by_condition"].items():
        lines.append(
            f"| {c} | {_r(v['wmcheck'])} | {', '.join(v['verdicts'])} | "
            + " | ".join(_r(v[b]) for b in BASELINES)
            + " |"
        )
    lines += [
        "",
        "**Deterministic simulators** (noise-free, against the noisy reality):",
        "",
        f"| simulator | truth | n {head} | verdicts |",
        "|---|---|---" + "|---" * (4 + len(BASELINES)) + "|---|",
    ]
    for d in summ["deterministic"]:
        lines.append(
            f"| {d['row']} | {', '.join(d['truth'])} | {d['n']} | {_f(d['detection']['rate'])} | {_auc2(d)} | "
            f"{_f(d['attribution']['rate'])} | {_f(d['sensor_noise_row']['rate'])} | {_base_cols(d)} | "
            f"{', '.join(d['verdicts'])} |"
        )
    lines += [
        "",
        "**Perturbations of reality** (one gap made larger; reality's noise kept):",
        "",
        f"| gap | size | n {head} | est. abs. error | predicted power |",
        "|---|---|---" + "|---" * (4 + len(BASELINES)) + "|---|---|",
    ]
    for c in summ["cells"]:
        lines.append(
            f"| {c['gap']} | {c['size']:g} ({c['units']}) | {c['n']} | {_f(c['detection']['rate'])} | {_auc2(c)} | "
            f"{_f(c['attribution']['rate'])} | {_f(c['sensor_noise_row']['rate'])} | {_base_cols(c)} | "
            f"{_f(c['estimate_mean_abs_error'])} | {_f(c['power_predicted'])} |"
        )
    if summ.get("other_policy"):
        lines += [
            "",
            "**Gaps checked under another policy only** (the largest sizes; `unverifiable` is a flag, not a "
            "named gap):",
            "",
            "| gap, policy | verdict | top gap | failing | "
            + " | ".join(f"{b.upper()} flags" for b in BASELINES)
            + " |",
            "|---|---|---|---|" + "---|" * len(BASELINES),
        ]
        replicated = any(o.get("replicate", 0) for o in summ["other_policy"])
        for o in summ["other_policy"]:
            label = f"{o['row']} (replicate {o['replicate']})" if replicated else o["row"]
            lines.append(
                f"| {label} | {o['verdict']} | {o['top_gap']} | {', '.join(o['failing']) or '-'} | "
                + " | ".join("yes" if o[b] else "no" for b in BASELINES)
                + " |"
            )
    if summ["endings"]:
        lines += [
            "",
            "**Different endings**: "
            + "; ".join(
                f"{e['row']}: {', '.join(e['verdicts'])}" + (f" ({e['errors'][0]})" if e["errors"] else "")
                for e in summ["endings"]
            )
            + ".",
        ]
    lines += ["", "Targets:", ""] + [
        f"- {'met' if t['met'] else 'MISSED'}: {t['target']} — {t['measured']}" for t in summ["targets"]
    ]
    return "\n".join(lines) + "\n"


# ---- driver ----------------------------------------------------------------------------------------


def _episodes(path: Path) -> int:
    with open_log(path) as log:
        return len(log.episode_ids)


REPLICATE_SEED = 1_000_000
"""Seed offset between replicates: replicate r records its real logs and checked rollouts with seeds
shifted by r * REPLICATE_SEED, and seeds its reality profile and its training with r (replicate 0 is
the benchmark as it always ran)."""


def _replicate_job(job: CheckJob, r: int) -> CheckJob:
    if r == 0:
        return job
    profile = {**job.profile, "seed": int(job.profile["seed"]) + r * REPLICATE_SEED}
    return dataclasses.replace(job, profile=profile, seed=job.seed + r * REPLICATE_SEED)


def fixed_train_config(spec: SystemSpec, seed: int, **device) -> TrainConfig:
    """The spec's fixed training budget (preset, steps, batch, sequence, learning rate, warm-up)."""
    return TrainConfig(
        preset=spec.preset,
        max_steps=spec.steps,
        batch_size=spec.batch_size,
        seq_len=spec.seq_len,
        lr=spec.lr,
        warmup=spec.warmup,
        val_fraction=spec.val_fraction,
        seed=seed,
        val_every=spec.steps,
        ckpt_every=spec.steps,
        **device,
    )


def run_system(spec: SystemSpec, work: Path, args, replicate: int = 0) -> dict:
    """One system, one replicate: record the real logs, train, calibrate, run every check."""
    work.mkdir(parents=True, exist_ok=True)
    log_path, run_dir = work / "real.h5", work / "run"
    shift = replicate * REPLICATE_SEED
    reality = RealityProfile(**spec.reality, seed=replicate)
    t0 = time.perf_counter()
    have_run = args.reuse and (run_dir / "model.pt").exists() and log_path.exists()
    cal_json = run_dir / "calibration.json"
    extra_path = work / "extra_real.h5"
    extra = args.extra_real if not args.quick else 0

    def calibrated_as_asked() -> bool:  # a reused model is calibrated again for another version or extra set
        meta = json.loads(cal_json.read_text())
        extras = sum(x["episodes"] for x in meta["info"].get("extra_real", []))
        return meta.get("calibration_version") == CALIBRATION_VERSION and extras == extra

    have_cal = have_run and cal_json.exists() and calibrated_as_asked()
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
        record(spec.env_id, reality, make_policy(spec.policy), spec.episodes, spec.max_steps, shift, log_path, "real")
    t_data = time.perf_counter() - t0
    device = dict(progress_bar=False, accelerator="cpu" if args.device == "cpu" else "auto")
    if getattr(args, "train", "fixed") == "defaults" and not args.quick:
        # `wmcheck train` without a flag: early stopping, best checkpoint (the split is the spec's)
        cfg = TrainConfig(val_fraction=spec.val_fraction, seed=replicate, **device)
    else:
        cfg = fixed_train_config(spec, replicate, **device)
    t1 = time.perf_counter()
    if not have_run:
        print(
            f"[{spec.name}] training {cfg.preset} for up to {cfg.max_steps} steps (B={cfg.batch_size}, "
            f"T={cfg.seq_len}, lr {cfg.lr:g}, patience {cfg.patience})",
            flush=True,
        )
        train(log_path, run_dir, build_run_config(cfg))
    t_train = time.perf_counter() - t1
    t2 = time.perf_counter()
    if not have_cal:
        if extra and not (extra_path.exists() and _episodes(extra_path) == extra):
            print(f"[{spec.name}] recording {extra} extra real episodes for calibration", flush=True)
            record(
                spec.env_id,
                reality,
                make_policy(spec.policy),
                extra,
                spec.max_steps,
                500_000 + shift,
                extra_path,
                "real",
            )
        print(f"[{spec.name}] calibrating" + (f" (+{extra} extra real episodes)" if extra else ""), flush=True)
        calibrate(run_dir, log_path, CHECK_CONFIG, verbose=False, extra_real=[extra_path] if extra else None)
    t_cal = time.perf_counter() - t2
    cal_json = json.loads((run_dir / "calibration.json").read_text())
    cal_info = cal_json["info"]
    obs_std = Normalizer.from_dict(load_model(run_dir).normalizer).std["obs"].astype(float)

    jobs = [_replicate_job(j, replicate) for j in jobs_for(spec, reality, obs_std)]
    print(f"[{spec.name}] {len(jobs)} checks ({args.workers} worker(s))", flush=True)
    t3 = time.perf_counter()
    results = []

    def done(r):
        results.append(r)
        score = "-" if r["score"] is None else f"{r['score']:.2f}"
        print(
            f"[{spec.name}] {len(results)}/{len(jobs)} {r['family']} ({r['condition']}): {r['verdict']} score {score} "
            f"top {r['top_gap']} | "
            + " ".join(f"{b.upper()} p {_f(r['baselines'][b]['p'], '{:.3g}')}" for b in BASELINES)
            + f" ({r['seconds']:.0f} s, {time.perf_counter() - t3:.0f} s in)",
            flush=True,
        )

    if args.workers > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            futs = [pool.submit(run_one, j, spec, run_dir, log_path, work, 1, args.declare_policy) for j in jobs]
            for f in futs:
                done(f.result())
    else:
        for j in jobs:
            done(run_one(j, spec, run_dir, log_path, work, args.threads, args.declare_policy))
    t_checks = time.perf_counter() - t3
    order = {j.name: i for i, j in enumerate(jobs)}
    results.sort(key=lambda r: order[r["name"]])
    alpha = CHECK_CONFIG.alpha
    for r in results:
        r["replicate"] = replicate
    return {
        "system": spec.name,
        "replicate": replicate,
        "spec": dataclasses.asdict(spec),
        "reality": reality.describe(),
        "reality_profile": reality.to_dict(),
        "check_config": CHECK_CONFIG.to_dict(),
        "calibrated_geometry": {k: cal_json["config"][k] for k in ("context", "horizon")},
        "calibration_blocks": cal_info["blocks"],
        "calibration_warning": cal_info.get("warning"),
        "training": {
            "config": dataclasses.asdict(cfg),
            **(json.loads((run_dir / "training.json").read_text()) if (run_dir / "training.json").exists() else {}),
        },
        "reused_run": bool(have_run),
        "extra_real_episodes": extra,  # recorded from the reality and added to the calibration (--extra-real)
        "checks": results,
        "summary": summarise(spec, results, alpha),
        "seconds": {"data": t_data, "train": t_train, "calibrate": t_cal, "checks": t_checks},
    }


def pool_replicates(spec: SystemSpec, reps: list[dict]) -> dict:
    """Replicates of one system as one result: every check pooled into the summary (each check keeps
    its replicate), and per replicate its training and its false alarms. The false-alarm rate of
    one replicate rests on one calibration, so its checks are not independent trials; across
    replicates the real logs, the model and its calibration are drawn again."""
    if len(reps) == 1:
        return reps[0]
    checks = [c for r in reps for c in r["checks"]]
    out = dict(reps[0], checks=checks, summary=summarise(spec, checks, CHECK_CONFIG.alpha))
    out["replicates"] = [
        {
            "replicate": r["replicate"],
            "training": r["training"],
            "calibration_blocks": r["calibration_blocks"],
            "false_alarms": {
                k: r["summary"]["false_alarms"][k] for k in ("wmcheck", "wmcheck_fail_only", "wmcheck_inconclusive")
            },
            "by_condition": {c: v["wmcheck"] for c, v in r["summary"]["false_alarms"]["by_condition"].items()},
            "targets_missed": [t["target"] for t in r["summary"]["targets"] if not t["met"]],
        }
        for r in reps
    ]
    out["seconds"] = {k: sum(r["seconds"][k] for r in reps) for k in reps[0]["seconds"]}
    return out


def replicates_markdown(s: dict) -> str:
    if "replicates" not in s:
        return ""
    lines = [
        f"**Replicates** ({len(s['replicates'])}: real logs, world model, calibration and checked rollouts drawn "
        "again; the tables above pool them):",
        "",
        "| replicate | faithful flagged | fail | inconclusive | "
        + " | ".join(s["replicates"][0]["by_condition"])
        + " | targets missed |",
        "|---|---|---|---|" + "---|" * len(s["replicates"][0]["by_condition"]) + "---|",
    ]
    for r in s["replicates"]:
        fa = r["false_alarms"]
        lines.append(
            f"| {r['replicate']} | {_r(fa['wmcheck'])} | {fa['wmcheck_fail_only']['k']} | "
            f"{fa['wmcheck_inconclusive']['k']} | "
            + " | ".join(_r(v) for v in r["by_condition"].values())
            + f" | {len(r['targets_missed'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="cpu",
        help="cpu: Pendulum, < 30 min on 1 thread; gpu: every system, more seeds",
    )
    p.add_argument(
        "--systems",
        default=None,
        help="comma-separated subset of the config's systems (or halfcheetah, pusher, double_pendulum in the cpu config)",
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
    p.add_argument(
        "--train",
        choices=("fixed", "defaults"),
        default="fixed",
        help="fixed: the config's training budget (default); defaults: `wmcheck train`'s defaults "
        "(early stopping, best checkpoint)",
    )
    p.add_argument(
        "--attribution",
        choices=("fit", "grid"),
        default="fit",
        help="latency / actuator attribution the runs are calibrated for: the corrections' fit (default) or the "
        "former grid searches (CheckConfig.attribution)",
    )
    p.add_argument("--quick", action="store_true", help="tiny logs and model, one size per gap: a smoke test")
    p.add_argument("--reuse", action="store_true", help="keep OUT/work logs and calibrated runs (not retrained)")
    p.add_argument(
        "--extra-real",
        type=int,
        default=0,
        help="record this many more real episodes (same reality, other seeds) and calibrate on them too "
        "(`wmcheck calibrate --real`): how the false alarms depend on the size of the real null (default 0)",
    )
    p.add_argument(
        "--replicates",
        type=int,
        default=1,
        help="draw the real logs, the model and the checked rollouts this many times (seeds shifted by "
        f"{REPLICATE_SEED:,} each) and pool the checks: false-alarm rates over calibrations, not one (default 1)",
    )
    p.add_argument(
        "--check-episodes",
        type=int,
        default=None,
        help="episodes per checked simulator instead of each system's own (jobs that set their own count keep it)",
    )
    p.add_argument(
        "--declare-policy",
        action="store_true",
        help="tell every check which policy chose its commands (`--checked-policy logs` for the logs' policy, "
        "other elsewhere) instead of letting the policy-shift test decide",
    )
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    if args.replicates < 1:
        p.error("--replicates must be >= 1")
    if args.device is None:
        args.device = "cuda" if args.config == "gpu" else "cpu"
    if args.workers is None:
        args.workers = max(1, (os.cpu_count() or 1) - 2) if args.config == "gpu" else 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    global CHECK_CONFIG
    CHECK_CONFIG = dataclasses.replace(CHECK_CONFIG, attribution=args.attribution)  # what calibrate stores
    specs = dict(CONFIGS[args.config])
    if args.systems:
        names = [s.strip() for s in args.systems.split(",") if s.strip()]
        known = {
            **CONFIGS["cpu"],
            "halfcheetah": HALFCHEETAH,
            "pusher": PUSHER,
            "double_pendulum": DOUBLE_PENDULUM,
            "hopper": HOPPER,
            **CONFIGS[args.config],
        }
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
    if args.check_episodes is not None and args.check_episodes < 1:
        p.error("--check-episodes must be >= 1")
    for name, spec in specs.items():
        if args.quick:
            spec = quick(spec)
        if args.check_episodes is not None:
            spec = dataclasses.replace(spec, check_episodes=args.check_episodes)
        reps = [
            run_system(spec, out / "work" / name / (f"rep{k}" if k else ""), args, k) for k in range(args.replicates)
        ]
        r = pool_replicates(spec, reps)
        systems.append(r)
        print(system_markdown(r) + replicates_markdown(r), flush=True)
    finish(info, started)
    md = "\n".join(
        [
            f"# Detection benchmark ({info['date']}, config {args.config}{', quick' if args.quick else ''})",
            "",
            "A check flags a simulator when its verdict is `fail` or `unverifiable` (`inconclusive` is counted apart, "
            f"`error` = no verdict); baselines flag at p < alpha = {CHECK_CONFIG.alpha}. "
            "AUROC: `summary.score` / `summary.evidence_strength` (baselines: their scores) of each row against all "
            "faithful controls, in brackets against those under the logs' own policy. "
            "Attributed: `summary.top_gap` is one of the row's true gaps. Predicted power: calibration's power table in each report "
            f"(mean over the cell's checks). {info['cpu_count']} CPUs, {info['torch_threads']} torch thread(s), "
            f"{args.workers} check worker(s), training on {args.device}; total {info['total_seconds']:.0f} s.",
            "",
        ]
        + [system_markdown(s) + replicates_markdown(s) for s in systems]
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
