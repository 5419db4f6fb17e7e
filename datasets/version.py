"""The installed wmcheck version (stamped into logs, checkpoints and reports)."""

from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version("wmcheck")
    except PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"
