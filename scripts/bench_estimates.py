"""Latency and actuator estimates against the truth: the corrections' fit against the grid searches.

The attribution issue's first target is that the fit's estimate errors at least halve against the
grid's. The detection benchmark injects whole-step delays and gains near the grid's points
(1/1.25 = 0.8, 1/2 = 0.5), where a grid is exact by construction. Real transport delays are not
whole numbers of control periods and real gains are not grid points, so this benchmark injects
both kinds of truth:
  on the grid    latency +1 and +2 steps; gain 0.5 and 0.63 (grid points);
  off the grid   latency +1.25, +1.5 and +2.5 steps (a fractional delay: the reality wrappers hold
                 the time-weighted mean of two neighbouring commands, reality_wrappers.ActionLatency);
                 gain 1/1.4 = 0.714 and 1/1.75 = 0.571 (between grid points);
each as one gap on top of the detection benchmark's reality (bench_families.variant: the same
real logs, model and check geometry as `bench_detection.py`). One model is trained and a copy of
its run is calibrated per attribution ("fit", "grid"); every checked simulator is checked by both.
Per truth it prints how often the row is found, the estimates and their mean absolute error, on
and off the grid, and both attributions' check times (median, in the same run).

    .venv/bin/python scripts/bench_estimates.py --threads 1 --out /tmp/best   # Pendulum, ~10 min
    .venv/bin/python scripts/bench_estimates.py --systems halfcheetah --threads 1    # ~25 min of checks, plus training
    .venv/bin/python scripts/bench_estimates.py --quick                       # a smoke test

Writes OUT/bench_estimates.json and OUT/bench_estimates.md; `--reuse` keeps the trained and
calibrated runs in OUT/work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.calibration import CALIBRATION_VERSION, calibrate
from wmcheck.checks.check import run_check
from wmcheck.checks.reality import RealityProfile
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.scripts.bench_detection import CHECK_CONFIG, estimate_error, fixed_train_config, record
from wmcheck.scripts.bench_families import HALFCHEETAH, PENDULUM, quick, variant
from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.checkpoint import load_model
from wmcheck.training.run import build_run_config, train

SYSTEMS = {"pendulum": PENDULUM, "halfcheetah": HALFCHEETAH}
MODES = ("fit", "grid")
TRUTHS = (  # (gap, size, on the grid?): latency + size steps, actuator gain 1 / size
    ("latency", 1.0, True),
    ("latency", 2.0, True),
    ("latency", 1.25, False),
    ("latency", 1.5, False),
    ("latency", 2.5, False),
    ("actuator", 2.0, True),
    ("actuator", 1 / 0.63, True),
    ("actuator", 1.4, False),
    ("actuator", 1.75, False),
)


@dataclasses.dataclass
class Attempt:
    """One attribution's check of one checked simulator."""

    verdict: str  # the run's verdict
    row: str  # the gap row's verdict
    found: bool  # the row is present or tolerated
    estimate: float | None  # only where the row is found (the grid reports its best point either way)
    truth: float  # latency: -size steps (the fit's sign); actuator: gain 1 / size
    abs_error: float | None
    seconds: float  # the whole check


@dataclasses.dataclass
class TruthCheck:
    """One checked simulator (one truth, one seed), checked by both attributions."""

    gap: str
    size: float
    on_grid: bool
    seed: int
    steps: int
    fit: Attempt
    grid: Attempt

    def by(self, mode: str) -> Attempt:
        return getattr(self, mode)


