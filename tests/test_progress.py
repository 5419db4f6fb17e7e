"""Progress display: a redrawn bar on a terminal, sparse lines in logs, nothing for quick loops."""

from __future__ import annotations

import io

from wmcheck.datasets import progress as pg


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _run(stream, steps: int, dt: float) -> str:
    clock = Clock()
    with pg.Progress(steps, "work", stream, clock=clock) as p:
        for _ in range(steps):
            clock.t += dt
            p.update()
    return stream.getvalue()


def test_quick_loops_show_nothing():
    assert _run(io.StringIO(), 50, 0.01) == "" and _run(FakeTTY(), 50, 0.01) == ""


def test_log_lines_are_sparse_and_end_with_the_total():
    # 1,000 steps of 1 s: lines at 10 s, then every 30 s, and the end: ~34 lines, not 1,000
    text = _run(io.StringIO(), 1000, 1.0)
    lines = text.splitlines()
    assert "\r" not in text and 30 <= len(lines) <= 36, len(lines)
    assert lines[0].startswith("work [") and "10/1000" in lines[0]
    assert lines[-1].endswith("1000/1000 1000 s") and "#" * pg.BAR_WIDTH in lines[-1]


def test_terminal_bar_redraws_in_place():
    text = _run(FakeTTY(), 100, 0.5)
    assert text.count("\n") == 1 and text.endswith("100/100 50 s\n")
    assert text.count("\r") > 10  # redrawn, at most ten times a second


def test_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("WMCHECK_PROGRESS", "0")
    assert _run(io.StringIO(), 1000, 1.0) == ""


def test_progress_wraps_an_iterable_and_closes_on_break():
    stream = FakeTTY()
    seen = []
    for x in pg.progress(iter(range(10)), 10, "it", stream):
        seen.append(x)
        if x == 3:
            break
    assert seen == [0, 1, 2, 3]
