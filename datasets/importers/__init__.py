"""Importers: user data (CSV, Parquet, npz, Minari HDF5) to a wmcheck log.

One module per source; tabular sources (CSV, Parquet, npz columns) share the cleaning pipeline in
`tabular.py`, configured by an `ImportMapping` (`mapping.py`). Sources already in log layout (Minari
HDF5, log-layout npz) take `CopyOptions` instead. Every importer returns an `ImportResult`
(episodes, file metadata, `ImportSummary`); `import_to_log` writes it atomically.

    from wmcheck.datasets.importers import ImportMapping, import_to_log
    summary = import_to_log("scada.csv.gz", "logs.h5", mapping=ImportMapping(...))
    print(summary.format_text())
"""

from __future__ import annotations

import os
from pathlib import Path

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import CopyOptions, ImportMapping, build_mapping
from wmcheck.datasets.importers.summary import ImportResult, ImportSummary

__all__ = [
    "CopyOptions",
    "ImportMapping",
    "ImportResult",
    "ImportSummary",
    "build_mapping",
    "source_kind",
    "load_source",
    "import_to_log",
]

KINDS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "csv",
    ".gz": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".npz": "npz",
    ".hdf5": "hdf5",
    ".h5": "hdf5",
}


def source_kind(path: str | os.PathLike) -> str:
    """ "csv" | "parquet" | "npz" (columns) | "npz-log" | "hdf5", from the file name (and npz keys).

    A Minari dataset folder or id is its main_data.hdf5 (`minari_source.resolve_dataset`)."""
    from wmcheck.datasets.importers.minari_source import resolve_dataset

    path = resolve_dataset(path)
    if not path.exists():
        raise UserError(f"input file {str(path)!r} does not exist", "check the path")
    kind = KINDS.get(path.suffix.lower())
    if kind is None:
        raise UserError(
            f"cannot tell the format of {str(path)!r} from its extension",
            f"supported: {', '.join(sorted(KINDS))} (.csv.gz for gzip-compressed CSV)",
        )
    if kind == "npz":
        from wmcheck.datasets.importers.npz_source import is_log_layout, load_npz

        return "npz-log" if is_log_layout(load_npz(path)) else "npz"
    return kind


def needs_mapping(kind: str) -> bool:
    """Tabular sources need an ImportMapping; log-layout sources take CopyOptions."""
    return kind in ("csv", "parquet", "npz")


def load_source(
    path: str | os.PathLike,
    mapping: ImportMapping | None = None,
    options: CopyOptions | None = None,
    kind: str | None = None,
) -> ImportResult:
    """Read and clean `path` into episodes (a generator for HDF5 sources)."""
    kind = kind or source_kind(path)
    if needs_mapping(kind):
        if mapping is None:
            raise UserError(
                f"{path} is a table: say which columns are what",
                "give --mapping FILE or --obs-cols/--action-cols/--input-cols/--time-col",
            )
        if kind == "csv":
            from wmcheck.datasets.importers.csv_source import import_csv

            return import_csv(path, mapping)
        if kind == "parquet":
            from wmcheck.datasets.importers.parquet_source import import_parquet

            return import_parquet(path, mapping)
        from wmcheck.datasets.importers.npz_source import import_npz_columns

        return import_npz_columns(path, mapping)
    options = options or CopyOptions()
    if kind == "npz-log":
        from wmcheck.datasets.importers.npz_source import import_npz_log

        return import_npz_log(path, options)
    from wmcheck.datasets.importers.minari_source import import_minari

    return import_minari(path, options)


def import_to_log(
    path: str | os.PathLike,
    out: str | os.PathLike,
    mapping: ImportMapping | None = None,
    options: CopyOptions | None = None,
) -> ImportSummary:
    """Import `path` and write the log `out` atomically (nothing is left at `out` on error)."""
    from wmcheck.datasets.logformat import write_log

    if Path(out).resolve() == Path(path).resolve():
        raise UserError(f"--out {out} is the input file", "write the log to a new file")
    result = load_source(path, mapping, options)
    write_log(out, result.episodes, result.meta)
    return result.summary
