"""Check speed: checked env-steps per second and where a check's time goes.

For each system (Pendulum-v1 with the `debug` preset; HalfCheetah-v5 with `size1m` when asked) a
world model is trained briefly on real logs of its reality and calibrated with the default check
configuration. The model's quality does not matter for speed (the same blocks are scored and
searched whatever the weights), so training is short and says so. Then faithful simulator logs of
8, 64, ... episodes of 200 steps are checked; each check is timed whole and split into its stages
by wrapping the functions `run_check` calls:
  scoring      score_blocks of the checked blocks (the posterior, one-step and open-loop passes)
  attribution  the gap tests (delay and actuator searches through the model, re-scoring, residual,
               smoothness and bias statistics)
  power        the power table (cached per calibration and check size: the first check of a size
               computes it, later ones read it)
  statistics   competence, divergence tests, the distribution test, regimes, ending
  report       the figures' data (latent embedding, worst-block video) and report.json + report.html
               with its figures (and TensorBoard unless --no-tensorboard)
  other        the rest (loading the run, policy-free bookkeeping)
Start-up is measured apart: `wmcheck --help` and `wmcheck validate` in a fresh interpreter.

`--attribution fit grid` calibrates the same trained model once per latency / actuator attribution
(the corrections' fit, sysid.py, and the former grid searches) and runs every check under both, in
the same run; `--gapped` also checks a simulator with an actuator gap (every command x 0.5 of
reality's), where the fit runs (on a faithful simulator only its score tests do). The markdown
then gives the grid / fit ratio of the attribution stage and of the whole check.

    .venv/bin/python scripts/bench_check.py --threads 1                       # Pendulum, 8 and 64 episodes
    .venv/bin/python scripts/bench_check.py --systems pendulum halfcheetah --episodes 8 64 1000
    .venv/bin/python scripts/bench_check.py --systems halfcheetah --episodes 8 --attribution fit grid --gapped

Writes OUT/bench_check.json and OUT/bench_check.md (atomically).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from wmcheck.checks import check as check_module
from wmcheck.checks.calibration import calibrate
from wmcheck.checks.check import run_check
from wmcheck.checks.config import CheckConfig
from wmcheck.checks.reality import RealityProfile, record_reality
from wmcheck.checks.report_write import write_outputs
from wmcheck.datasets.episode import LogMeta
from wmcheck.datasets.logformat import write_log
from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.config import TrainConfig
from wmcheck.training.run import build_run_config, train

SYSTEMS = {
    "pendulum": {"env": "Pendulum-v1", "preset": "debug", "obs": ["cos_theta", "sin_theta", "theta_dot"], "dt": 0.05},
    "halfcheetah": {"env": "HalfCheetah-v5", "preset": "size1m", "obs": None, "dt": 0.05},
}
STAGES = {  # stage -> the names in checks.check that run_check calls for it ("Calibration.x": a method)
    "scoring": ("Calibration.score",),
    "attribution": ("run_gap_tests",),
    "power": ("cached_power_table",),
    "statistics": ("_competence", "_divergence", "_distribution", "_regimes", "ending_evidence", "_flagged_blocks"),
    "report": ("_embedding", "checked_video"),  # the report's figure data (then write_outputs renders them)
}


@contextmanager
def stage_timers(totals: dict[str, float]):
    """Wrap the functions of STAGES in checks.check so that their wall time adds up in `totals`.
    Only the outermost timed call counts: the blocks the gap tests re-score are attribution time."""
    from wmcheck.checks.calibration import Calibration

    saved, active = [], []
    for stage, names in STAGES.items():
        for name in names:
            owner, attr = (
                (Calibration, name.split(".", 1)[1]) if name.startswith("Calibration.") else (check_module, name)
            )
            fn = getattr(owner, attr)
            saved.append((owner, attr, fn))

            def timed(*a, _fn=fn, _stage=stage, **kw):
                if active:  # inside another stage: its time
                    return _fn(*a, **kw)
                active.append(_stage)
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    active.pop()
                    totals[_stage] = totals.get(_stage, 0.0) + time.perf_counter() - t0

            setattr(owner, attr, timed)
    try:
        yield totals
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def startup_seconds(log: Path, reps: int = 3) -> dict[str, float]:
    """Median wall time of `wmcheck --help` and `wmcheck validate LOG` in a fresh interpreter."""
    out = {}
    for name, args in {"help": ["--help"], "validate": ["validate", str(log)]}.items():
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "wmcheck.scripts.cli", *args], capture_output=True, check=False)
            times.append(time.perf_counter() - t0)
        out[name] = sorted(times)[len(times) // 2]
    return out


def prepare(
    name: str, work: Path, real_episodes: int, steps: int, seed: int, modes=("fit",)
) -> tuple[dict[str, Path], LogMeta, dict]:
    """Train once, then calibrate a copy of the run per attribution mode: ({mode: run}, meta, timings)."""
    spec = SYSTEMS[name]
    work.mkdir(parents=True, exist_ok=True)
    eps = record_reality(spec["env"], RealityProfile(), "hold:5", episodes=real_episodes, max_steps=200, seed=seed)
    d = eps[0].observations.shape[1]
    meta = LogMeta(
        source="real",
        dt=spec["dt"],
        observation_names=spec["obs"] or [f"obs{i}" for i in range(d)],
        action_names=[f"act{i}" for i in range(eps[0].actions.shape[1])],
    )
    write_log(work / "real.h5", eps, meta)
    t0 = time.perf_counter()
    cfg = TrainConfig(preset=spec["preset"], max_steps=steps, lr=1e-3, warmup=min(100, steps), progress_bar=False)
    train(work / "real.h5", work / "run", build_run_config(cfg))
    t_train = time.perf_counter() - t0
    runs, cal_s = {}, {}
    for mode in modes:
        runs[mode] = work / f"run-{mode}"
        if runs[mode].exists():
            shutil.rmtree(runs[mode])
        shutil.copytree(work / "run", runs[mode])
        t0 = time.perf_counter()
        calibrate(runs[mode], work / "real.h5", CheckConfig(attribution=mode), verbose=False)
        cal_s[mode] = time.perf_counter() - t0
    return runs, meta, {"train_s": t_train, "calibrate_s": cal_s, "train_steps": steps}


GAPPED = RealityProfile(actuator_gain=0.5)  # --gapped: every command acts half as strongly as reality's


def time_check(
    run: Path,
    meta: LogMeta,
    work: Path,
    env: str,
    n: int,
    seed: int,
    tensorboard: bool,
    tag: str = "",
    profile: RealityProfile | None = None,
) -> dict:
    eps = record_reality(env, profile or RealityProfile(), "hold:5", episodes=n, max_steps=200, seed=seed)
    sim = work / f"sim-{n}{tag}.h5"
    write_log(sim, eps, LogMeta(**{**meta.__dict__, "source": "sim"}))
    steps = sum(e.num_steps for e in eps)
    totals: dict[str, float] = {}
    t0 = time.perf_counter()
    with stage_timers(totals):
        report = run_check(run, sim, seed=0)
    t1 = time.perf_counter()
    write_outputs(report, work / f"report-{n}{tag}", tensorboard=tensorboard)
    t2 = time.perf_counter()
    totals["other"] = max((t1 - t0) - sum(totals.values()), 0.0)
    totals["report"] = totals.get("report", 0.0) + (t2 - t1)
    return {
        "episodes": n,
        "steps": steps,
        "blocks": report["summary"]["blocks"],
        "verdict": report["verdict"],
        "top_gap": report["summary"]["top_gap"],
        "seconds": t2 - t0,
        "steps_per_second": steps / (t2 - t0),
        "stages": {k: round(v, 3) for k, v in totals.items()},
    }


def run(args) -> dict:
    results = []
    for name in args.systems:
        spec = SYSTEMS[name]
        work = args.out / "work" / name
        print(f"[{name}] training {args.train_steps} steps and calibrating ({', '.join(args.attribution)})", flush=True)
        runs, meta, prep = prepare(name, work, args.real_episodes, args.train_steps, args.seed, args.attribution)
        startup = startup_seconds(work / "real.h5")
        checks = []
        kinds = {"faithful": None, **({"actuator 0.5": GAPPED} if args.gapped else {})}
        for n in args.episodes:
            for kind, profile in kinds.items():
                for mode, run_dir in runs.items():
                    for rep in range(2):  # the first check of a size computes the power table, the second reads it
                        tag = f"-{mode}-{kind.split()[0]}-{rep}"
                        c = time_check(run_dir, meta, work, spec["env"], n, 10_000 + n, args.tensorboard, tag, profile)
                        c.update(power_cached=rep == 1, attribution=mode, simulator=kind)
                        checks.append(c)
                        print(
                            f"[{name}] {n} episodes, {kind}, {mode} ({'power cached' if rep else 'first check'}): "
                            f"{c['seconds']:.1f} s, {c['steps_per_second']:.0f} steps/s, {c['verdict']} "
                            f"top {c['top_gap']}, {c['stages']}",
                            flush=True,
                        )
        results.append(
            {
                "system": name,
                "env": spec["env"],
                "preset": spec["preset"],
                "channels": {"obs": len(meta.observation_names), "actions": len(meta.action_names)},
                **prep,
                "startup_s": startup,
                "checks": checks,
            }
        )
    return {"systems": results}


def markdown(res: dict, info: dict) -> str:
    lines = [
        f"# Check speed ({info['date']})",
        "",
        f"{info['cpu_count']} CPUs, {info['torch_threads']} torch thread(s); total {info['total_seconds']:.0f} s. "
        "Each size is checked twice: the first check computes the power table for its size, the second reads it.",
        "",
    ]
    for s in res["systems"]:
        lines += [
            f"## {s['env']} ({s['preset']}, {s['channels']['obs']} observation / {s['channels']['actions']} command "
            f"channels)",
            "",
            f"Start-up: `wmcheck --help` {s['startup_s']['help']:.2f} s, `wmcheck validate` "
            f"{s['startup_s']['validate']:.2f} s (medians of 3). Training {s['train_steps']} steps "
            f"{s['train_s']:.0f} s (timing only), calibration "
            + ", ".join(f"{v:.0f} s ({m})" for m, v in s["calibrate_s"].items())
            + ".",
            "",
            "| episodes | simulator | attribution | verdict (top gap) | steps | power | total (s) | steps/s | scoring "
            "| attribution | power table | statistics | report | other |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in s["checks"]:
            st = c["stages"]
            lines.append(
                f"| {c['episodes']} | {c['simulator']} | {c['attribution']} | {c['verdict']} ({c['top_gap']}) | "
                f"{c['steps']} | {'cached' if c['power_cached'] else 'computed'} | "
                f"{c['seconds']:.1f} | {c['steps_per_second']:.0f} | "
                + " | ".join(
                    f"{st.get(k, 0.0):.1f}"
                    for k in ("scoring", "attribution", "power", "statistics", "report", "other")
                )
                + " |"
            )
        lines += [""] + ratio_lines(s) + [""]
    return "\n".join(lines) + "\n"


def ratio_lines(s: dict) -> list[str]:
    """grid / fit time ratios of the attribution stage and of the whole check, per size and
    simulator, on the checks that read the power table (its cost is not attribution's)."""
    cached = [c for c in s["checks"] if c["power_cached"]]
    by = {(c["episodes"], c["simulator"], c["attribution"]): c for c in cached}
    out = []
    for (n, kind, mode), c in by.items():
        g = by.get((n, kind, "grid"))
        if mode != "fit" or g is None:
            continue
        att = g["stages"].get("attribution", 0.0) / max(c["stages"].get("attribution", 0.0), 1e-9)
        out.append(
            f"- {n} episodes, {kind}: attribution grid / fit = {att:.1f}x "
            f"({g['stages'].get('attribution', 0.0):.1f} s / {c['stages'].get('attribution', 0.0):.1f} s); "
            f"whole check {g['seconds'] / c['seconds']:.1f}x ({g['seconds']:.1f} s / {c['seconds']:.1f} s)"
        )
    cal = s["calibrate_s"]
    if "fit" in cal and "grid" in cal:
        out.append(
            f"- calibration grid / fit = {cal['grid'] / cal['fit']:.1f}x ({cal['grid']:.0f} s / {cal['fit']:.0f} s)"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", nargs="+", default=["pendulum"], choices=sorted(SYSTEMS))
    ap.add_argument("--episodes", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--real-episodes", type=int, default=24)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attribution", nargs="+", default=["fit"], choices=("fit", "grid"))
    ap.add_argument("--gapped", action="store_true", help="also check a simulator with an actuator gap (gain 0.5)")
    ap.add_argument("--no-tensorboard", dest="tensorboard", action="store_false")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    info = machine_info(command=" ".join(sys.argv))
    res = run(args)
    info = finish(info, t0)
    write_results(args.out, "bench_check", {"benchmark": "check_speed", "machine": info, **res}, markdown(res, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
