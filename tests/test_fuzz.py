"""Property tests (hypothesis) for what users hand us (issue 18): any CSV the tabular importer is
given, and any edit of a valid log's structure or a truncation of its bytes, ends either in a log
that validates and reads back finite, or in a `UserError` naming the problem. Any other exception
is a bug (it would be exit 4 with a traceback file). The examples are generated, not listed; the
hand-written cases live in test_import_tabular.py, test_log_damage.py and test_log_safety.py.
`derandomize`: every run tries the same examples, so a failure in CI is reproducible; raise
max_examples (or drop derandomize) locally to search further."""

from __future__ import annotations

import math
import shutil

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers import ImportMapping
from wmcheck.datasets.importers.csv_source import import_csv
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.validate import validate_log

FUZZ = settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Cells as they appear in real exports: numbers of every size, missing-value sentinels, words,
# dates, a decimal comma, an empty field.
CELL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["", "nan", "NaN", "inf", "-inf", "1e309", "-1e309", "null", "NA", "1,5", "abc", "0x10"]),
    st.sampled_from(["2014-03-30T01:40:00+01:00", "2014-03-30 01:40", "30/03/2014 01:40", "1396140000"]),
)
HEADER = st.lists(st.sampled_from(["t", "y", "u", "extra", "y", ""]), min_size=1, max_size=5)


def _read_back(path) -> None:
    """A log that validates must read back, every value finite."""
    report = validate_log(path)
    assert report.ok, report.format_text()
    with open_log(path) as log:
        for ep in log:
            assert np.isfinite(ep.observations).all() and np.isfinite(ep.actions).all()


@FUZZ
@given(
    header=HEADER,
    rows=st.lists(st.lists(CELL, min_size=0, max_size=6), max_size=25),
    dt=st.one_of(st.none(), st.floats(min_value=-10, max_value=1e6), st.sampled_from([0.0, math.nan, math.inf])),
    gap=st.integers(-2, 5),
)
def test_any_csv_imports_or_is_a_user_error(tmp_path_factory, header, rows, dt, gap):
    tmp = tmp_path_factory.mktemp("csv")
    path = tmp / "x.csv"
    path.write_text("\n".join([",".join(header)] + [",".join(r) for r in rows]) + "\n")
    try:
        mapping = ImportMapping(
            time_col="t", obs_cols=["y"], action_cols=["u"], min_episode_steps=1, dt=dt, max_interp_gap=gap
        )
        result = import_csv(path, mapping)
        write_log(tmp / "x.h5", result.episodes, result.meta)
    except UserError:
        return
    _read_back(tmp / "x.h5")


@pytest.fixture(scope="module")
def valid_log(tmp_path_factory):
    rng = np.random.default_rng(0)
    eps = [
        Episode(
            rng.normal(size=(21, 2)).astype(np.float32),
            rng.normal(size=(20, 1)).astype(np.float32),
            id=i,
            timestamps=np.arange(21, dtype=np.float64) * 0.1 + 100.0 * i,
        )
        for i in range(3)
    ]
    path = tmp_path_factory.mktemp("valid") / "valid.h5"
    write_log(path, eps, LogMeta(source="real", dt=0.1, observation_names=["a", "b"], action_names=["u"]))
    return path


DATASETS = ["observations", "actions", "rewards", "terminations", "truncations", "timestamps"]
REPLACEMENTS = st.one_of(
    st.just(None),  # deleted
    st.sampled_from([np.float32(1.0), np.zeros((0,), np.float32), np.zeros((5, 2), np.float32)]),
    st.sampled_from([np.full((21, 2), np.nan, np.float32), np.full((20, 1), np.inf, np.float32)]),
    st.sampled_from([np.array([b"x"] * 20), np.zeros((20, 1), np.complex64), np.zeros((20, 1, 1, 1), np.int8)]),
)
ATTRS = st.sampled_from(["total_steps", "id", "format", "format_version", "source", "dt", "observation_names"])
ATTR_VALUES = st.one_of(
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20).filter(lambda t: "\x00" not in t),  # HDF5 strings cannot hold NUL
    st.sampled_from(["[1, 2", '{"a": 1}', "[]", "null"]),
)


@FUZZ
@given(
    episode=st.integers(0, 2),
    dataset=st.sampled_from(DATASETS),
    replacement=REPLACEMENTS,
    attr=st.one_of(st.none(), st.tuples(st.booleans(), ATTRS, ATTR_VALUES)),
)
def test_any_edit_of_a_log_reads_or_is_a_user_error(tmp_path_factory, valid_log, episode, dataset, replacement, attr):
    path = tmp_path_factory.mktemp("edit") / "edited.h5"
    shutil.copy(valid_log, path)
    with h5py.File(path, "r+") as f:
        g = f[f"episode_{episode}"]
        del g[dataset]
        if replacement is not None:
            g[dataset] = replacement
        if attr is not None:
            on_file, name, value = attr
            (f if on_file else g).attrs[name] = value
    _reads_or_refuses(path)


@FUZZ
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
def test_a_truncated_log_reads_or_is_a_user_error(tmp_path_factory, valid_log, fraction):
    path = tmp_path_factory.mktemp("cut") / "cut.h5"
    data = valid_log.read_bytes()
    path.write_bytes(data[: math.floor(fraction * len(data))])
    _reads_or_refuses(path)


def _reads_or_refuses(path) -> None:
    """validate answers with findings (a UserError only for a file it cannot open or whose format
    it does not know), and the reader either reads every episode or refuses with a UserError;
    when validate finds no error, the reader reads it."""
    try:
        report = validate_log(path)
        passed = report.ok
    except UserError:
        report, passed = None, False
    try:
        with open_log(path) as log:
            for ep in log:
                np.asarray(ep.observations).sum()
    except UserError:
        assert not passed, f"the reader refused a log that validate passed:\n{report.format_text()}"
