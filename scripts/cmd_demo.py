"""`wmcheck demo`: the main job end to end, on the embedded real data or on a synthetic reality.

Default (scripts/demo_wind.py): the embedded La Haute Borne SCADA subset in, a world model
trained, the power-curve simulator's replay of held-out real periods and a yaw/pitch policy
checked, reports and TensorBoard written. `--synthetic` (scripts/demo_synthetic.py): a MuJoCo
"reality" with known injected gaps, so the report can be compared with the truth.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole job: real wind-turbine logs, a world model, a simulator and a policy checked",
        description=(
            "Run wmcheck end to end. Default: on the embedded real data (one La Haute Borne turbine, "
            "March-June 2014, 10-minute SCADA; source: ENGIE, La Haute Borne open data): import and "
            "validate it, train a small world model on a CPU, check the power-curve simulator's replay of "
            "held-out real periods and a yaw/pitch rule policy run in that simulator, and write "
            "report.html / report.json / TensorBoard for each. --synthetic: the same on a MuJoCo system "
            "whose 'reality' has known gaps, so the findings can be compared with the truth. Exit code "
            "0 when the demo ran, whatever the checks found (a found gap is its result; each check's own "
            "verdict and exit code are in its report.json and in the last line), 2 on bad input. Takes a "
            "few minutes on a 2-core CPU."
        ),
    )
    p.add_argument("--out", type=Path, default=Path("wmcheck-demo"), help="output folder (default ./wmcheck-demo)")
    p.add_argument(
        "--synthetic", action="store_true", help="MuJoCo system with known injected gaps instead of the wind data"
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="training steps (default 1000 for the wind data, 1500 for --synthetic)",
    )
    p.add_argument("--preset", default="debug", help="world-model preset (default debug)")
    p.add_argument("--episodes", type=int, default=None, help="--synthetic: episodes per log (default 12)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.synthetic:
        from wmcheck.scripts.demo_synthetic import run_synthetic_demo

        return run_synthetic_demo(
            args.out, args.max_steps or 1500, args.preset, args.episodes or 12, progress=not args.no_progress
        )
    from wmcheck.scripts.demo_wind import run_wind_demo

    return run_wind_demo(args.out, args.max_steps or 1000, args.preset, progress=not args.no_progress)
