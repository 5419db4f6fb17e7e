"""The data shipped inside the package: a La Haute Borne SCADA subset and its import mapping.

One turbine (R80721), March-June 2014, the original rows unchanged (see
`data/LICENSE-la-haute-borne.md` for the source, licence and how it was cut). The demo imports it
with `embedded_mapping_path()`:

    from wmcheck.datasets.embedded import embedded_data_path, embedded_mapping_path
"""

from __future__ import annotations

import atexit
import contextlib
from importlib import resources
from pathlib import Path

DATA_FILE = "la-haute-borne-R80721-2014-03-to-2014-06.csv.gz"
MAPPING_FILE = "la-haute-borne.yaml"
LICENSE_FILE = "LICENSE-la-haute-borne.md"

_files = contextlib.ExitStack()
atexit.register(_files.close)


def _path(name: str) -> Path:
    """A real file path for a packaged data file (extracted to a temporary file if zipped)."""
    ref = resources.files("wmcheck.datasets") / "data" / name
    if isinstance(ref, Path):
        return ref
    return _files.enter_context(resources.as_file(ref))


def embedded_data_path() -> Path:
    """The embedded La Haute Borne CSV (.csv.gz)."""
    return _path(DATA_FILE)


def embedded_mapping_path() -> Path:
    """The YAML import mapping for it (also fits the full four-turbine file)."""
    return _path(MAPPING_FILE)


def embedded_license_path() -> Path:
    return _path(LICENSE_FILE)
