"""`wmcheck validate LOG.h5 [--json]`: check a log against the format and summarise its channels.

Prints the summary and every finding (see wmcheck.datasets.validate for the list of checks). Exit
code 0 when there are no errors (warnings allowed), 2 when there are errors or the file cannot be
read at all.
"""

from __future__ import annotations

import argparse

from wmcheck.datasets.validate import report_json, validate_log


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check a log file against the log format and summarise its channels",
        description="Check a log (wmcheck HDF5 log format, or a Minari main_data.hdf5) and report "
        "every problem at once: missing datasets, row counts, NaN/inf values, timestamps, dimension "
        "and dtype mismatches between episodes; warn about irregular sampling, constant and "
        "saturated channels. Exit code 0 when there are no errors, 2 otherwise.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "log", metavar="LOG.h5", help="the log file to check, or a Minari dataset folder or id (local Minari root)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.datasets.errors import UserError
    from wmcheck.datasets.importers.minari_source import resolve_dataset

    try:
        report = validate_log(resolve_dataset(args.log))  # a Minari folder or id, as for `import`
    except UserError as exc:
        if not args.json:
            raise
        # --json promises JSON on stdout: a file that cannot be read at all is one error finding
        print(unreadable_json(args.log, exc))
        return exc.exit_code
    print(report_json(report) if args.json else report.format_text())
    return 0 if report.ok else 2


def unreadable_json(path, exc) -> str:
    """The --json report of a log that could not be opened: no summary, one error finding."""
    import json
    from dataclasses import asdict

    from wmcheck.datasets.validate import REPORT_VERSION, Finding

    finding = Finding("error", "unreadable", None, None, exc.problem + (f" (fix: {exc.fix})" if exc.fix else ""))
    return json.dumps(
        {
            "report_version": REPORT_VERSION,
            "path": str(path),
            "ok": False,
            "summary": None,
            "findings": [asdict(finding)],
        },
        indent=2,
    )
