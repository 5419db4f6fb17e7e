"""Cross-fitting benchmark: what `train --folds K` buys on a log of few short real segments.

Reality is Pendulum-v1 with the project's reality wrappers (checks/reality.py, the default profile:
no gap), 20 episodes of 128 steps under sample-and-hold torques. Two runs train on the same log with
the same training options:
  split       one model, the default validation split (val_fraction 0.2): the thresholds rest on
              the few episodes it holds out;
  folds K     K fold models (training/crossfit.py), every episode held out once: the thresholds rest
              on all 20.
Both are calibrated with the default check settings. The benchmark prints, side by side, each run's
power table (detection probability per injected gap size, the smallest size detected with
probability >= the target) for a check of CHECKED episodes, and the verdicts of checks of recorded
simulators: a faithful one (reality's own dynamics, other seeds) and gapped ones (a weaker actuator,
a heavier gravity) — the simulators are not derived from the held-out episodes.

    .venv/bin/python scripts/bench_crossfit.py --threads 1          # ~35 min on one CPU thread
    .venv/bin/python scripts/bench_crossfit.py --quick              # a smoke test (tiny training)

Writes OUT/bench_crossfit.json and prints a Markdown table. A re-run with the same OUT keeps its
logs and trained runs (finished folds are read back, a finished run resumes at its end) and
re-calibrates and re-checks: a change to calibration or checks is measured in minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ENV = "Pendulum-v1"
SIMULATORS = {  # name -> (RealityProfile fields, env kwargs)
    "faithful": ({}, {}),
    "actuator gain 0.5": ({"actuator_gain": 0.5}, {}),
    "gravity 15 (reality 10)": ({}, {"g": 15.0}),
}


def record(path: Path, episodes: int, steps: int, seed: int, profile: dict, env_kwargs: dict, source: str) -> Path:
    """Pendulum-v1 through the reality wrappers under hold:5 torques, recorded as `wmcheck record`
    does; a log already at `path` is kept (a re-run in the same OUT reuses its logs and runs)."""
    from wmcheck.checks.reality import RealityProfile, reality_env_args
    from wmcheck.datasets.record import record_to_log

    if path.exists():
        return path

    env_id, kwargs = reality_env_args(ENV, RealityProfile(**profile), env_kwargs)
    record_to_log(path, env_id, "hold:5", episodes, steps, seed, kwargs, source=source)
    return path


def power_rows(table: dict) -> dict:
    return {
        gap: {
            "sizes": t["sizes"],
            "units": t["units"],
            "detection_probability": [round(p, 2) for p in t["detection_probability"]],
            "smallest_detected": t["smallest_detected"],
            "blocks_used": t["blocks_used"],
            "control_detection": round(t["control_detection"], 2),
        }
        for gap, t in table.items()
    }


def run_case(name: str, log: Path, out: Path, train_opts: dict, sims: dict, checked_blocks: int) -> dict:
    import wmcheck
    from wmcheck.checks.calibration import Calibration
    from wmcheck.checks.power import power_table

    t0 = time.perf_counter()
    wmcheck.train(log, out, progress_bar=False, **train_opts)
    train_s = time.perf_counter() - t0
    cal = Calibration.load(out)
    table = power_table(cal, checked_blocks, cal.config.alpha, cal.config.power_target, seed=cal.config.seed)
    verdicts = {}
    for sim, path in sims.items():
        report = wmcheck.check(out, rollouts=path, tensorboard=False)
        verdicts[sim] = {"verdict": report.verdict, "top_gap": report.top_gap, "message": report.message}
    return {
        "name": name,
        "train_seconds": round(train_s, 1),
        "held_out_episodes": len(cal.info["held_out_episodes"]),
        "calibration_blocks": int(cal.info["blocks"]),
        "power": power_rows(table),
        "checks": verdicts,
    }


def markdown(results: list[dict]) -> str:
    lines = ["| | " + " | ".join(r["name"] for r in results) + " |", "|---|" + "---|" * len(results)]
    lines.append(
        "| held-out episodes (blocks) | "
        + " | ".join(f"{r['held_out_episodes']} ({r['calibration_blocks']})" for r in results)
        + " |"
    )
    lines.append("| training time (s) | " + " | ".join(str(r["train_seconds"]) for r in results) + " |")
    gaps = sorted({g for r in results for g in r["power"]})
    for gap in gaps:
        cells = []
        for r in results:
            t = r["power"].get(gap)
            if t is None:
                cells.append("–")
                continue
            probs = ", ".join(f"{s:g}: {p:.2f}" for s, p in zip(t["sizes"], t["detection_probability"]))
            smallest = t["smallest_detected"]
            cells.append(f"smallest {smallest if smallest is not None else 'none'} ({probs})")
        lines.append(f"| power: {gap} | " + " | ".join(cells) + " |")
    for sim in results[0]["checks"]:
        lines.append(
            f"| check: {sim} | "
            + " | ".join(f"{r['checks'][sim]['verdict']} (top gap: {r['checks'][sim]['top_gap']})" for r in results)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench_crossfit_out"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--episodes", type=int, default=20, help="real segments in the training log")
    p.add_argument("--steps", type=int, default=128, help="steps per real segment")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--checked", type=int, default=8, help="simulator episodes per check")
    p.add_argument("--quick", action="store_true", help="a smoke test: tiny training, few episodes")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.episodes, args.steps, args.folds, args.max_steps, args.checked = 6, 80, 3, 20, 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = record(out / "real.h5", args.episodes, args.steps, 0, {}, {}, "real")
    sims = {
        name: record(out / f"sim_{i}.h5", args.checked, args.steps, 10_000 + 100 * i, prof, kw, "sim")
        for i, (name, (prof, kw)) in enumerate(SIMULATORS.items())
    }
    opts = {"max_steps": args.max_steps, "seed": 0}
    check = {"horizon": 16, "context": 16} if args.quick else {}
    blocks_per_episode = max(1, args.steps // (check.get("context", 16) + check.get("horizon", 48)))
    checked_blocks = args.checked * blocks_per_episode
    results = [
        run_case(
            "split (val_fraction 0.2)", log, out / "split", {**opts, "check_options": check}, sims, checked_blocks
        ),
        run_case(
            f"folds {args.folds}",
            log,
            out / "folds",
            {**opts, "folds": args.folds, "check_options": check},
            sims,
            checked_blocks,
        ),
    ]
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "scripts/bench_crossfit.py " + " ".join(argv if argv is not None else []),
        "episodes": args.episodes,
        "steps": args.steps,
        "checked_episodes": args.checked,
        "checked_blocks": checked_blocks,
        "results": results,
    }
    (out / "bench_crossfit.json").write_text(json.dumps(payload, indent=2, default=float))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
