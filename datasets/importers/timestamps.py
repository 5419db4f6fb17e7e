"""Timestamp columns to UTC epoch seconds: ISO 8601 strings with any UTC offset, or numeric seconds.

Real exports write local time with the offset in force at that moment ("2014-03-30T01:50:00+01:00"
then "2014-03-30T03:00:00+02:00" across a daylight-saving change); each string is converted with its
own offset, so the result is monotonic in real time. Strings without an offset are read in the
mapping's `timezone` (UTC by default). Each distinct string is parsed once (a SCADA file repeats every
timestamp once per machine). A value that parses neither way is reported with its row.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence

import numpy as np

from wmcheck.datasets.errors import UserError

FIX = (
    'timestamps must be ISO 8601 ("2014-01-01T00:00:00+01:00", "2014-01-01 00:00:00Z") or numeric '
    "seconds; fix or delete the row, or choose the right --time-col"
)


def parse_timestamps(
    values: Sequence | np.ndarray, col: str, row_label: Callable[[int], str], timezone: str = "UTC"
) -> tuple[np.ndarray, list[str]]:
    """Return (seconds (n,) float64 UTC epoch, or as given for numeric times; notes for the summary)."""
    arr = values if isinstance(values, np.ndarray) else None
    if arr is not None and arr.dtype.kind in "iufb":
        t = arr.astype(np.float64)
        bad = ~np.isfinite(t)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserError(f"missing timestamp in column {col!r} at {row_label(i)}: {arr[i]!r}", FIX)
        return t, ["numeric timestamps read as seconds"]
    seq = list(values) if arr is not None else values
    numeric = _try_numeric(seq, col, row_label)
    if numeric is not None:
        return numeric, ["numeric timestamps read as seconds"]
    return _parse_iso(seq, col, row_label, timezone)


def _try_numeric(seq: Sequence, col: str, row_label: Callable[[int], str]) -> np.ndarray | None:
    """Numeric seconds if the first value is a number (then every value must be); else None."""
    if not len(seq):
        return np.zeros(0)
    try:
        float(str(seq[0]))
    except ValueError:
        return None
    try:
        t = np.asarray(seq, dtype=str).astype(np.float64)
        ok = bool(np.isfinite(t).all())
    except ValueError:
        ok = False
    if ok:
        return t
    for i, v in enumerate(seq):  # error path only: name the first value that is not a finite number
        try:
            if np.isfinite(float(str(v))):
                continue
        except ValueError:
            pass
        raise UserError(
            f"cannot parse timestamp {str(v)!r} in column {col!r} at {row_label(i)} "
            "(the column starts with numeric seconds)",
            FIX,
        )
    raise AssertionError("unreachable")


def _parse_iso(seq: Sequence, col: str, row_label: Callable[[int], str], timezone: str) -> tuple[np.ndarray, list[str]]:
    tz = _dt.timezone.utc if timezone.upper() == "UTC" else _zone(timezone)
    parsed: dict = dict.fromkeys(seq)  # distinct strings in order of first appearance
    offsets: set = set()
    naive = 0
    for s in parsed:
        try:
            d = _dt.datetime.fromisoformat(str(s).strip())
        except ValueError:
            i = _first_row(seq, s)
            raise UserError(f"cannot parse timestamp {str(s)!r} in column {col!r} at {row_label(i)}", FIX) from None
        if d.tzinfo is None:
            naive += 1
            d = d.replace(tzinfo=tz)
        else:
            offsets.add(d.utcoffset())
        parsed[s] = d.timestamp()
    t = np.fromiter((parsed[s] for s in seq), np.float64, len(seq))
    notes = []
    if len(offsets) > 1:
        shown = ", ".join(sorted(_fmt_offset(o) for o in offsets))
        notes.append(f"timestamps carry several UTC offsets ({shown}, e.g. daylight saving); all converted to UTC")
    if naive:
        notes.append(f"{naive:,} distinct timestamps had no UTC offset and were read as {timezone}")
    return t, notes


def _first_row(seq: Sequence, s) -> int:
    for i, v in enumerate(seq):
        if v == s:
            return i
    return -1


def _zone(name: str) -> _dt.tzinfo:
    import zoneinfo

    return zoneinfo.ZoneInfo(name)


def _fmt_offset(o: _dt.timedelta) -> str:
    minutes = int(o.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
