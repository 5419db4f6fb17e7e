"""The `wmcheck` command line: one subcommand per module in `wmcheck.scripts.cmd_*`.

Each subcommand module defines `register(subparsers)` which adds its parser and sets
`func=run` where `run(args) -> int` returns the exit code. Bad input raises `UserError` and
becomes a one-paragraph message with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.version import version

# Subcommand modules, in the order `wmcheck --help` lists them. A module that is not there yet
# (a later issue) is skipped, so the CLI always starts.
SUBCOMMANDS = [
    "cmd_import",
    "cmd_validate",
    "cmd_record",
    "cmd_train",
    "cmd_calibrate",
    "cmd_check",
    "cmd_demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wmcheck",
        description=(
            "wmcheck learns a DreamerV3-style world model from real process logs and checks "
            "simulator rollouts and policies against it: where does the simulator diverge from "
            "reality, which kind of gap is it, and can the model even tell?"
        ),
        epilog="Run `wmcheck <command> --help` for each command's options.",
    )
    parser.add_argument("--version", action="store_true", help="print the wmcheck version and exit")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for PyTorch (default: $WMCHECK_THREADS, else PyTorch's default). Use 1 "
        "when other jobs share the cores: small recurrent models slow down badly when threads contend",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"wmcheck.scripts.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"wmcheck.scripts.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version())
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    threads = args.threads or (
        int(os.environ["WMCHECK_THREADS"]) if os.environ.get("WMCHECK_THREADS", "").isdigit() else None
    )
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"wmcheck {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"wmcheck {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
