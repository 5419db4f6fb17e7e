"""`wmcheck calibrate RUNDIR [LOG.h5]`: thresholds, competence bounds and power on held-out real episodes."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_check_geometry(p) -> None:
    p.add_argument("--alpha", type=float, default=0.05, help="false-alarm budget per checked run (default 0.05)")
    p.add_argument("--context", type=int, default=16, help="steps observed before imagining (default 16)")
    p.add_argument("--horizon", type=int, default=48, help="steps imagined per block (default 48)")
    p.add_argument("--max-delay", type=int, default=4, help="latency search range in steps (default 4)")


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="calibrate check thresholds on the model's held-out real episodes",
        description=(
            "Score the held-out real episodes of RUNDIR's model (its validation split, never trained on) "
            "block by block and store the null distributions every check compares against, the "
            "competence bounds (latent support, ensemble disagreement) and the power table (the "
            "smallest injected latency / actuator / sensor gap the model detects). Writes "
            "RUNDIR/calibration.json and calibration.npz. `wmcheck train` runs it at the end."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUNDIR", help="a run directory written by `wmcheck train`")
    p.add_argument("log", type=Path, nargs="?", metavar="LOG.h5", help="the training log (default: the one recorded in RUNDIR/data.json)")
    add_check_geometry(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.config import CheckConfig
    from wmcheck.scripts.errors import UserError

    try:
        cfg = CheckConfig(alpha=args.alpha, context=args.context, horizon=args.horizon, max_delay=args.max_delay)
    except ValueError as exc:
        raise UserError(f"bad calibration option: {exc}", "see `wmcheck calibrate --help`") from None
    calibrate(args.run_dir, args.log, cfg)
    return 0
