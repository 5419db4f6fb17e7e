"""`wmcheck monitor RUNDIR --real NEW.h5 --out DIR`: new real logs, period by period, against the model."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "monitor",
        help="monitor new real logs over time: has reality drifted from what the model learned?",
        description=(
            "Score new real episodes against the model and its calibration, period by period, and test each "
            "period (and the last few together) against the held-out real episodes with a false-alarm budget "
            "over repeated looks. Verdict per period: stable, drifted (retrain), off-support (states the logs "
            "never had), inconclusive (too few episodes). Run it again on the same --out with the next logs: "
            "the state lives there. Exit code: 0 every new period stable, 1 drifted or off-support, 3 only "
            "inconclusive, 2 bad input."
        ),
    )
    p.add_argument("run", type=Path, metavar="RUNDIR", help="a trained and calibrated run folder")
    p.add_argument("--real", type=Path, nargs="+", required=True, metavar="NEW.h5", help="new real log(s), in order")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the monitor's folder (state, reports, tb/)")
    p.add_argument(
        "--period",
        default="7d",
        help="a look per N episodes (e.g. 5) or per calendar period of the episodes' first timestamp "
        "(12h, 1d, 7d; UTC). Default 7d",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="false-alarm budget per cycle of --looks looks (0.05)")
    p.add_argument("--looks", type=int, default=52, help="looks the budget is spread over, then it starts again (52)")
    p.add_argument(
        "--windows",
        default="1,4",
        help="periods tested together at each look: this period alone and the last W (default 1,4)",
    )
    p.add_argument(
        "--baseline",
        type=int,
        default=4,
        help="the first B periods, once tested, join the held-out real episodes as the reference (default 4; 0: "
        "calibration only)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the latent draws and resampling (default 0; one of the folder's settings)",
    )
    p.add_argument("--no-tensorboard", action="store_true", help="skip the TensorBoard scalars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.checks.monitor import MonitorSettings, monitor
    from wmcheck.checks.monitor_report import write_monitor_outputs
    from wmcheck.datasets.errors import UserError

    try:
        windows = tuple(sorted({int(w) for w in str(args.windows).split(",") if w.strip()}))
        settings = MonitorSettings(
            args.period, float(args.alpha), int(args.looks), windows, int(args.baseline), int(args.seed)
        )
        if settings.baseline < 0:
            raise ValueError("--baseline must be >= 0")
        settings.plan()
    except ValueError as exc:
        raise UserError(f"bad monitor settings: {exc}", "e.g. --alpha 0.05 --looks 52 --windows 1,4") from None
    for log in args.real:
        if log.resolve() == args.out.resolve():
            raise UserError(f"--out {args.out} is one of the --real logs", "give the monitor its own folder")
    command = "wmcheck " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = monitor(args.run, args.real, args.out, settings, command)
    paths = write_monitor_outputs(report, args.out, tensorboard=not args.no_tensorboard)
    print(report["message"])
    print(f"{report['guarantee']}\nwrote {paths['json']} and {paths['html']}")
    return int(report["exit_code"])