def prepare(spec, work: Path, reuse: bool) -> dict[str, Path]:
    """Record the real logs, train once, calibrate a copy of the run per attribution."""
    work.mkdir(parents=True, exist_ok=True)
    log, base = work / "real.h5", work / "run"
    reality = RealityProfile(**spec.reality, seed=0)
    if not reuse:  # checked logs are named by truth and seed only: a new run records them afresh
        shutil.rmtree(work / "checked", ignore_errors=True)
    if not (reuse and (base / "model.pt").exists() and log.exists()):
        shutil.rmtree(base, ignore_errors=True)
        print(f"[{spec.name}] recording {spec.episodes} real episodes with {reality.describe()}", flush=True)
        record(spec.env_id, reality, spec.policy, spec.episodes, spec.max_steps, 0, log, "real")
        print(f"[{spec.name}] training {spec.preset} for {spec.steps} steps", flush=True)
        train(log, base, build_run_config(fixed_train_config(spec, 0, progress_bar=False, accelerator="cpu")))
    runs = {}
    for mode in MODES:
        runs[mode] = work / f"run-{mode}"
        if reuse and current_calibration(runs[mode]):
            continue
        shutil.rmtree(runs[mode], ignore_errors=True)
        shutil.copytree(base, runs[mode], ignore=shutil.ignore_patterns("calibration*", "power_cache*"))
        print(f"[{spec.name}] calibrating ({mode})", flush=True)
        calibrate(runs[mode], log, dataclasses.replace(CHECK_CONFIG, attribution=mode), verbose=False)
    return runs


def current_calibration(run: Path) -> bool:
    """The run has a calibration of this code's format (an older one is redone, not reused)."""
    path = run / "calibration.json"
    return path.exists() and json.loads(path.read_text()).get("calibration_version") == CALIBRATION_VERSION


def obs_std(run: Path) -> np.ndarray:
    return np.asarray(Normalizer.from_dict(load_model(run).normalizer).std["obs"], float)


def check_truth(spec, runs: dict[str, Path], work: Path, gap: str, size: float, on_grid: bool, seed: int) -> TruthCheck:
    reality = RealityProfile(**spec.reality, seed=0)
    sim = dataclasses.replace(variant(reality, gap, size, obs_std(runs["fit"]), spec.dynamics_param), seed=seed)
    path = work / "checked" / f"{gap}-{size:.4g}-s{seed}.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        record(spec.env_id, sim, spec.policy, spec.check_episodes, spec.max_steps, 10_000 + seed, path, "sim")
    with open_log(path) as f:
        steps = int(sum(len(e.actions) for e in f.episodes()))
    attempts = {}
    for mode, run in runs.items():
        t0 = time.perf_counter()
        rep = run_check(run, path, seed=seed)
        g = rep["gaps"][gap]
        found = g["verdict"] in ("present", "tolerated")
        err = estimate_error(gap, size, g.get("estimate")) or {}
        attempts[mode] = Attempt(
            verdict=rep["verdict"],
            row=g["verdict"],
            found=found,
            estimate=err.get("estimate") if found else None,
            truth=-float(size) if gap == "latency" else 1.0 / size,
            abs_error=err.get("abs_error") if found else None,
            seconds=round(time.perf_counter() - t0, 2),
        )
    return TruthCheck(gap, size, on_grid, seed, steps, attempts["fit"], attempts["grid"])


def summarise(rows: list[TruthCheck]) -> dict:
    """Per truth and over the on- / off-grid sets: found counts and mean absolute errors per mode.
    The errors are over the checks where both attributions estimate (a paired comparison), and
    separately over every check where each one does."""
    out: dict = {"truths": [], "sets": {}}
    keys = sorted({(r.gap, r.size, r.on_grid) for r in rows}, key=lambda k: (k[0], not k[2], k[1]))
    for gap, size, on in keys:
        rs = [r for r in rows if (r.gap, r.size) == (gap, size)]
        out["truths"].append({"gap": gap, "size": size, "on_grid": on, "n": len(rs), **_errors(rs)})
    for gap in ("latency", "actuator"):
        for on in (True, False):
            rs = [r for r in rows if r.gap == gap and r.on_grid == on]
            if rs:
                out["sets"][f"{gap} {'on' if on else 'off'} the grid"] = {"n": len(rs), **_errors(rs)}
    secs = {m: float(np.median([r.by(m).seconds for r in rows])) for m in MODES if rows}
    out["median_check_seconds"] = secs
    return out


