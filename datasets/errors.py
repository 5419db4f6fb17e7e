"""User-facing errors: one exception type that the CLI turns into a paragraph and exit code 2.

Raise `UserError(problem, fix)` anywhere bad input is detected (missing file, wrong column,
truncated HDF5, ...). The CLI prints `error: <problem>\n  fix: <fix>` and exits 2 with no
traceback. Library callers get an ordinary exception they can catch. It lives in the lowest layer
(datasets) so that every package can raise it without importing the CLI.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or usage: names the problem and how to fix it."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return self.problem if not self.fix else f"{self.problem}\n  fix: {self.fix}"
