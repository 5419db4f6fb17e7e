"""The importer on real SCADA data: the embedded La Haute Borne subset, and the full file if present."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from wmcheck.datasets.embedded import embedded_data_path, embedded_license_path, embedded_mapping_path
from wmcheck.datasets.importers import build_mapping, import_to_log, load_source
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.validate import validate_log

FULL = Path("/work/shared/data/la-haute-borne/la-haute-borne-data-2014-2015.csv.gz")
ORIGINAL_HEADER = "Wind_turbine_name,Date_time,Ba_avg,P_avg,Ws_avg,Va_avg,Ot_avg,Ya_avg,Wa_avg"


def test_embedded_files_are_packaged_and_small():
    data = embedded_data_path()
    assert data.is_file() and data.stat().st_size < 600_000
    assert embedded_mapping_path().is_file() and embedded_license_path().is_file()
    assert "Etalab" in embedded_license_path().read_text()
    with gzip.open(data, "rt") as f:
        assert f.readline().strip() == ORIGINAL_HEADER  # original columns, unchanged


def log_episodes(path):
    with open_log(path) as log:
        return list(log)


def test_embedded_subset_imports_cleanly(tmp_path):
    mapping = build_mapping(embedded_mapping_path())
    out = tmp_path / "lhb.h5"
    s = import_to_log(embedded_data_path(), out, mapping=mapping)
    # summary figures are consistent with each other and with the data
    assert s.rows_read == 17_574 and s.machines == ["R80721"]
    assert s.episodes_produced > 0 and s.dt == 600 and not s.dt_inferred
    assert s.sentinel_hits["Ot_avg"] > 0  # the -273.2 fault code run in June 2014
    assert s.missing_in_source["P_avg"] > 0 and s.duplicate_rows == 6  # DST duplicates in the source
    assert s.split_points + s.length_cuts == s.episodes_produced + s.episodes_dropped - len(s.machines)
    assert s.length_cuts > 0 and max(e.num_steps for e in log_episodes(out)) <= mapping.max_episode_steps
    assert s.values_missing == sum(s.missing_per_column.values()) > 0
    with open_log(out) as log:
        assert log.meta.units["P_avg"] == "kW" and log.meta.input_names == ["Ws_avg", "Va_avg", "Ot_avg"]
        steps = 0
        for ep in log:
            assert ep.name == "R80721"
            assert np.isfinite(ep.observations).all() and np.isfinite(ep.actions).all()
            assert np.isfinite(ep.inputs).all()
            assert np.all(np.diff(ep.timestamps) == 600)
            assert ep.inputs[:, 2].min() > -40  # no sentinel survived
            steps += ep.num_steps
        assert steps == s.steps_produced
    report = validate_log(out)
    assert report.ok, report.format_text()
    text = s.format_text()
    assert "episodes" in text and "Ot_avg" in text


@pytest.mark.slow
@pytest.mark.skipif(not FULL.is_file(), reason="the full La Haute Borne file is not on this machine")
def test_full_file_four_turbines():
    r = load_source(FULL, build_mapping(embedded_mapping_path()))
    s = r.summary
    assert s.rows_read == 420_480
    assert sorted(s.machines) == ["R80711", "R80721", "R80736", "R80790"]
    assert {e.name for e in r.episodes} == set(s.machines)
    assert all(v >= 2569 for v in s.missing_per_column.values())  # 2,569 empty cells per column
    assert s.sentinel_hits["Ot_avg"] > 0 and s.out_of_range["Ba_avg"] > 0
    assert s.episodes_produced > 4 and s.steps_produced > 400_000


@pytest.mark.skipif(not FULL.is_file(), reason="the full La Haute Borne file is not on this machine")
def test_subset_script_reproduces_the_shipped_file(tmp_path):
    from wmcheck.scripts.make_embedded_subset import main as cut

    out = tmp_path / "subset.csv.gz"
    assert cut(["--src", str(FULL), "--out", str(out)]) == 0
    assert out.read_bytes() == embedded_data_path().read_bytes()
