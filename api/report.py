"""The check's result as Python objects: `Report` (verdict, exit code, message, gap rows, episodes)
read from the report.json that `wmcheck check` writes (schema: checks/schema/report.schema.json).

Owns only the reading: every field comes from the JSON, nothing is recomputed, so `load_report`
on a saved report and the `Report` returned by `wmcheck.check` are equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from wmcheck.datasets.errors import UserError


@dataclass(frozen=True)
class GapRow:
    """One row of the gap table: a gap type, its status, the evidence and the estimate."""

    name: str
    status: str  # present | absent | tolerated | not_checked
    evidence: float | None  # statistic over its calibrated (1 - alpha) null quantile: >= 1 is present
    estimate: dict | None
    interval: list | None
    explanation: str
    next_step: str | None  # what to do next, for a present or tolerated gap

    @property
    def present(self) -> bool:
        return self.status == "present"


@dataclass(frozen=True)
class Report:
    """A check's report. `data` is the whole report.json; the fields are its headline."""

    verdict: str  # pass | fail | unverifiable | inconclusive
    exit_code: int  # 0 pass, 1 fail / unverifiable, 3 inconclusive (the CLI's codes)
    message: str
    top_gap: str
    score: float | None
    gaps: dict[str, GapRow]
    episodes: list[dict]
    data: dict = field(repr=False)
    paths: dict[str, Path] = field(default_factory=dict)  # json, html, tensorboard where written

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @classmethod
    def from_dict(cls, data: dict, paths: dict | None = None) -> Report:
        s = data["summary"]
        gaps = {
            name: GapRow(
                name,
                g["verdict"],
                g.get("evidence"),
                g.get("estimate"),
                g.get("ci"),
                g.get("explanation", ""),
                g.get("next_step"),
            )
            for name, g in data["gaps"].items()
        }
        return cls(
            verdict=data["verdict"],
            exit_code=int(data["exit_code"]),
            message=s["message"],
            top_gap=s["top_gap"],
            score=s.get("score"),
            gaps=gaps,
            episodes=list(data["episodes"]),
            data=data,
            paths={k: Path(v) for k, v in (paths or {}).items()},
        )


def load_report(path: str | Path) -> Report:
    """A `Report` from a report.json (or the folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise UserError(f"no report at {path}", "give a report.json written by `wmcheck check` or its folder")
    try:
        data = json.loads(path.read_text())
        html = path.with_name("report.html")
        return Report.from_dict(data, {"json": path, **({"html": html} if html.is_file() else {})})
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is not a wmcheck report ({type(exc).__name__}: {exc})",
            "give a report.json written by `wmcheck check`",
        ) from None
