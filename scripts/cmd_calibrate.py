"""`wmcheck calibrate RUNDIR [LOG.h5]`: thresholds, competence bounds and power on held-out real episodes."""

from __future__ import annotations

import argparse
from pathlib import Path

CHECK_OPTIONS = ["alpha", "context", "horizon", "max_delay", "attribution"]
"""The CheckConfig fields `calibrate` and `train` expose (defaults and help from the dataclass)."""


def add_check_geometry(p) -> None:
    from wmcheck.checks.config import CheckConfig
    from wmcheck.scripts.config_args import add_options

    add_options(p, CheckConfig, CHECK_OPTIONS)


def check_config(args: argparse.Namespace, command: str):
    """The CheckConfig of the parsed options; a bad value is a UserError (exit 2)."""
    from wmcheck.checks.config import CheckConfig
    from wmcheck.datasets.errors import UserError
    from wmcheck.scripts.config_args import config_kwargs

    try:
        return CheckConfig(**config_kwargs(args, CHECK_OPTIONS))
    except ValueError as exc:
        raise UserError(f"bad calibration option: {exc}", f"see `wmcheck {command} --help`") from None


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
    p.add_argument(
        "log",
        type=Path,
        nargs="?",
        metavar="LOG.h5",
        help="the training log (default: the one recorded in RUNDIR/data.json)",
    )
    p.add_argument(
        "--real",
        type=Path,
        action="append",
        default=[],
        metavar="EXTRA.h5",
        help="a real log the model never trained on, calibrated on with the held-out split (repeatable); "
        "more held-out real episodes make sharper thresholds and more power",
    )
    add_check_geometry(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import wmcheck
    from wmcheck.scripts.config_args import config_kwargs

    check_config(args, "calibrate")  # the option's own error message (`see wmcheck calibrate --help`)
    wmcheck.calibrate(args.run_dir, args.log, real=args.real, **config_kwargs(args, CHECK_OPTIONS))
    return 0
