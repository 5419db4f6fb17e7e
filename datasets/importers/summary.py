"""What an import did, in numbers: `ImportSummary` (printed by `wmcheck import`) and `ImportResult`.

Every cleaning step counts what it touched so that a user can see how much of their data was
kept, repaired or thrown away, per column and per reason.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

from wmcheck.datasets.episode import Episode, LogMeta


@dataclass
class ImportSummary:
    """Counts from one import. Per-column dicts are keyed by column name."""

    source_path: str = ""
    rows_read: int = 0
    machines: list[str] = field(default_factory=list)
    """Distinct values of the episode column, in order of first appearance."""
    missing_in_source: dict[str, int] = field(default_factory=dict)
    """Empty / NaN / NA cells as read."""
    out_of_range: dict[str, int] = field(default_factory=dict)
    """Values outside the column's valid range, set to missing."""
    sentinel_hits: dict[str, int] = field(default_factory=dict)
    """Values equal to a sentinel code, set to missing."""
    duplicate_conflicts: dict[str, int] = field(default_factory=dict)
    """Time steps where duplicate rows disagreed on the column's value, set to missing."""
    interpolated: dict[str, int] = field(default_factory=dict)
    """Missing values filled by linear interpolation (short gaps)."""
    duplicate_rows: int = 0
    """Rows merged into another row of their machine at the same time step."""
    missing_rows: int = 0
    """Time steps inside a machine's time span with no row at all."""
    max_snap_seconds: float = 0.0
    """Largest shift of a timestamp onto the dt grid (snap mode)."""
    splits_time_gap: int = 0
    """Episode splits because two consecutive rows were more than `split_gap` apart."""
    splits_missing: int = 0
    """Episode splits at runs of missing values longer than `max_interp_gap` steps."""
    length_cuts: int = 0
    """Cuts of long pieces into episodes of at most `max_episode_steps` steps."""
    episodes_produced: int = 0
    steps_produced: int = 0
    episodes_dropped: int = 0
    """Pieces shorter than `min_episode_steps`."""
    rows_dropped: int = 0
    """Grid rows not in any produced episode (unrecoverable gaps and dropped pieces)."""
    time_start: float | None = None
    """First produced timestamp, UTC epoch seconds."""
    time_end: float | None = None
    dt: float | None = None
    dt_inferred: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def missing_per_column(self) -> dict[str, int]:
        """Values treated as missing per column: empty in the source + out of range + sentinel
        + conflicting duplicates."""
        parts = (self.missing_in_source, self.out_of_range, self.sentinel_hits, self.duplicate_conflicts)
        cols = dict.fromkeys(c for d in parts for c in d)
        return {c: sum(d.get(c, 0) for d in parts) for c in cols}

    @property
    def values_missing(self) -> int:
        return sum(self.missing_per_column.values())

    @property
    def values_interpolated(self) -> int:
        return sum(self.interpolated.values())

    @property
    def split_points(self) -> int:
        return self.splits_time_gap + self.splits_missing

    def format_text(self) -> str:
        lines = [f"import summary: {self.source_path}" if self.source_path else "import summary"]
        machines = f" from {len(self.machines)} machine(s): {', '.join(self.machines)}" if self.machines else ""
        lines.append(f"  rows read        {self.rows_read:,}{machines}")
        if self.dt is not None:
            how = "inferred as the median step" if self.dt_inferred else "given"
            lines.append(f"  dt               {self.dt:g} s ({how})")
        if self.time_start is not None:
            lines.append(f"  time range (UTC) {_iso(self.time_start)} .. {_iso(self.time_end)}")
        if self.duplicate_rows:
            lines.append(
                f"  duplicate rows   {self.duplicate_rows:,} merged into the row at the same time step "
                "(values they disagree on become missing)"
            )
        if self.missing_rows:
            lines.append(f"  missing rows     {self.missing_rows:,} time steps with no row")
        if self.max_snap_seconds > 1e-6 * (self.dt or 1.0):
            lines.append(f"  snapped to grid  timestamps moved by up to {self.max_snap_seconds:g} s")
        cols = self.missing_per_column
        if any(cols.values()) or any(self.interpolated.values()):
            lines.append(
                "  values treated as missing, per column "
                "(empty + out of range + sentinel + duplicate conflict) / interpolated:"
            )
            width = max(len(c) for c in [*cols, *self.interpolated])
            for c in dict.fromkeys([*cols, *self.interpolated]):
                parts = " + ".join(
                    f"{d.get(c, 0):,}"
                    for d in (self.missing_in_source, self.out_of_range, self.sentinel_hits, self.duplicate_conflicts)
                )
                lines.append(
                    f"    {c:<{width}}  {cols.get(c, 0):>8,}  ({parts})  interpolated {self.interpolated.get(c, 0):,}"
                )
        lines.append(f"  values missing   {self.values_missing:,} in total, {self.values_interpolated:,} interpolated")
        lines.append(
            f"  split points     {self.split_points:,} ({self.splits_time_gap:,} time gaps, "
            f"{self.splits_missing:,} runs of missing values)"
        )
        lines.append(
            f"  episodes         {self.episodes_produced:,} produced ({self.steps_produced:,} steps), "
            f"{self.episodes_dropped:,} dropped as too short"
        )
        if self.length_cuts:
            lines.append(
                f"  length cuts      {self.length_cuts:,} (long pieces cut into episodes of at most max_episode_steps)"
            )
        if self.rows_dropped:
            lines.append(f"  rows dropped     {self.rows_dropped:,} (in unrecoverable gaps or dropped pieces)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _iso(t: float | None) -> str:
    if t is None:
        return "?"
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ImportResult:
    """Episodes and file metadata ready for `write_log`, with the summary of how they were made."""

    episodes: list[Episode]
    meta: LogMeta
    summary: ImportSummary
