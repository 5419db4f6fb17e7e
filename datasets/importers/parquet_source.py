"""Parquet files to a `Table` (optional: needs pyarrow, `pip install 'wmcheck[parquet]'`).

Only the mapped columns are read. Arrow timestamp columns become UTC epoch seconds (zone-aware
columns are stored in UTC already; naive ones are wall time in the mapping's `timezone`); string
columns stay strings (ISO timestamps, machine names); numeric columns become float64 with nulls as
missing. Everything after that is the shared pipeline (`tabular.py`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import ImportMapping
from wmcheck.datasets.importers.summary import ImportResult
from wmcheck.datasets.importers.tabular import Table, check_columns, table_to_result


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(
            "reading Parquet files needs pyarrow, which is not installed",
            "pip install 'wmcheck[parquet]' (or pip install pyarrow), or export the data as CSV",
        ) from None
    return pa, pc, pq


def import_parquet(path: str | Path, mapping: ImportMapping) -> ImportResult:
    return table_to_result(read_parquet_table(path, mapping), mapping)


def read_parquet_table(path: str | Path, mapping: ImportMapping) -> Table:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file {str(path)!r} does not exist", "check the path")
    pa, pc, pq = _pyarrow()
    try:
        pf = pq.ParquetFile(path)
        names = list(pf.schema_arrow.names)
        check_columns(names, mapping, str(path))
        data = pf.read(columns=mapping.needed_cols)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path} is not a readable Parquet file: {exc}", "re-export it") from None
    columns, notes = {}, []
    for name in mapping.needed_cols:
        col = data.column(name)
        if pa.types.is_timestamp(col.type):
            columns[name] = _timestamps(col, pa, pc, mapping)
            if name == mapping.time_col and columns[name].dtype.kind == "f":
                zone = f"zone {col.type.tz}" if col.type.tz else "no zone, read as UTC"
                notes.append(f"Parquet timestamps ({zone}) converted to UTC seconds")
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or name == mapping.episode_col:
            columns[name] = np.array(["" if v is None else str(v) for v in col.to_pylist()])
        else:
            try:
                columns[name] = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
            except pa.ArrowException as exc:
                raise UserError(
                    f"{path}: column {name!r} of type {col.type} is not numeric ({exc})",
                    "map only numeric columns to observations, actions and inputs",
                ) from None
    return Table(columns=columns, n_rows=data.num_rows, origin=str(path), row_label=lambda i: f"row {i}", notes=notes)


def _timestamps(col, pa, pc, mapping: ImportMapping) -> np.ndarray:
    if col.type.tz is None and mapping.timezone.upper() != "UTC":
        # naive wall time in a named zone: let the ISO parser apply the zone (DST-aware)
        return np.array(["" if v is None else v.isoformat() for v in col.to_pylist()])
    ns = pc.cast(pc.cast(col, pa.timestamp("ns", tz=col.type.tz)), pa.int64()).to_numpy(zero_copy_only=False)
    if col.null_count:
        out = ns.astype(np.float64) / 1e9
        out[np.asarray(col.is_null())] = np.nan
        return out
    return ns.astype(np.float64) / 1e9
