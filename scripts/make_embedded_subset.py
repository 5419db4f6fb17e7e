"""Cut the embedded La Haute Borne subset (one turbine, a few months) from the full OpenOA file.

    .venv/bin/python -m wmcheck.scripts.make_embedded_subset \\
        --src /path/to/la-haute-borne-data-2014-2015.csv.gz      # defaults reproduce the shipped file

Lines are copied byte for byte (header included): no column is added, dropped or reformatted, so
the empty cells, sentinel codes and daylight-saving quirks of the original stay in the subset and
the importer's cleaning is exercised on them. A row is kept when its turbine matches and its
timestamp, converted to UTC, lies in [start, end). The gzip header carries no name and no time, so
the output is byte-identical across runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import io
import sys
from pathlib import Path

DEFAULT_SRC = "/work/shared/data/la-haute-borne/la-haute-borne-data-2014-2015.csv.gz"
DEFAULT_TURBINE = "R80721"
DEFAULT_START = "2014-03-01T00:00:00+00:00"
DEFAULT_END = "2014-07-01T00:00:00+00:00"
DATA_DIR = Path(__file__).resolve().parent.parent / "datasets" / "data"


def default_out(turbine: str, start: str, end: str) -> Path:
    first = _utc(start).strftime("%Y-%m")
    last = (_utc(end) - _dt.timedelta(seconds=1)).strftime("%Y-%m")
    return DATA_DIR / f"la-haute-borne-{turbine}-{first}-to-{last}.csv.gz"


def _utc(s: str) -> _dt.datetime:
    d = _dt.datetime.fromisoformat(s)
    return d.replace(tzinfo=_dt.timezone.utc) if d.tzinfo is None else d.astimezone(_dt.timezone.utc)


def cut(src: Path, out: Path, turbine: str, start: str, end: str) -> int:
    """Write the subset; return the number of data rows kept."""
    t0, t1 = _utc(start), _utc(end)
    kept = 0
    buf = io.BytesIO()
    with gzip.open(src, "rt", encoding="utf-8", newline="") as f:
        header = f.readline()
        names = header.rstrip("\r\n").split(",")
        i_name, i_time = names.index("Wind_turbine_name"), names.index("Date_time")
        buf.write(header.encode())
        for line in f:
            fields = line.split(",", max(i_name, i_time) + 1)
            if fields[i_name] != turbine:
                continue
            if t0 <= _utc(fields[i_time]) < t1:
                buf.write(line.encode())
                kept += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        gz.write(buf.getvalue())
    return kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default=DEFAULT_SRC, help="the full La Haute Borne CSV (.csv.gz)")
    p.add_argument("--turbine", default=DEFAULT_TURBINE)
    p.add_argument("--start", default=DEFAULT_START, help="first UTC time kept (ISO 8601)")
    p.add_argument("--end", default=DEFAULT_END, help="UTC time where the subset stops (excluded)")
    p.add_argument("--out", type=Path, help="default: datasets/data/la-haute-borne-<turbine>-<months>.csv.gz")
    a = p.parse_args(argv)
    out = a.out or default_out(a.turbine, a.start, a.end)
    n = cut(Path(a.src), out, a.turbine, a.start, a.end)
    print(f"wrote {out}: {n:,} rows, {out.stat().st_size / 1024:.0f} KiB")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
