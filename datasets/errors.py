"""User-facing errors and the exit codes the CLI gives them.

Exit codes of every command: 0 success (a check: pass), 1 a check found a gap (fail or
unverifiable), 2 bad input or usage (`UserError`), 3 a check is inconclusive, 4 an internal error
(a bug in wmcheck: one line, the traceback in a log file), 130 / 143 stopped by SIGINT / SIGTERM
(`Interrupted`: what was saved and how to resume), 141 standard output closed by its reader (e.g.
`| head`; the files were written). `wmcheck monitor`: 1 drifted or off-support; `wmcheck shadow`:
1 the proposals are predicted worse, 3 unverifiable. A write refused for lack of space (a full
disk, a quota, the file-size limit: `out_of_space`) exits 2 like bad input, with nothing partial
under a final name.


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


INTERNAL_ERROR = 4
"""The exit code of an unexpected exception (a bug in wmcheck), distinct from a check's 1."""


class Interrupted(Exception):
    """A run stopped by a signal: says where it stopped and how to resume; exit 130 (SIGINT) or 143 (SIGTERM)."""

    def __init__(self, problem: str, fix: str = "", exit_code: int = 130):
        super().__init__(problem)
        self.problem, self.fix, self.exit_code = problem, fix, exit_code

    def __str__(self) -> str:
        return self.problem if not self.fix else f"{self.problem}\n  fix: {self.fix}"


# What a failed write says when the disk is full, a quota is reached or the file-size limit
# (`ulimit -f`) is hit: the OS error numbers, and the words HDF5 and PyTorch put in their own
# exceptions (they do not carry the errno; HDF5's message names it as "errno = 28").
def first_line(exc: BaseException) -> str:
    """An exception as one short line for a message: its type and the first line of its text."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


_NO_SPACE_ERRNOS = {28, 27, 122}  # ENOSPC, EFBIG, EDQUOT (Linux)
_NO_SPACE_WORDS = (
    "no space left on device",
    "file too large",
    "disk quota exceeded",
    "errno = 28",
    "errno = 27",
    "errno = 122",
    "file write failed",  # PyTorch's checkpoint writer (and HDF5's) when the OS refuses a write
)


def out_of_space(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it was raised from) is a write refused for lack of space:
    a full disk, a quota, or the process's file-size limit."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS:
            return True
        if any(w in str(exc).lower() for w in _NO_SPACE_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
