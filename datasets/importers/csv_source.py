"""CSV (and gzip-compressed .csv.gz) files to a `Table`, without pandas.

The header row names the columns; only the columns the mapping uses are kept, as strings, and the
shared pipeline (`tabular.py`) converts them. The delimiter is taken from the mapping or detected on
the header line (, ; tab |). Gzip input is recognised by its magic bytes, whatever the file name.
Blank lines are skipped; a row with fewer fields than the header is an error naming its line.
"""

from __future__ import annotations

import csv
import gzip
import io
import operator
from pathlib import Path

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import ImportMapping
from wmcheck.datasets.importers.summary import ImportResult
from wmcheck.datasets.importers.tabular import Table, check_columns, table_to_result

DELIMITERS = ",;\t|"


def import_csv(path: str | Path, mapping: ImportMapping) -> ImportResult:
    """Read `path` and run the import pipeline."""
    return table_to_result(read_csv_table(path, mapping), mapping)


def read_csv_table(path: str | Path, mapping: ImportMapping) -> Table:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file {str(path)!r} does not exist", "check the path")
    with _open_text(path) as f:
        # Line numbers are only worked out on the error path (`_line_of`), to keep the loop fast.
        reader = csv.reader(f, delimiter=mapping.delimiter or _sniff(f, path))
        try:
            header = next(reader)
        except StopIteration:
            raise UserError(f"{path} is empty", "export the data with a header row of column names") from None
        except csv.Error as exc:
            raise UserError(f"{path}: cannot read the CSV header: {exc}", "check the file is CSV") from None
        header = [h.strip() for h in header]
        check_columns(header, mapping, str(path))
        twice = sorted({c for c in mapping.needed_cols if header.count(c) > 1})
        if twice:
            where = "; ".join(f"{c!r} in columns {[i + 1 for i, h in enumerate(header) if h == c]}" for c in twice)
            raise UserError(
                f"{path}: the header names a mapped column more than once ({where}); which one is meant is unclear",
                "rename or drop the duplicate columns in the export",
            )
        idx = [header.index(c) for c in mapping.needed_cols]
        get = operator.itemgetter(*idx)
        width = len(header)
        try:
            if len(idx) == 1:
                rows = [(get(r),) for r in reader if r and (len(r) == width or _bad_width())]
            else:
                rows = [get(r) for r in reader if r and (len(r) == width or _bad_width())]
        except (IndexError, _WidthError):
            _raise_bad_row(path, mapping, width)
            raise
        except csv.Error as exc:
            raise UserError(
                f"{path}: CSV error near line {reader.line_num}: {exc}", "check quoting on that line"
            ) from None
        except (UnicodeDecodeError, EOFError, OSError) as exc:
            raise UserError(
                f"{path}: cannot read the file: {exc}",
                "the file must be UTF-8 text, optionally gzip-compressed and not truncated",
            ) from None
    columns = dict(zip(mapping.needed_cols, zip(*rows))) if rows else {c: () for c in mapping.needed_cols}
    return Table(
        columns=columns,
        n_rows=len(rows),
        origin=str(path),
        row_label=lambda i: f"data row {i + 1} (line {_line_of(path, mapping, i)})",
    )


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _sniff(f: io.TextIOBase, path: Path) -> str:
    """Pick the delimiter that occurs most on the header line (',' if none), then rewind."""
    try:
        first = f.readline()
    except (UnicodeDecodeError, EOFError, OSError) as exc:
        raise UserError(
            f"{path}: cannot read the file: {exc}", "the file must be UTF-8 text, optionally gzip-compressed"
        ) from None
    f.seek(0)
    counts = {d: first.count(d) for d in DELIMITERS}
    best = max(counts, key=counts.get)
    return best if counts[best] else ","


def _line_of(path: Path, mapping: ImportMapping, i: int) -> int:
    """File line of data row i (0-based, blank lines skipped); re-reads the file: error path only."""
    with _open_text(path) as f:
        reader = csv.reader(f, delimiter=mapping.delimiter or _sniff(f, path))
        next(reader)
        k = -1
        for r in reader:
            k += bool(r)
            if k == i:
                return reader.line_num
    return -1


class _WidthError(Exception):
    """A data row with another number of fields than the header (found in the fast loop)."""


def _bad_width() -> bool:
    raise _WidthError


def _raise_bad_row(path: Path, mapping: ImportMapping, width: int) -> None:
    """The first data row whose field count differs from the header's, with its line (error path)."""
    with _open_text(path) as f:
        reader = csv.reader(f, delimiter=mapping.delimiter or _sniff(f, path))
        next(reader)
        for r in reader:
            if r and len(r) != width:
                raise UserError(
                    f"{path}: line {reader.line_num} has {len(r)} fields, the header has {width}",
                    "fix or delete that line (a truncated export?)"
                    if len(r) < width
                    else "fix that line (an unquoted delimiter inside a value?) or delete it",
                )
