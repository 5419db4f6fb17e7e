"""wmcheck's Python API: the steps of the command line, for scripts, notebooks and CI jobs.

    import wmcheck

    result = wmcheck.train("real.h5", "runs/pendulum", max_steps=3000)   # trains and calibrates
    report = wmcheck.check("runs/pendulum", "reports/sim", rollouts="sim.h5")
    report.verdict, report.exit_code, report.top_gap, report.gaps["latency"].status
    report = wmcheck.check("runs/pendulum", "reports/ppo", env=gymnasium.make("Pendulum-v1"),
                           policy=sb3_model, episodes=200)
    same = wmcheck.load_report("reports/sim/report.json")

The command line calls these same functions (`wmcheck.scripts.cmd_*`), so a script and a CI job
get the same verdicts. Bad input raises `wmcheck.UserError` (the CLI's exit code 2), with the
problem and the fix in its message. Importing `wmcheck` is cheap: torch and Lightning load on the
first call that needs them.
"""

from __future__ import annotations

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.version import version as _version

__version__ = _version()
__all__ = ["__version__", "train", "calibrate", "check", "load_report", "Report", "GapRow", "UserError"]

_LAZY = {
    "train": "wmcheck.steps",
    "calibrate": "wmcheck.steps",
    "check": "wmcheck.steps",
    "load_report": "wmcheck.report",
    "Report": "wmcheck.report",
    "GapRow": "wmcheck.report",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'wmcheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
