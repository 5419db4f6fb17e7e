"""`wmcheck record ENV --out LOG.h5 --episodes N ...`: record simulator rollouts into a log.

ENV is a registered gymnasium id (Pendulum-v1, HalfCheetah-v5, ...) or module:Class. The policy is
random, hold:K (a random action held for K steps, an exciting input for system identification),
module:callable, a Stable-Baselines3 model (module:model or a .zip), or a TorchScript file. Episodes are written one at a time (atomic file).
"""

from __future__ import annotations

import argparse
import warnings

from wmcheck.datasets.episode import SOURCES
from wmcheck.datasets.record import parse_render_size, record_to_log
from wmcheck.scripts.config_args import env_kwargs_arg


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "record",
        help="record gymnasium environment rollouts into a log",
        description=(
            "Run a gymnasium environment (registered id such as Pendulum-v1 or HalfCheetah-v5, or "
            "module:Class) under a policy and write the episodes to a wmcheck log: observations, "
            "actions, rewards, terminations, truncations, the seed of each episode (seed + index) "
            "and the step period dt. Policies: random (uniform samples), hold:K (a random action "
            "held for K steps: a piecewise-constant input that excites the dynamics for system "
            "identification), module:callable (observation -> action), module:model (an object with "
            ".predict, e.g. a Stable-Baselines3 model), a Stable-Baselines3 .zip, or a TorchScript .pt file."
        ),
        epilog="example: wmcheck record Pendulum-v1 --out pendulum.h5 --episodes 20 --policy hold:5",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("env", metavar="ENV", help="gymnasium id or module:Class")
    p.add_argument("--out", required=True, metavar="LOG.h5", help="the log file to write")
    p.add_argument("--episodes", type=int, default=10, metavar="N", help="number of episodes (default 10)")
    p.add_argument(
        "--max-steps", type=int, metavar="M", help="cut episodes after M steps (default: the env's time limit)"
    )
    p.add_argument("--env-kwargs", metavar="JSON", help="keyword arguments for the env, e.g. '{\"g\": 9.81}'")
    p.add_argument(
        "--policy",
        default="random",
        help="random | hold:K | module:callable | module:model (has .predict) | sb3.zip | path.pt",
    )
    p.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i")
    p.add_argument(
        "--shadow",
        metavar="POLICY",
        help="shadow mode: this candidate policy proposes an action at every step (logged as "
        "proposed_actions) while --policy acts; then `wmcheck shadow RUN --log LOG.h5`",
    )
    p.add_argument(
        "--render",
        metavar="WxH",
        help="also store rendered camera frames (render_mode rgb_array), "
        "resized to W x H, as the observation group 'image', e.g. --render 64x64",
    )
    p.add_argument(
        "--source",
        choices=SOURCES[1:],
        default="sim",
        help="sim for simulator rollouts, policy for trajectories of a policy under test",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kwargs = env_kwargs_arg(args.env_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta, steps = record_to_log(
            args.out,
            args.env,
            policy=args.policy,
            episodes=args.episodes,
            max_steps=args.max_steps,
            seed=args.seed,
            env_kwargs=kwargs,
            source=args.source,
            render=parse_render_size(args.render) if args.render else None,
            shadow=args.shadow,
        )
    for w in caught:
        if "dt recorded as" in str(w.message):
            print(f"warning: {w.message}")
    print(
        f"wrote {args.out}: {args.episodes} episode(s) of {args.env}, {steps:,} steps, dt {meta.dt:g} s, "
        f"{len(meta.observation_names)} observation and {len(meta.action_names)} action channels, "
        f"policy {args.policy}, seeds {args.seed}..{args.seed + args.episodes - 1}"
        + (f", frames {args.render}" if args.render else "")
        + (f", proposals of {args.shadow} logged" if args.shadow else "")
    )
    return 0
