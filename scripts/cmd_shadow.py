"""`wmcheck shadow RUNDIR --log SHADOW.h5 --out DIR`: the candidate policy's logged proposals through the model."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "shadow",
        help="shadow mode: what would the candidate policy's proposals have done where the baseline acted?",
        description=(
            "A shadow log holds episodes where a baseline controller acted and the candidate policy's proposals "
            "were logged beside it (`wmcheck record ENV --policy BASELINE --shadow CANDIDATE`, or "
            "`proposed_actions` written by your own logger). From every logged state, the world model imagines "
            "both: the baseline's commands and the proposals, and compares predicted returns, where the "
            "proposals lead, and where they leave the model's competence. Exit code: 0 better or no different, "
            "1 predicted worse, 3 unverifiable, 2 bad input."
        ),
    )
    p.add_argument("run", type=Path, metavar="RUNDIR", help="a trained and calibrated run folder")
    p.add_argument("--log", type=Path, required=True, metavar="SHADOW.h5", help="the shadow log")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for shadow.json and shadow.html")
    p.add_argument(
        "--horizon",
        type=int,
        default=8,
        help="imagined steps per start (default 8: the proposals were made on the baseline's states, so a long "
        "open-loop replay says less about following them)",
    )
    p.add_argument("--stride", type=int, help="steps between starts (default: the horizon)")
    p.add_argument("--samples", type=int, default=8, help="latent draws per branch and start (8)")
    p.add_argument(
        "--objective",
        metavar="CHANNEL",
        help="compare the sum of this observation channel instead of rewards (e.g. P_avg for energy; -NAME to "
        "minimise it); default: the log's rewards through the model's reward head",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the latent draws (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.checks.shadow import ShadowConfig, shadow_report
    from wmcheck.checks.shadow_html import write_shadow_outputs
    from wmcheck.datasets.errors import UserError

    for name in ("horizon", "stride", "samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} must be >= 1, got {value}")
    cfg = ShadowConfig(args.horizon, args.stride, args.samples, seed=args.seed, objective=args.objective)
    command = "wmcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = shadow_report(args.run, args.log, cfg, command)
    paths = write_shadow_outputs(report, args.out)
    print(report["message"])
    print(f"wrote {paths['json']} and {paths['html']}")
    return int(report["exit_code"])
