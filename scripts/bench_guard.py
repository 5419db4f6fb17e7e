"""Per-step overhead of the runtime guard (runtime/guard.py) on CPU, and what it does under faults.

    python -m wmcheck.scripts.bench_guard --run RUNDIR [--env Pendulum-v1] [--episodes 4] [--steps 200]
        [--threads 1] [--compare] [--block-worker --period-ms 10] [--realities faithful,...]

RUNDIR is a trained and calibrated run of `--env` (e.g. the tests' recipe: 40 episodes of hold:5
commands, the `debug` preset). For each reality of that env (Pendulum-v1: faithful, a theta_dot
sensor drift, a 3-step latency, a 3-step latency spike from step 60 on, an actuator gain of 0.3, a
cos(theta) reading 2.0 off; MountainCarContinuous-v0: faithful, a start at rest at position 0.3,
above anything its logs reached), it runs the guard around the recording's own sample-and-hold
policy (commands uniform in the action space) and prints the median per-step time of `Guard.act`
(the env step excluded), the share of steps on the fallback, and the episodes with a rollback and
the first step it came at. After the table, each reality's episodes with any fallback and with an
in-episode rollback are given with 95 % Wilson intervals: on the faithful reality these are the
guard's false fallbacks and false rollbacks, to compare with their budgets (docs/after-release.md).
The last column is what a Shiryaev-Roberts e-detector on the same window p-values would have
rolled back (not the guard's rule; it would give a per-episode budget if the windows' p-values
were independent and valid, which the faithful runs test).
The time per step is given as the median and the mean: the open-loop test
scores one block every `horizon` steps, which the mean counts and the median mostly does not.
`--compare` runs every reality three times in the same run: with every test, without the
corrections' score test (GuardConfig.corrections), and without it and the open-loop test
(GuardConfig.open_loop), so that each test's cost and what it catches are measured side by side.
The next column counts the blocks each statistic flagged (one-step windows / open loop / scores).
The last is the deployment test (runtime/deployment.py: the last `deployment_episodes` episodes'
blocks pooled, one look after each episode): the episode whose look raised its rollback, and the
looks flagged by the open-loop / the corrections' statistic. The worst step is a block's end, so
the 99th percentile and the largest step time are printed too: a control loop's deadline meets them.
`--block-worker` scores the blocks in a second process (GuardConfig.block_worker). The worker
needs the time between steps that a real control loop has: `--period-ms` paces each step to that
period (the time of `act` is still what is measured; the episode's end waits for its last blocks).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

REALITIES = {
    "Pendulum-v1": {
        "faithful": {},
        "sensor drift 0.02/step": {"sensor_drift": [0, 0, 0.02]},
        "latency 3 steps": {"latency_steps": 3},
        "latency spike from 60": {"latency_steps": 3, "latency_window": [60, 10**6]},
        "actuator gain 0.3": {"actuator_gain": 0.3},
        "cos(theta) read +2.0": {"sensor_bias": [2.0, 0, 0]},
    },
    "MountainCarContinuous-v0": {
        "faithful": {},
        "start at position 0.3": {"start_state": [0.3, 0.0]},
    },
}


E_DETECTOR_THRESHOLD = 420.0  # 21 windows per 200-step episode / a 5 % budget (Doob: P(alarm) <= windows / A)


def mixture_e_value(p: float) -> float:
    """The e-value of a p-value averaged over the calibrators k p^(k - 1), 0 < k < 1:
    (1 - p + p log p) / (p log(p)^2), 0.5 at p = 1."""
    p = min(max(float(p), 1e-12), 1 - 1e-9)
    lp = np.log(p)
    return (1 - p + p * lp) / (p * lp**2)


def shiryaev_roberts_alarm(ps: list[float], threshold: float) -> bool:
    """Whether a Shiryaev-Roberts e-detector R_j = (R_{j-1} + 1) e(p_j) over an episode's window
    p-values reaches `threshold`. Not the guard's rule: measured beside it, because for independent
    valid p-values it would bound the false rollbacks of an episode of n windows by n / threshold,
    a budget the consecutive rule cannot state."""
    r = 0.0
    for p in ps:
        r = (r + 1.0) * mixture_e_value(p)
        if r >= threshold:
            return True
    return False


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--env", default="Pendulum-v1", choices=sorted(REALITIES), help="the system the run was trained on")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--samples", type=int, default=8, help="latent draws of the guard's one-step mixture (GuardConfig.samples)"
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run without the corrections' score test, and without it and the open-loop test",
    )
    p.add_argument(
        "--competence-alpha",
        type=float,
        default=None,
        help="the share of held-out real steps above the support bound (GuardConfig.competence_alpha; default: the calibration's)",
    )
    p.add_argument("--block-worker", action="store_true", help="score blocks in a second process")
    p.add_argument("--period-ms", type=float, default=0.0, help="pace every step to this control period")
    p.add_argument("--realities", default=None, help="comma-separated names of REALITIES[env] (default: all)")
    args = p.parse_args(argv)
    realities = REALITIES[args.env]
    names = args.realities.split(",") if args.realities else list(realities)

    import torch

    torch.set_num_threads(args.threads)
    from wmcheck.checks.reality import RealityProfile, make_reality_env
    from wmcheck.runtime.guard import Guard, GuardConfig
    from wmcheck.scripts.bench_detection import wilson

    print(
        f"{'reality':<24} {'tests':>11} {'ms/step':>8} {'mean ms':>8} {'p99 ms':>7} {'max ms':>7} "
        f"{'fallback':>9} {'rollbacks':>10} first rollback steps; flagged window / block / score tests; "
        "deployment rollback episode (flagged looks); slowest step (episode, t)"
    )
    settings = [(True, True), (True, False), (False, False)] if args.compare else [(True, True)]
    rates = []
    for name in names:
        kw = realities[name]
        for open_loop, corrections in settings:
            cfg = GuardConfig(
                samples=args.samples,
                open_loop=open_loop,
                corrections=corrections,
                block_worker=args.block_worker,
                competence_alpha=args.competence_alpha,
            )
            guard = Guard(args.run, fallback=lambda obs: np.zeros(1), config=cfg)
            env = make_reality_env(args.env, RealityProfile(**kw).to_dict())
            bound = float(env.action_space.high[0])
            times, firsts, fell_back, e_alarms = [], [], 0, 0
            for i in range(args.episodes):
                obs, _ = env.reset(seed=1000 + i)
                guard.reset(obs)
                rng = np.random.default_rng(1000 + i)
                a = np.zeros(1)
                start = len(guard.decisions)
                for t in range(args.steps):
                    if t % 5 == 0:
                        a = rng.uniform(-bound, bound, size=1)
                    t0 = time.perf_counter()
                    applied = guard.act(obs, a)
                    times.append(time.perf_counter() - t0)
                    while time.perf_counter() < t0 + args.period_ms / 1e3:
                        pass  # a spin, not a sleep: on this VM a sleep costs the next step ~2 ms of wake-up
                    obs, *_ = env.step(applied)
                guard.finish(obs)  # ends the episode: its last blocks' tests and its deployment look
                firsts.append(next((s.t for s in guard.decisions[start:] if s.rollback), None))
                fell_back += any(s.controller == "fallback" for s in guard.decisions[start:])
                windows = [s.window_p for s in guard.decisions[start:] if s.window_p is not None]
                e_alarms += shiryaev_roberts_alarm(windows, E_DETECTOR_THRESHOLD)
            env.close()
            s = guard.summary()
            hit = [f for f in firsts if f is not None]
            alpha = cfg.rollback_alpha
            flagged = [
                sum(1 for d in guard.decisions if getattr(d, f) is not None and getattr(d, f) <= alpha)
                for f in ("window_p", "block_p", "score_p")
            ]
            guard.close()
            looks = [  # flagged at the look's own (spent) level
                sum(1 for d in guard.decisions if getattr(d, f) is not None and getattr(d, f) <= d.deployment_level)
                for f in ("deployment_block_p", "deployment_score_p")
            ]
            tests = "all" if corrections else ("no scores" if open_loop else "one-step")
            ms = 1e3 * np.asarray(times)
            slowest = divmod(int(ms.argmax()), args.steps)
            rates.append((name, tests, fell_back, len(hit), e_alarms, args.episodes))
            print(
                f"{name:<24} {tests:>11} {np.median(ms):>8.2f} {ms.mean():>8.2f} {np.quantile(ms, 0.99):>7.1f} "
                f"{ms.max():>7.1f} {s['fallback_steps'] / s['steps']:>9.1%} "
                f"{len(hit):>4} of {args.episodes:<3} {hit}; {' / '.join(map(str, flagged))}; "
                f"{guard.summary()['deployment_rollback_episode']} ({' / '.join(map(str, looks))}); {slowest}",
                flush=True,
            )
    print("\nepisodes with a fallback / with an in-episode rollback, 95 % Wilson intervals:")
    for name, tests, fell_back, rolled, e_alarms, n in rates:
        fb, rb, ed = (
            f"{k}/{n} [{lo:.1%}, {hi:.1%}]" for k in (fell_back, rolled, e_alarms) for lo, hi in [wilson(k, n)]
        )
        print(f"  {name:<24} {tests:>11}  fallback {fb:<22} rollback {rb:<22} e-detector on the windows {ed}")


if __name__ == "__main__":
    main()
