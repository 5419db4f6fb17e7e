"""`wmcheck export LOG.h5 --minari DATASET_ID [--out ROOT]`: a log as a Minari dataset.

Writes `<ROOT>/<DATASET_ID>/data/{metadata.json,main_data.hdf5}` in Minari's layout (see
wmcheck.datasets.minari_export), readable by `minari.load_dataset(DATASET_ID)`; Minari need not be
installed. Bad input (a missing log, a malformed id, an existing dataset without --force) is a
UserError (exit 2) and nothing is left under the dataset's name.
"""

from __future__ import annotations

import argparse

from wmcheck.datasets.errors import UserError
from wmcheck.scripts.config_args import env_kwargs_arg


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a log as a Minari dataset (minari.load_dataset reads it)",
        description=(
            "Export a wmcheck log (from `wmcheck record` or `wmcheck import`) as a Minari dataset: "
            "ROOT/DATASET_ID/data/metadata.json (observation and action spaces as Minari serialises "
            "them, the env_spec when the environment is known, episode and step counts) and "
            "ROOT/DATASET_ID/data/main_data.hdf5 (one group per episode). The log's inputs, "
            "timestamps and other per-episode arrays Minari does not know are kept as extra "
            "datasets of each episode group. Minari need not be installed."
        ),
        epilog="example: wmcheck export pendulum.h5 --minari wmcheck/pendulum-v0 --env Pendulum-v1",
    )
    p.add_argument("log", metavar="LOG.h5", help="the log to export (a Minari dataset folder or id works too)")
    p.add_argument(
        "--minari",
        required=True,
        metavar="DATASET_ID",
        help="the Minari dataset id to write, [namespace/]name-vN, e.g. wmcheck/pendulum-real-v0",
    )
    p.add_argument(
        "--out",
        metavar="ROOT",
        help="the Minari datasets root to write into (default: Minari's own, $MINARI_DATASETS_PATH "
        "or ~/.minari/datasets)",
    )
    p.add_argument(
        "--env",
        metavar="ENV",
        help="the registered gymnasium id the log was recorded from (or whose twin it is): its "
        "spaces and env_spec go into the dataset (default: the log's env_id attribute, else the "
        "env_spec of a Minari source, else none: unbounded Box spaces of the log's widths)",
    )
    p.add_argument("--env-kwargs", metavar="JSON", help="keyword arguments the env was made with, e.g. '{\"g\": 9.81}'")
    p.add_argument("--force", action="store_true", help="replace an existing dataset of that id")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.datasets.minari_export import export_minari

    kwargs = env_kwargs_arg(args.env_kwargs)
    if kwargs is not None and args.env is None:
        raise UserError("--env-kwargs needs --env", "name the environment the kwargs belong to")
    r = export_minari(args.log, args.minari, root=args.out, env=args.env, env_kwargs=kwargs, force=args.force)
    for note in r.notes:
        print(f"note: {note}")
    spec = f", env_spec {r.env_id}" if r.env_id else ", no env_spec"
    print(f"wrote Minari dataset {r.dataset_id} to {r.path}: {r.episodes} episode(s), {r.steps:,} steps{spec}")
    from wmcheck.datasets.importers.minari_source import minari_root

    where = "" if r.root.resolve() == minari_root().resolve() else f"MINARI_DATASETS_PATH={r.root} "
    print(f"load it with: {where}python -c \"import minari; print(minari.load_dataset('{r.dataset_id}'))\"")
    return 0
