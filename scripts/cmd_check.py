"""`wmcheck check RUNDIR --rollouts SIM.h5 --out REPORTDIR`: the consistency check and CI gate."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="check simulator rollouts / policy trajectories against the world model (CI gate)",
        description=(
            "Run simulator rollouts (or policy trajectories) through the world model trained on real "
            "logs: open-loop divergence, silent incoherence (one-step surprise), competence "
            "(out-of-support states, ensemble disagreement), attribution to gap types (latency, "
            "actuator, sensor noise, dynamics, distribution) with estimates and intervals, and the "
            "power of the check. Writes REPORTDIR/report.json (schema: wmcheck/checks/schema/"
            "report.schema.json), report.html and a TensorBoard run (REPORTDIR/tb). Exit code: 0 pass, "
            "1 fail (divergent, or unverifiable unless --allow-unverifiable), 2 bad input, 3 inconclusive "
            "(nothing found, but the power table shows the check could not have seen some gap type: not a pass)."
        ),
        epilog="gate file keys: alpha, score_alpha{score: p}, tolerances{gap: {...}}, allow_unverifiable, "
        "require_power[latency, actuator, sensor_noise, sensor_bias, obs_scale, smoothing, motion_larger, "
        "motion_smaller, ending], "
        "policy{min_episodes (default 1000), min_success_rate (default 0.85)}: a policy check with a lower "
        "simulator success rate fails (not evaluated where the env defines no success); fewer episodes warn "
        "unless the gate file sets min_episodes",
    )
    p.add_argument("run_dir", type=Path, metavar="RUNDIR", help="run directory with model.pt and calibration")
    p.add_argument(
        "--rollouts", type=Path, metavar="SIM.h5", help="log of simulator rollouts / policy trajectories to check"
    )
    p.add_argument("--env", help="gymnasium env id (or module:Class) to record rollouts from, with --policy")
    p.add_argument(
        "--policy",
        help="policy for --env: random, hold:K, module:callable, module:model (an object with .predict, e.g. "
        "a Stable-Baselines3 model), a Stable-Baselines3 .zip or a TorchScript file; any but random and hold:K "
        "is also run closed loop inside the world model (policy check) (default: random)",
    )
    p.add_argument(
        "--success",
        metavar="MODULE:CALLABLE",
        help="success rule of a policy episode, called as f(episode, final_info) -> bool "
        "(default: the env's info['is_success'] or info['success'] at the last step)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes to record with --env (default: the gate's policy.min_episodes for a policy, else 20)",
    )
    p.add_argument(
        "--policy-samples",
        type=int,
        default=8,
        metavar="S",
        help="model rollouts per simulator episode in the policy check (default 8)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="step limit per recorded episode (default: the env's own time limit)",
    )
    p.add_argument("--env-kwargs", default=None, help="JSON keyword arguments for --env")
    p.add_argument(
        "--render", metavar="WxH", help="with --env: also record camera frames (for models trained on frames)"
    )
    p.add_argument(
        "--out", type=Path, required=True, metavar="REPORTDIR", help="folder for report.json, report.html, tb/"
    )
    p.add_argument(
        "--gate", type=Path, metavar="GATE.yaml", help="gate file committed by the team (overrides thresholds)"
    )
    p.add_argument(
        "--allow-unverifiable", action="store_true", help="exit 0 when the only problem is unverifiable episodes"
    )
    p.add_argument(
        "--checked-policy",
        choices=("auto", "logs", "other"),
        default="auto",
        help="which policy chose the checked commands: logs (the real logs' own controller), other (another "
        "policy: gap rows the policy moves and divergence are then unverifiable, not failed), or auto (default: "
        "the policy-shift test decides; it is approximate where the real commands depend on the states)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the latent draws and resampling (default 0)")
    p.add_argument("--no-tensorboard", action="store_true", help="skip the TensorBoard run of the check")
    p.add_argument(
        "--clip-model",
        type=Path,
        metavar="DIR",
        help="local CLIP weights (transformers CLIPVisionModelWithProjection folder, or an open_clip "
        "checkpoint); adds CLIP cosine distances to the visual gap. Nothing is downloaded. "
        "Needs pip install 'wmcheck[clip]'",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import wmcheck
    from wmcheck.checks.config import Gate
    from wmcheck.datasets.errors import UserError
    from wmcheck.scripts.config_args import env_kwargs_arg

    if args.rollouts is None and not (args.env or args.policy or args.success):
        raise UserError("nothing to check", "pass --rollouts SIM.h5, or --env ID [--policy P] to record rollouts")
    report = wmcheck.check(
        args.run_dir,
        args.out,
        rollouts=None if args.env else args.rollouts,  # --env records the rollouts to check
        env=args.env,
        policy=args.policy,
        success=args.success,
        episodes=args.episodes,
        max_steps=args.max_steps,
        env_kwargs=env_kwargs_arg(args.env_kwargs),
        render=args.render,
        gate=Gate.load(args.gate) if args.gate else Gate(),
        allow_unverifiable=args.allow_unverifiable,
        seed=args.seed,
        policy_samples=args.policy_samples,
        clip_model=args.clip_model,
        checked_policy=args.checked_policy,
        tensorboard=not args.no_tensorboard,
        command="wmcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    )
    print(report.message)
    print(f"report: {report.paths['html']}\njson:   {report.paths['json']}")
    if "tensorboard" in report.paths:
        print(f"TensorBoard: tensorboard --logdir {report.paths['tensorboard']}")
    return report.exit_code
