"""The tabular import pipeline on small synthetic CSVs: timestamps, machines, cleaning, gaps, errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers import ImportMapping, build_mapping, load_source
from wmcheck.datasets.importers.csv_source import import_csv


def write_csv(path, header, rows, delimiter=","):
    lines = [delimiter.join(header)] + [delimiter.join(str(v) for v in r) for r in rows]
    text = "\n".join(lines) + "\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def mapping(**kw):
    base = dict(time_col="t", obs_cols=["y"], action_cols=["u"], min_episode_steps=1)
    base.update(kw)
    return ImportMapping(**base)


def numeric_rows(n, dt=10.0, t0=0.0, skip=(), blank=()):
    """y = 2k, u = k at t = t0 + k dt; rows in `skip` absent, rows in `blank` with an empty y."""
    return [(t0 + k * dt, "" if k in blank else 2.0 * k, float(k)) for k in range(n) if k not in skip]


def test_iso_timestamps_across_daylight_saving_are_converted_to_utc(tmp_path):
    # Europe/Paris: spring forward 2014-03-30 02:00 -> 03:00, fall back 2014-10-26 03:00 -> 02:00
    spring = [
        "2014-03-30T01:40:00+01:00",
        "2014-03-30T01:50:00+01:00",
        "2014-03-30T03:00:00+02:00",
        "2014-03-30T03:10:00+02:00",
    ]
    fall = [
        "2014-10-26T02:40:00+02:00",
        "2014-10-26T02:50:00+02:00",
        "2014-10-26T02:00:00+01:00",
        "2014-10-26T02:10:00+01:00",
    ]
    rows = [(ts, k, k) for k, ts in enumerate(spring + fall)]
    rows = rows[::-1]  # out of order in the file: sorted per machine on import
    p = write_csv(tmp_path / "dst.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(dt=600, max_interp_gap=0))
    assert r.summary.episodes_produced == 2  # two separate days
    for ep in r.episodes:
        assert np.all(np.diff(ep.timestamps) == 600)
        assert ep.num_steps == 3
    assert r.episodes[0].timestamps[0] == 1396140000.0  # 2014-03-30T00:40:00Z
    np.testing.assert_array_equal(r.episodes[1].observations[:, 0], [4, 5, 6, 7])
    assert any("UTC offsets" in n for n in r.summary.notes)


def test_naive_timestamps_use_the_timezone(tmp_path):
    rows = [("2014-07-01 12:00:00", 0, 0), ("2014-07-01 12:10:00", 1, 1), ("2014-07-01 12:20:00", 2, 2)]
    p = write_csv(tmp_path / "naive.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(timezone="Europe/Paris"))
    assert r.episodes[0].timestamps[0] == 1404208800.0  # 10:00Z (CEST is UTC+2)
    assert r.meta.dt == 600 and r.summary.dt_inferred


def test_numeric_seconds_and_inferred_dt(tmp_path):
    p = write_csv(tmp_path / "num.csv", ["t", "y", "u"], numeric_rows(20, dt=0.5))
    r = import_csv(p, mapping())
    assert r.meta.dt == 0.5 and r.summary.dt_inferred
    ep = r.episodes[0]
    assert ep.observations.shape == (20, 1) and ep.actions.shape == (19, 1)  # N+1 and N rows
    assert ep.observations.dtype == np.float32 and ep.timestamps.dtype == np.float64
    assert ep.truncation_array()[-1] and not ep.termination_array().any()


def test_step_values_start_and_end_alignment(tmp_path):
    p = write_csv(tmp_path / "a.csv", ["t", "y", "u", "w"], [(k, 10 * k, 100 + k, 200 + k) for k in range(6)])
    start = import_csv(p, mapping(input_cols=["w"], step_values="start")).episodes[0]
    end = import_csv(p, mapping(input_cols=["w"], step_values="end")).episodes[0]
    # step t goes from obs row t to obs row t+1; "start" takes row t's command, "end" row t+1's
    np.testing.assert_array_equal(start.actions[:, 0], [100, 101, 102, 103, 104])
    np.testing.assert_array_equal(start.inputs[:, 0], [200, 201, 202, 203, 204])
    np.testing.assert_array_equal(end.actions[:, 0], [101, 102, 103, 104, 105])
    np.testing.assert_array_equal(end.inputs[:, 0], [201, 202, 203, 204, 205])
    np.testing.assert_array_equal(start.observations[:, 0], end.observations[:, 0])


def test_sentinels_and_valid_ranges_become_missing(tmp_path):
    rows = numeric_rows(12)
    rows[4] = (rows[4][0], -999, rows[4][2])  # sentinel, one step: interpolated
    rows[8] = (rows[8][0], 1e6, rows[8][2])  # out of range, one step: interpolated
    p = write_csv(tmp_path / "s.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(sentinels={"y": [-999]}, valid_ranges={"y": [-10, 100]}))
    s = r.summary
    assert s.sentinel_hits["y"] == 1 and s.out_of_range["y"] == 1 and s.missing_per_column["y"] == 2
    assert s.interpolated["y"] == 2
    np.testing.assert_allclose(r.episodes[0].observations[:, 0], 2.0 * np.arange(12))


def test_float32_printed_sentinel_matches(tmp_path):
    rows = [(k, -273.20001 if k == 3 else 5.0, 0) for k in range(8)]
    p = write_csv(tmp_path / "f.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(sentinels={"y": [-273.2]}))
    assert r.summary.sentinel_hits["y"] == 1


def test_short_gap_interpolated_linearly(tmp_path):
    # two rows absent (a 2-step gap) and one empty cell: all within max_interp_gap=2
    p = write_csv(tmp_path / "g.csv", ["t", "y", "u"], numeric_rows(15, skip=(5, 6), blank=(10,)))
    r = import_csv(p, mapping(max_interp_gap=2))
    s = r.summary
    assert s.episodes_produced == 1 and s.split_points == 0
    assert s.missing_rows == 2
    assert s.interpolated == {"y": 3, "u": 2}
    ep = r.episodes[0]
    np.testing.assert_allclose(ep.observations[:, 0], 2.0 * np.arange(15))
    np.testing.assert_allclose(ep.actions[:, 0], np.arange(14))
    assert np.all(np.diff(ep.timestamps) == 10)


def test_long_gap_splits_and_short_pieces_are_dropped(tmp_path):
    # rows 10..14 missing (5 steps > max_interp_gap 3): split; an isolated row 16 is a 0-step piece
    rows = numeric_rows(30, skip=(10, 11, 12, 13, 14, 15, 17, 18, 19, 20))
    p = write_csv(tmp_path / "split.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(max_interp_gap=3, min_episode_steps=5))
    s = r.summary
    assert [e.num_steps for e in r.episodes] == [9, 8]
    assert s.episodes_produced == 2 and s.episodes_dropped == 1 and s.splits_missing == 2
    assert [e.id for e in r.episodes] == [0, 1]
    assert r.episodes[1].timestamps[0] == 210.0
    assert s.rows_dropped == 1
    assert "2 produced" in s.format_text()


def test_long_pieces_are_cut_into_episodes_sharing_their_boundary_rows(tmp_path):
    # 25 steps, max 10: 10 + 10 + 5; with min 6 the 5-step remainder joins the previous episode
    p = write_csv(tmp_path / "long.csv", ["t", "y", "u"], numeric_rows(26))
    r = import_csv(p, mapping(max_episode_steps=10, min_episode_steps=1))
    assert [e.num_steps for e in r.episodes] == [10, 10, 5]
    assert r.summary.length_cuts == 2 and "length cuts" in r.summary.format_text()
    assert r.episodes[1].timestamps[0] == r.episodes[0].timestamps[-1] == 100.0
    np.testing.assert_array_equal(r.episodes[1].observations[:, 0], 2.0 * np.arange(10, 21))
    assert sum(e.num_steps for e in r.episodes) == 25  # no step lost or doubled
    r = import_csv(p, mapping(max_episode_steps=10, min_episode_steps=6))
    assert [e.num_steps for e in r.episodes] == [10, 15]


def test_split_gap_splits_even_when_interpolation_could_bridge(tmp_path):
    p = write_csv(tmp_path / "sg.csv", ["t", "y", "u"], numeric_rows(20, skip=(10,)))
    bridged = import_csv(p, mapping(max_interp_gap=3))
    assert bridged.summary.episodes_produced == 1
    cut = import_csv(p, mapping(max_interp_gap=3, split_gap=15))
    assert cut.summary.splits_time_gap == 1 and cut.summary.episodes_produced == 2
    assert cut.summary.interpolated["y"] == 0


def test_several_machines_with_string_names(tmp_path):
    rows = []
    for k in range(10):  # interleaved, as in a farm export
        rows.append(("WT-B", k * 60, k, 0))
        rows.append(("WT-A", k * 60, 100 + k, 1))
    rows.append(("WT-C", 0, 7, 7))  # a machine with a single row: 0 steps, dropped
    p = write_csv(tmp_path / "m.csv", ["machine", "t", "y", "u"], rows)
    r = import_csv(p, mapping(episode_col="machine"))
    assert r.summary.machines == ["WT-B", "WT-A", "WT-C"]
    assert [(e.id, e.name) for e in r.episodes] == [(0, "WT-B"), (1, "WT-A")]
    assert r.episodes[1].observations[0, 0] == 100
    assert r.summary.episodes_dropped == 1 and r.meta.dt == 60


def test_duplicates_agreeing_are_merged_conflicting_become_missing(tmp_path):
    rows = numeric_rows(10)
    rows.insert(3, rows[3])  # identical duplicate
    rows.insert(7, (rows[7][0], 555.0, rows[7][2]))  # y disagrees, u agrees
    p = write_csv(tmp_path / "d.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping())
    s = r.summary
    assert s.duplicate_rows == 2
    assert s.duplicate_conflicts == {"y": 1, "u": 0}
    assert s.interpolated["y"] == 1
    np.testing.assert_allclose(r.episodes[0].observations[:, 0], 2.0 * np.arange(10))


def test_snapping_to_the_grid(tmp_path):
    rows = [(k * 10 + (0.4 if k % 2 else -0.3), k, k) for k in range(10)]
    p = write_csv(tmp_path / "j.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(dt=10))
    assert np.allclose(np.diff(r.episodes[0].timestamps), 10)
    assert 0.3 < r.summary.max_snap_seconds < 1.0


def test_resample_irregular_logger(tmp_path):
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 100, 300))
    rows = [(f"{x:.6f}", 3 * x + 1, -x) for x in t]
    p = write_csv(tmp_path / "r.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(dt=1.0, resample=True))
    ep = r.episodes[0]
    assert np.all(np.diff(ep.timestamps) == 1.0) and ep.timestamps[0] == np.ceil(t[0])
    np.testing.assert_allclose(ep.observations[:, 0], 3 * ep.timestamps + 1, rtol=1e-5)


def test_gzip_and_semicolon_delimiter(tmp_path):
    p = write_csv(tmp_path / "x.csv.gz", ["t", "y", "u"], numeric_rows(5), delimiter=";")
    r = load_source(p, mapping())
    assert r.summary.rows_read == 5 and r.episodes[0].num_steps == 4


def test_rows_without_time_column_use_dt(tmp_path):
    p = write_csv(tmp_path / "nt.csv", ["y", "u"], [(k, k) for k in range(5)])
    r = import_csv(p, mapping(time_col=None, dt=0.1))
    np.testing.assert_allclose(r.episodes[0].timestamps, 0.1 * np.arange(5))


# --- errors -------------------------------------------------------------------------------------


def test_wrong_column_name_lists_the_columns(tmp_path):
    p = write_csv(tmp_path / "c.csv", ["t", "power", "u"], numeric_rows(5))
    with pytest.raises(UserError) as e:
        import_csv(p, mapping(obs_cols=["Power"]))
    assert "'Power'" in e.value.problem
    assert "t, power, u" in e.value.fix and "'power'" in e.value.fix


def test_unparsable_timestamp_names_value_and_row(tmp_path):
    rows = [("2014-01-01T00:00:00Z", 1, 1), ("2014-01-01T00:10:00Z", 2, 2), ("01/01/2014 00:20", 3, 3)]
    p = write_csv(tmp_path / "ts.csv", ["t", "y", "u"], rows)
    with pytest.raises(UserError) as e:
        import_csv(p, mapping())
    assert "'01/01/2014 00:20'" in str(e.value) and "data row 3 (line 4)" in str(e.value)


def test_bad_numeric_timestamp_and_value_name_row(tmp_path):
    p = write_csv(tmp_path / "n.csv", ["t", "y", "u"], [(0, 1, 1), ("", 2, 2), (20, 3, 3)])
    with pytest.raises(UserError, match=r"timestamp '' .*data row 2"):
        import_csv(p, mapping())
    p = write_csv(tmp_path / "v.csv", ["t", "y", "u"], [(0, 1, 1), (10, "1,5", 2)], delimiter=";")
    with pytest.raises(UserError, match=r"non-numeric value '1,5' at data row 2"):
        import_csv(p, mapping())


def test_empty_result_is_an_error(tmp_path):
    p = write_csv(tmp_path / "e.csv", ["t", "y", "u"], numeric_rows(10))
    with pytest.raises(UserError, match="no episode left") as e:
        import_csv(p, mapping(valid_ranges={"y": [1000, 2000]}))
    assert "min_episode_steps" in e.value.fix
    header_only = write_csv(tmp_path / "h.csv", ["t", "y", "u"], [])
    with pytest.raises(UserError, match="no data rows"):
        import_csv(header_only, mapping())


def test_short_row_is_reported_with_its_line(tmp_path):
    p = tmp_path / "short.csv"
    p.write_text("t,y,u\n0,1,1\n10,2\n")
    with pytest.raises(UserError, match="line 3 has 2 fields"):
        import_csv(p, mapping())


def test_a_row_with_extra_fields_is_reported_with_its_line(tmp_path):
    p = tmp_path / "long.csv"
    p.write_text("t,y,u\n0,1,1\n10,2,3,4\n20,3,3\n")
    with pytest.raises(UserError, match="line 3 has 4 fields, the header has 3"):
        import_csv(p, mapping())


def test_a_mapped_column_named_twice_in_the_header_is_an_error(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("t,y,u,y\n0,1,1,5\n10,2,3,6\n")
    with pytest.raises(UserError, match=r"'y' in columns \[2, 4\]"):
        import_csv(p, mapping())


# --- the mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(obs_cols=[]), "no observation columns"),
        (dict(action_cols=["y"]), "both in obs_cols and action_cols"),
        (dict(source="lab"), "source must be one of"),
        (dict(dt=-1), "positive"),
        (dict(max_interp_gap=-1), "max_interp_gap"),
        (dict(min_episode_steps=0), "min_episode_steps"),
        (dict(min_episode_steps=20, max_episode_steps=10), "max_episode_steps"),
        (dict(valid_ranges={"y": [5, 1]}), "empty"),
        (dict(valid_ranges={"y": [1]}), r"\[lo, hi\]"),
        (dict(step_values="middle"), "step_values"),
        (dict(timezone="Mars/Olympus"), "time zone"),
        (dict(time_col=None), "dt"),
    ],
)
def test_mapping_rejects_bad_values(kw, match):
    with pytest.raises(UserError, match=match) as e:
        mapping(**kw)
    assert e.value.fix


def test_rule_for_unmapped_column_is_rejected_after_file_columns(tmp_path):
    p = write_csv(tmp_path / "c.csv", ["t", "y", "u"], numeric_rows(5))
    with pytest.raises(UserError, match="valid_ranges names 'yy'"):
        import_csv(p, mapping(valid_ranges={"yy": [0, 1]}))


def test_mapping_file_yaml_json_and_overrides(tmp_path):
    y = tmp_path / "m.yaml"
    y.write_text("time_col: t\nobs_cols: [y]\naction_cols: u\nvalid_ranges: {y: [0, 10]}\ndt: 5\n")
    m = build_mapping(y, dt=10, valid_ranges={"u": [None, 3]})
    assert m.dt == 10 and m.action_cols == ["u"]
    assert m.valid_ranges == {"y": [0.0, 10.0], "u": [-np.inf, 3.0]}
    j = tmp_path / "m.json"
    j.write_text(json.dumps({"time_col": "t", "obs_cols": ["y"], "max_interp_gap": 0}))
    assert build_mapping(j).max_interp_gap == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("time_col: t\nobs_col: [y]\n")
    with pytest.raises(UserError, match="unknown keys: obs_col"):
        build_mapping(bad)


def test_far_outlier_timestamp_does_not_build_a_huge_grid(tmp_path):
    rows = numeric_rows(10, dt=1.0) + [(1e9, 1, 1)]  # a bogus row ~32 years later, dt 1 s
    p = write_csv(tmp_path / "o.csv", ["t", "y", "u"], rows)
    r = import_csv(p, mapping(dt=1.0, min_episode_steps=3))
    s = r.summary
    assert s.episodes_produced == 1 and s.episodes_dropped == 1 and s.splits_missing == 1
    assert s.split_points == s.episodes_produced + s.episodes_dropped - 1