def _errors(rs: list[TruthCheck]) -> dict:
    both = [r for r in rs if all(r.by(m).abs_error is not None for m in MODES)]
    res = {}
    for m in MODES:
        own = [r.by(m).abs_error for r in rs if r.by(m).abs_error is not None]
        res[m] = {
            "found": sum(r.by(m).found for r in rs),
            "estimated": len(own),
            "mae": float(np.mean(own)) if own else None,
            "mae_paired": float(np.mean([r.by(m).abs_error for r in both])) if both else None,
            "estimates": [r.by(m).estimate for r in rs],
            "truth": rs[0].by(m).truth,
        }
    res["paired"] = len(both)
    f, g = res["fit"]["mae_paired"], res["grid"]["mae_paired"]
    res["grid_over_fit"] = None if not both or not f else g / f
    return res


def _f(x, p=3):
    return "–" if x is None else f"{x:.{p}g}"


def table(system: str, s: dict) -> str:
    lines = [
        f"## {system}",
        "",
        "| truth | grid? | n | fit: found / estimated, estimates | fit MAE | grid: found / estimated, estimates "
        "| grid MAE | paired MAE fit / grid |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in s["truths"]:
        unit = "steps" if t["gap"] == "latency" else "gain"
        truth = t["fit"]["truth"]
        cells = []
        for m in MODES:
            e = t[m]
            ests = ", ".join(_f(x) for x in e["estimates"])
            cells += [f"{e['found']}/{e['estimated']}: {ests}", _f(e["mae"])]
        lines.append(
            f"| {t['gap']} {unit} {_f(truth)} | {'on' if t['on_grid'] else 'off'} | {t['n']} | "
            + " | ".join(cells)
            + f" | {_f(t['fit']['mae_paired'])} / {_f(t['grid']['mae_paired'])} |"
        )
    lines += [
        "",
        "| set | n | fit MAE (paired) | grid MAE (paired) | grid / fit | paired checks |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in s["sets"].items():
        lines.append(
            f"| {name} | {e['n']} | {_f(e['fit']['mae'])} ({_f(e['fit']['mae_paired'])}) | "
            f"{_f(e['grid']['mae'])} ({_f(e['grid']['mae_paired'])}) | {_f(e['grid_over_fit'])} | {e['paired']} |"
        )
    secs = s["median_check_seconds"]
    lines += [
        "",
        f"Median check time: fit {secs['fit']:.1f} s, grid {secs['grid']:.1f} s "
        f"(grid / fit {secs['grid'] / max(secs['fit'], 1e-9):.2f}x).",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="pendulum", help=f"comma-separated: {', '.join(SYSTEMS)}")
    p.add_argument("--seeds", type=int, default=2, help="checked simulators per truth (default 2)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny logs and model, two truths, one seed")
    p.add_argument("--reuse", action="store_true", help="keep OUT/work's trained and calibrated runs")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad:
        p.error(f"unknown system(s) {', '.join(bad)}; known: {', '.join(SYSTEMS)}")
    truths = [TRUTHS[3], TRUTHS[7]] if args.quick else list(TRUTHS)
    seeds = 1 if args.quick else args.seeds
    out = Path(args.out)
    info = machine_info(command=" ".join(sys.argv))
    results, md = {}, [f"# Estimates: fit against grid ({info['date']})", ""]
    for name in names:
        spec = quick(SYSTEMS[name]) if args.quick else SYSTEMS[name]
        work = out / "work" / name
        runs = prepare(spec, work, args.reuse)
        rows = []
        for gap, size, on in truths:
            for seed in range(seeds):
                r = check_truth(spec, runs, work, gap, size, on, seed)
                rows.append(r)
                print(
                    f"[{name}] {gap} {size:.4g} seed {seed}: "
                    + "; ".join(
                        f"{m} {r.by(m).row} est {_f(r.by(m).estimate)} ({r.by(m).seconds:.0f} s)" for m in MODES
                    ),
                    flush=True,
                )
        summary = summarise(rows)
        results[name] = {"rows": [dataclasses.asdict(r) for r in rows], "summary": summary}
        md.append(table(name, summary))
    text = "\n".join(md)
    print(text)
    payload = {"benchmark": "estimates", "machine": finish(info, started), "quick": args.quick, "systems": results}
    write_results(out, "bench_estimates", payload, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
