"""`wmcheck demo --synthetic`: a MuJoCo "reality" with known gaps, so findings meet the truth.

Owns `run_synthetic_demo` and its scenario (`SCENARIO`):
- reality: MuJoCo HalfCheetah-v5 with heavier joint damping and a little sensor noise (the plant a
  team would log on hardware; here recorded from `checks.reality` so the truth is known);
- the team's simulators, each checked against a world model trained on the reality's logs:
  a faithful one (the reality itself, new seeds: must pass), the reality with 2 steps of action
  latency, and the reality with a weak actuator (gain 0.5). The printed table puts each check's
  verdict, top gap and estimate next to the injected truth.
"""

from __future__ import annotations

import time
from pathlib import Path

ENV_ID = "HalfCheetah-v5"  # Swimmer, Reacher and InvertedPendulum are reserved for the independent evaluation
REALITY = {"physics": {"dof_damping": {"scale": 1.5}}, "sensor_noise_std": 0.01, "name": "reality"}
SCENARIO = [  # (folder, what the team's simulator is, profile overrides on top of the reality, truth)
    ("faithful", "faithful simulator (the reality, new seeds)", {}, "none"),
    ("latency-2", "simulator with 2 steps of action latency", {"latency_steps": 2}, "latency: 2 steps"),
    ("weak-actuator", "simulator with actuator gain 0.5", {"actuator_gain": 0.5}, "actuator: gain 0.5"),
]
MAX_STEPS = 300  # steps per recorded episode
POLICY = "hold:5"  # random commands held 5 steps: an exciting input


def _estimate(report: dict) -> str:
    """The top gap's estimate and interval as one short string ("-" when there is none)."""
    top = report["summary"]["top_gap"]
    gap = report["gaps"].get(top) or {}
    est, ci = gap.get("estimate"), gap.get("ci")
    if not isinstance(est, dict):
        return "-"
    if top == "latency":
        text = f"{est['steps']} steps"
    elif top == "actuator":
        text = f"{est['kind']} {est['value']:.3g} on {est['channel']}"
    elif top == "sensor_noise":
        text = f"noise x{est['noise_ratio']:.3g} on {est['channel']}"
    else:
        return "-"
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        text += f" [{ci[0]:.3g}, {ci[1]:.3g}]"
    return text


def run_synthetic_demo(out: Path, max_steps: int, preset: str, episodes: int, progress: bool = True) -> int:
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.reality import RealityProfile, reality_env_args
    from wmcheck.datasets.record import record_to_log
    from wmcheck.scripts.demo_wind import check_and_write, finished_line, print_findings, stage
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    total = 3 + len(SCENARIO)
    reality = RealityProfile.from_dict(REALITY)
    stage(1, total, f"recording {episodes} 'real' episodes of {ENV_ID} ({reality.describe()}) under a {POLICY} policy")
    real_log = out / "real.h5"
    rid, kw = reality_env_args(ENV_ID, reality)
    record_to_log(real_log, rid, POLICY, episodes=episodes, max_steps=MAX_STEPS, seed=0, env_kwargs=kw, source="real")
    stage(2, total, f"training a '{preset}' world model for {max_steps} steps on the real log (CPU), then calibrating")
    cfg = TrainConfig(
        preset=preset,
        max_steps=max_steps,
        lr=1e-3,
        warmup=min(100, max_steps),
        val_every=max(1, min(500, max_steps)),
        ckpt_every=max(1, min(250, max_steps)),
        progress_bar=progress,
        val_fraction=0.3,
    )
    result = train(real_log, out / "run", build_run_config(cfg))
    calibrate(result.run_dir, real_log)
    rows, checked = [], []
    for i, (folder, what, overrides, truth) in enumerate(SCENARIO):
        stage(3 + i, total, f"checking the {what}")
        prof = RealityProfile.from_dict({**REALITY, **overrides, "name": folder, "seed": 100 + i})
        sim_log = out / f"sim-{folder}.h5"
        rid, kw = reality_env_args(ENV_ID, prof)
        n = max(4, episodes // 2)
        record_to_log(sim_log, rid, POLICY, episodes=n, max_steps=MAX_STEPS, seed=1000 * (i + 1), env_kwargs=kw)
        report = check_and_write(
            result.run_dir, sim_log, out / f"report-{folder}", f"wmcheck demo --synthetic ({folder})"
        )
        print_findings(what, report, out / f"report-{folder}", limit=2)
        rows.append((what, truth, report["verdict"], report["summary"]["top_gap"], _estimate(report)))
        checked.append((what, report))
    stage(total, total, f"done in {time.perf_counter() - t0:.0f} s")
    width = max(len(r[0]) for r in rows)
    print(f"\n{'checked simulator':<{width}}  {'injected truth':<20} {'verdict':<13} {'top gap':<13} estimate")
    for what, truth, verdict, top, est in rows:
        print(f"{what:<{width}}  {truth:<20} {verdict:<13} {top:<13} {est}")
    print(f"\n  TensorBoard: tensorboard --logdir {out}")
    print(finished_line(checked))
    return 0  # the demo ran; what it finds is its result
