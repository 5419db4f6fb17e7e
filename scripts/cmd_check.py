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
            "1 fail (divergent, or unverifiable unless --allow-unverifiable), 2 bad input."
        ),
        epilog="gate file keys: alpha, score_alpha{score: p}, tolerances{gap: {...}}, allow_unverifiable, policy{min_episodes, min_success_rate}",
    )
    p.add_argument("run_dir", type=Path, metavar="RUNDIR", help="run directory with model.pt and calibration")
    p.add_argument("--rollouts", type=Path, metavar="SIM.h5", help="log of simulator rollouts / policy trajectories to check")
    p.add_argument("--env", help="gymnasium env id (or module:Class) to record rollouts from, with --policy")
    p.add_argument("--policy", help="policy for --env: random, hold:K, module:callable or a TorchScript file")
    p.add_argument("--episodes", type=int, default=20, help="episodes to record with --env (default 20)")
    p.add_argument("--max-steps", type=int, default=None, help="step limit per recorded episode")
    p.add_argument("--env-kwargs", default=None, help="JSON keyword arguments for --env")
    p.add_argument("--render", metavar="WxH", help="with --env: also record camera frames (for models trained on frames)")
    p.add_argument("--out", type=Path, required=True, metavar="REPORTDIR", help="folder for report.json, report.html, tb/")
    p.add_argument("--gate", type=Path, metavar="GATE.yaml", help="gate file committed by the team (overrides thresholds)")
    p.add_argument("--allow-unverifiable", action="store_true", help="exit 0 when the only problem is unverifiable episodes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-tensorboard", action="store_true")
    p.add_argument("--clip-model", type=Path, metavar="DIR",
                   help="local CLIP weights (transformers CLIPVisionModelWithProjection folder, or an open_clip "
                        "checkpoint); adds CLIP cosine distances to the visual gap. Nothing is downloaded. "
                        "Needs pip install 'wmcheck[clip]'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from wmcheck.checks.check import run_check
    from wmcheck.checks.config import Gate
    from wmcheck.checks.report_write import write_outputs
    from wmcheck.scripts.errors import UserError

    gate = Gate.load(args.gate) if args.gate else Gate()
    if args.allow_unverifiable:
        gate.allow_unverifiable = True
    rollouts = args.rollouts
    if args.env:
        from wmcheck.datasets.record import parse_render_size, record_to_log

        rollouts = args.out / "rollouts.h5"
        kwargs = json.loads(args.env_kwargs) if args.env_kwargs else None
        record_to_log(rollouts, args.env, args.policy or "random", episodes=args.episodes, max_steps=args.max_steps,
                      seed=args.seed, env_kwargs=kwargs, source="policy" if args.policy else "sim",
                      render=parse_render_size(args.render) if args.render else None)
    if rollouts is None:
        raise UserError("nothing to check", "pass --rollouts SIM.h5, or --env ID [--policy P] to record rollouts")
    report = run_check(args.run_dir, rollouts, gate, command="wmcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:]), seed=args.seed,
                       clip_model=args.clip_model)
    paths = write_outputs(report, args.out, tensorboard=not args.no_tensorboard)
    print(report["summary"]["message"])
    print(f"report: {paths['html']}\njson:   {paths['json']}")
    if "tensorboard" in paths:
        print(f"TensorBoard: tensorboard --logdir {paths['tensorboard']}")
    return int(report["exit_code"])
