"""`wmcheck import SRC --out LOG.h5 ...`: turn user data (CSV, Parquet, npz, Minari HDF5) into a log.

Column roles and cleaning rules come from `--mapping FILE` (YAML/JSON, the `ImportMapping` fields)
with flags overriding it. Prints the import summary. Any bad input is a UserError (exit 2) and no
output file is left behind.
"""

from __future__ import annotations

import argparse

from wmcheck.datasets.episode import SOURCES
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers import CopyOptions, build_mapping, import_to_log, needs_mapping, source_kind
from wmcheck.datasets.importers.mapping import STEP_VALUES, parse_assignments, parse_ranges, parse_sentinels

TABLE_ONLY = (
    "mapping",
    "time_col",
    "episode_col",
    "max_interp_gap",
    "split_gap",
    "min_episode_steps",
    "max_episode_steps",
    "resample",
    "step_values",
    "timezone",
    "delimiter",
    "valid_range",
    "sentinel",
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="turn a CSV/Parquet/npz table or a Minari HDF5 file into a wmcheck log",
        description=(
            "Import user data into a wmcheck log (HDF5). Tables (CSV, .csv.gz, Parquet, npz of "
            "columns) need a mapping: which columns are the time, the machine, the observations, "
            "the actions (chosen commands) and the inputs (measured disturbances). Timestamps may "
            "be ISO 8601 with any UTC offset or numeric seconds; rows are sorted per machine, put on "
            "the dt grid, values outside valid ranges or equal to sentinel codes become missing, "
            "gaps of up to --max-interp-gap steps are interpolated and longer ones split the "
            "episode. Minari main_data.hdf5 files and log-layout npz files are copied as they are, "
            "with --source/--dt/--obs-cols/... setting the attributes they lack. A summary of "
            "what was read, repaired and dropped is printed. Flags override the mapping file."
        ),
        epilog="example: wmcheck import scada.csv.gz --out logs.h5 --mapping scada.yaml --dt 600",
    )
    p.add_argument("src", metavar="SRC", help="input file: .csv, .csv.gz, .parquet, .npz, .hdf5/.h5")
    p.add_argument("--out", required=True, metavar="LOG.h5", help="the log file to write")
    p.add_argument("--mapping", metavar="FILE", help="YAML or JSON file with ImportMapping fields")
    p.add_argument("--time-col", help="timestamp column (ISO 8601 or numeric seconds)")
    p.add_argument("--episode-col", help="machine/run column; each value becomes its own episode(s)")
    p.add_argument("--obs-cols", help="observation columns, comma-separated (names, for HDF5/npz logs)")
    p.add_argument("--action-cols", help="action (command) columns, comma-separated")
    p.add_argument("--input-cols", help="exogenous input columns, comma-separated")
    p.add_argument("--source", choices=SOURCES, help="what produced the data (tables default to real)")
    p.add_argument("--dt", type=float, help="step period in seconds (default: the median time step)")
    p.add_argument(
        "--max-interp-gap",
        type=int,
        metavar="N",
        help="interpolate gaps of up to N missing steps; longer gaps split (default 3)",
    )
    p.add_argument(
        "--split-gap",
        type=float,
        metavar="SECONDS",
        help="always split where consecutive rows are further apart than this",
    )
    p.add_argument("--min-episode-steps", type=int, metavar="N", help="drop pieces shorter than N steps (default 10)")
    p.add_argument(
        "--max-episode-steps",
        type=int,
        metavar="N",
        help="cut long pieces into episodes of at most N steps (e.g. 1008: weeks of 10-minute data)",
    )
    p.add_argument(
        "--resample",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="interpolate every column onto the dt grid (irregular loggers) instead of snapping rows "
        "(default: the mapping's, else no)",
    )
    p.add_argument(
        "--step-values",
        choices=STEP_VALUES,
        help="actions/inputs of step t from row t (start, sampled commands) or row t+1 (end, interval averages) "
        "(default: the mapping's, else start)",
    )
    p.add_argument("--timezone", help="IANA zone for timestamps without a UTC offset (default UTC)")
    p.add_argument("--delimiter", help="CSV delimiter (default: detected)")
    p.add_argument(
        "--valid-range",
        action="append",
        metavar="COL=LO:HI",
        help="values outside [LO, HI] become missing (repeatable; a side may be empty)",
    )
    p.add_argument(
        "--sentinel",
        action="append",
        metavar="COL=VALUE",
        help="a fault/placeholder code that becomes missing (repeatable)",
    )
    p.add_argument("--units", action="append", metavar="COL=UNIT", help="unit of a channel (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kind = source_kind(args.src)
    units = parse_assignments(args.units, "--units", "P_avg=kW") or None
    if needs_mapping(kind):
        mapping = build_mapping(
            args.mapping,
            time_col=args.time_col,
            episode_col=args.episode_col,
            obs_cols=args.obs_cols,
            action_cols=args.action_cols,
            input_cols=args.input_cols,
            source=args.source,
            dt=args.dt,
            max_interp_gap=args.max_interp_gap,
            split_gap=args.split_gap,
            min_episode_steps=args.min_episode_steps,
            max_episode_steps=args.max_episode_steps,
            resample=args.resample,
            step_values=args.step_values,
            timezone=args.timezone,
            delimiter=args.delimiter,
            units=units,
            valid_ranges=parse_ranges(args.valid_range) or None,
            sentinels=parse_sentinels(args.sentinel) or None,
        )
        summary = import_to_log(args.src, args.out, mapping=mapping)
    else:
        given = [f"--{k.replace('_', '-')}" for k in TABLE_ONLY if getattr(args, k) is not None]
        if given:
            raise UserError(
                f"{', '.join(given)} only apply to tables; {args.src} is already in log layout",
                "for HDF5 and log-layout npz give only --source, --dt, --obs-cols, "
                "--action-cols, --input-cols (channel names) and --units",
            )
        options = CopyOptions(
            source=args.source,
            dt=args.dt,
            observation_names=args.obs_cols,
            action_names=args.action_cols,
            input_names=args.input_cols,
            units=units or {},
        )
        summary = import_to_log(args.src, args.out, options=options)
    print(summary.format_text())
    print(f"wrote {args.out}: {summary.episodes_produced} episode(s), {summary.steps_produced:,} steps")
    return 0
