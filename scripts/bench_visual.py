"""Visual-gap detection benchmark (CPU-sized): visual gaps and a dynamics gap, both from pixels.

A "real" Pusher-v5 (MuJoCo) is recorded with camera frames (`--size` pixels square) under random
held torques; a `debug` world model is trained on frames + vector state and calibrated on its
held-out episodes. Then simulators with one known gap each are recorded with new seeds and checked
with `run_check`:

  faithful         no gap (the false-alarm row)
  brightness x1.3  rendered frames 30% brighter                      (visual)
  colour           per-channel gains [1.25, 1.0, 0.75]                (visual)
  blur             Gaussian blur, sigma 1 pixel                       (visual)
  noise            white pixel noise, std 12 grey levels              (visual)
  damping x4       joint damping x4, rendering unchanged              (dynamics, seen in pixels too)

For each, the table gives the verdict, the top gap, the evidence of the visual and dynamics rows
(>= 1 = present) and the visual row's explanation: the two families should be told apart (visual
gaps leave the dynamics row absent; the damping change leaves the visual row absent).

    .venv/bin/python scripts/bench_visual.py --threads 1             # ~15 min on a shared 2-core CPU
    .venv/bin/python scripts/bench_visual.py --quick --threads 1     # a smoke test of the script

Writes OUT/bench_visual.json and OUT/bench_visual.md; logs and the run go to OUT/work/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

GAPS = {
    "faithful": {},
    "brightness x1.3": {"visual_brightness": 1.3},
    "colour [1.25, 1, 0.75]": {"visual_colour": [1.25, 1.0, 0.75]},
    "blur sigma 1 px": {"visual_blur": 1.0},
    "pixel noise std 12": {"visual_noise_std": 12.0},
    "damping x4 (dynamics)": {"physics": {"dof_damping": {"scale": 4.0}}},
}


def record(path: Path, episodes: int, seed: int, size: int, profile: dict, source: str) -> Path:
    from wmcheck.checks.reality import reality_env_args
    from wmcheck.datasets.record import record_to_log

    if not path.exists():
        rid, kw = reality_env_args("Pusher-v5", profile)
        record_to_log(
            path,
            rid,
            "hold:3",
            episodes=episodes,
            max_steps=50,
            seed=seed,
            env_kwargs=kw,
            source=source,
            render=(size, size),
        )
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-visual"))
    p.add_argument("--size", type=int, default=32, help="frame size in pixels (square)")
    p.add_argument("--episodes", type=int, default=40, help="real episodes (50 steps each)")
    p.add_argument("--checked", type=int, default=10, help="episodes per checked simulator")
    p.add_argument("--steps", type=int, default=1500, help="training steps")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the script runs")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.size, args.episodes, args.checked, args.steps = 16, 16, 4, 30
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.check import run_check
    from wmcheck.checks.config import CheckConfig
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    real = record(work / "real.h5", args.episodes, 0, args.size, {}, "real")
    run = work / "run"
    if not (run / "model.pt").exists():
        cfg = TrainConfig(
            preset="debug",
            max_steps=args.steps,
            batch_size=16,
            seq_len=32,
            lr=1e-3,
            warmup=100,
            val_every=args.steps,
            ckpt_every=max(200, args.steps),
            log_every=25,
            progress_bar=False,
            seed=0,
            val_fraction=0.25,
            openloop_context=8,
            openloop_horizons=(1, 8, 24),
            openloop_windows=6,
        )
        train(real, run, build_run_config(cfg))
        calibrate(run, real, CheckConfig(context=8, horizon=24), verbose=False)
    t_train = time.perf_counter() - t0
    rows = []
    for i, (name, profile) in enumerate(GAPS.items()):
        sim = record(work / f"sim_{i}.h5", args.checked, 1000, args.size, profile, "sim")
        t1 = time.perf_counter()
        rep = run_check(run, sim, command=f"bench_visual {name}")
        g = rep["gaps"]
        rows.append(
            {
                "simulator": name,
                "verdict": rep["verdict"],
                "top_gap": rep["summary"]["top_gap"],
                "confounded": rep["summary"]["confounded"],
                "visual_evidence": g["visual"]["evidence"],
                "visual": g["visual"]["verdict"],
                "dynamics_evidence": g["dynamics"]["evidence"],
                "dynamics": g["dynamics"]["verdict"],
                "distance_ratio": g["visual"]["estimate"]["distance_ratio"],
                "divergent_episodes": rep["summary"]["divergent"],
                "episodes": rep["summary"]["episodes"],
                "visual_explanation": g["visual"]["explanation"],
                "seconds": round(time.perf_counter() - t1, 1),
            }
        )
        print(
            f"{name}: {rows[-1]['verdict']} top {rows[-1]['top_gap']} visual {rows[-1]['visual_evidence']} "
            f"dynamics {rows[-1]['dynamics_evidence']}",
            flush=True,
        )
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": args.size,
        "real_episodes": args.episodes,
        "checked_episodes": args.checked,
        "train_steps": args.steps,
        "train_and_calibrate_seconds": round(t_train, 1),
        "quick": args.quick,
    }
    (args.out / "bench_visual.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        "| simulator | verdict | top gap | visual evidence | dynamics evidence | frame distance ratio | visual explanation |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['simulator']} | {r['verdict']} | {r['top_gap']} | {r['visual_evidence']} ({r['visual']}) | "
            f"{r['dynamics_evidence']} ({r['dynamics']}) | {r['distance_ratio']} | {r['visual_explanation']} |"
        )
    (args.out / "bench_visual.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {args.out / 'bench_visual.md'} ({os.path.getsize(args.out / 'bench_visual.json')} B json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
