"""The `wmcheck` command line: one subcommand per module in `wmcheck.scripts.cmd_*`.

Each subcommand module defines `register(subparsers)` which adds its parser and sets
`func=run` where `run(args) -> int` returns the exit code. Bad input raises `UserError` and
becomes a one-paragraph message with exit code 2, never a traceback; an unexpected exception is
a bug in wmcheck: one line, exit 4, the traceback in a log file beside the output (exit codes:
datasets/errors.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from wmcheck.datasets.errors import INTERNAL_ERROR, Interrupted, UserError, first_line, out_of_space
from wmcheck.datasets.version import version

# Subcommand modules, in the order `wmcheck --help` lists them. A module that is not there yet
# (a later issue) is skipped, so the CLI always starts.
SUBCOMMANDS = [
    "cmd_import",
    "cmd_export",
    "cmd_validate",
    "cmd_record",
    "cmd_train",
    "cmd_calibrate",
    "cmd_check",
    "cmd_monitor",
    "cmd_shadow",
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
    refuse_writes_instead_of_dying()
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"wmcheck {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"wmcheck {args.command}: stopped: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"wmcheck {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed by the reader (`| head`): not a bug; the outputs are written
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that Python's own flush at exit does not raise again
        return 141  # 128 + SIGPIPE, as a shell reports it
    except Exception as exc:
        if out_of_space(exc):  # the outputs were being written under temporary names: none is left half-written
            print(
                f"wmcheck {args.command}: error: could not write the output: {first_line(exc)}\n"
                "  fix: free disk space (or raise the file-size limit, `ulimit -f`) and run the command again; "
                "outputs are written under temporary names and renamed, so no file under its final name is partial",
                file=sys.stderr,
            )
            return 2
        # a bug in wmcheck: one line here, the traceback in a file
        log = crash_log(args, traceback.format_exc())
        print(
            f"wmcheck {args.command}: internal error (a bug in wmcheck, not in your data): "
            f"{first_line(exc)}; "
            f"traceback written to {log}",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


def refuse_writes_instead_of_dying() -> None:
    """When a write hits the file-size limit the kernel sends SIGXFSZ, which kills the process
    before any cleanup (temporary files stay behind). Ignored, the write fails with EFBIG and the
    error reaches `main`. Writes HDF5 refuses while freeing its objects surface as "unraisable"
    exceptions, one per object (thousands of tracebacks for one full disk): those are dropped,
    because the write that failed first has raised already."""
    if hasattr(signal, "SIGXFSZ"):
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        except ValueError:  # not the main thread (main called from a library thread): leave it
            pass
    default = sys.unraisablehook
    if getattr(default, "drops_out_of_space", False):  # installed by an earlier main() in this process
        return

    def hook(unraisable):
        if unraisable.exc_value is not None and out_of_space(unraisable.exc_value):
            return
        default(unraisable)

    hook.drops_out_of_space = True
    sys.unraisablehook = hook


def crash_log(args: argparse.Namespace, text: str) -> Path:
    """Write the traceback beside the command's output (its --out folder, or that path's folder),
    else in the temporary directory; returns the file."""
    out = getattr(args, "out", None)
    folder = None
    if out is not None:
        out = Path(out)
        folder = out if out.is_dir() else (out.parent if out.parent.is_dir() else None)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for where in [folder, Path(tempfile.gettempdir())]:
        if where is None:
            continue
        path = where / f"wmcheck-crash-{args.command}-{stamp}-{os.getpid()}.log"
        try:
            path.write_text(f"wmcheck {version()} {' '.join(sys.argv)}\n\n{text}")
            return path
        except OSError:
            continue
    return Path("(not written: no writable folder)")


if __name__ == "__main__":
    sys.exit(main())
