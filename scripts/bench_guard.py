"""Per-step overhead of the runtime guard (runtime/guard.py) on CPU, and what it does under faults.

    python -m wmcheck.scripts.bench_guard --run RUNDIR [--episodes 4] [--steps 200] [--threads 1]

RUNDIR is a trained and calibrated Pendulum-v1 run (e.g. the tests' recipe: 40 episodes of hold:5
torques, the `debug` preset). For each reality (faithful, a theta_dot sensor drift, a 3-step
latency, an actuator gain of 0.3, a cos(theta) reading 2.0 off), it runs the guard around the
recording's own sample-and-hold policy and prints the median per-step time of `Guard.act` (the
env step excluded), the share of steps on the fallback, and the episodes with a rollback and the
first step it came at.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

REALITIES = {
    "faithful": {},
    "sensor drift 0.02/step": {"sensor_drift": [0, 0, 0.02]},
    "latency 3 steps": {"latency_steps": 3},
    "actuator gain 0.3": {"actuator_gain": 0.3},
    "cos(theta) read +2.0": {"sensor_bias": [2.0, 0, 0]},
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--samples", type=int, default=8, help="latent draws of the guard's one-step mixture (GuardConfig.samples)"
    )
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from wmcheck.checks.reality import RealityProfile, make_reality_env
    from wmcheck.runtime.guard import Guard, GuardConfig

    print(f"{'reality':<24} {'ms/step':>8} {'fallback':>9} {'rollbacks':>10} {'first rollback steps'}")
    for name, kw in REALITIES.items():
        guard = Guard(args.run, fallback=lambda obs: np.zeros(1), config=GuardConfig(samples=args.samples))
        env = make_reality_env("Pendulum-v1", RealityProfile(**kw).to_dict())
        times, firsts = [], []
        for i in range(args.episodes):
            obs, _ = env.reset(seed=1000 + i)
            guard.reset(obs)
            rng = np.random.default_rng(1000 + i)
            a = np.zeros(1)
            start = len(guard.decisions)
            for t in range(args.steps):
                if t % 5 == 0:
                    a = rng.uniform(-2, 2, size=1)
                t0 = time.perf_counter()
                applied = guard.act(obs, a)
                times.append(time.perf_counter() - t0)
                obs, *_ = env.step(applied)
            firsts.append(next((s.t for s in guard.decisions[start:] if s.rollback), None))
        env.close()
        s = guard.summary()
        hit = [f for f in firsts if f is not None]
        print(
            f"{name:<24} {1e3 * np.median(times):>8.2f} {s['fallback_steps'] / s['steps']:>9.1%} "
            f"{len(hit):>4} of {args.episodes:<3} {hit}"
        )


if __name__ == "__main__":
    main()
