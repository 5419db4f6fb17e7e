"""`wmcheck import` end to end: summary printed, exit 2 with a fix on bad input, no file left behind."""

from __future__ import annotations

import numpy as np

from wmcheck.datasets.embedded import embedded_data_path, embedded_mapping_path
from wmcheck.datasets.logformat import open_log
from wmcheck.scripts.cli import main


def _csv(tmp_path, text, name="in.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_import_flags_and_summary(tmp_path, capsys):
    src = _csv(
        tmp_path, "time,machine,y,u,w\n" + "".join(f"{k * 60},M1,{k if k != 4 else -1},{k},{k}\n" for k in range(20))
    )
    out = tmp_path / "log.h5"
    rc = main(
        [
            "import",
            str(src),
            "--out",
            str(out),
            "--time-col",
            "time",
            "--episode-col",
            "machine",
            "--obs-cols",
            "y",
            "--action-cols",
            "u",
            "--input-cols",
            "w",
            "--sentinel",
            "y=-1",
            "--units",
            "y=kW",
            "--valid-range",
            "w=0:",
            "--min-episode-steps",
            "5",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and out.is_file()
    assert "import summary" in printed and "1 produced" in printed and "interpolated 1" in printed
    with open_log(out) as log:
        assert log.meta.units == {"y": "kW"} and log.meta.dt == 60 and log.meta.source == "real"
        ep = log.read(0)
        assert ep.name == "M1" and ep.num_steps == 19
        np.testing.assert_allclose(ep.observations[:, 0], np.arange(20))


def test_import_embedded_with_mapping_file_and_override(tmp_path, capsys):
    out = tmp_path / "lhb.h5"
    rc = main(
        [
            "import",
            str(embedded_data_path()),
            "--mapping",
            str(embedded_mapping_path()),
            "--out",
            str(out),
            "--max-interp-gap",
            "0",
            "--source",
            "sim",
        ]
    )
    assert rc == 0
    with open_log(out) as log:
        assert log.meta.source == "sim"
    assert "interpolated 0" in capsys.readouterr().out


def test_bad_inputs_exit_2_with_fix_and_leave_nothing(tmp_path, capsys):
    good = _csv(tmp_path, "t,a,b\n0,1,1\n10,2,2\n20,3,3\n")
    out = tmp_path / "out.h5"
    cases = [
        (["import", str(tmp_path / "missing.csv"), "--out", str(out), "--obs-cols", "a"], "does not exist"),
        (
            ["import", str(good), "--out", str(out), "--time-col", "t", "--obs-cols", "A"],
            "columns in the file: t, a, b",
        ),
        (
            [
                "import",
                str(_csv(tmp_path, "t,a\n0,1\nnoon,2\n", "ts.csv")),
                "--out",
                str(out),
                "--time-col",
                "t",
                "--obs-cols",
                "a",
            ],
            "'noon' in column 't' at data row 2",
        ),
        (
            [
                "import",
                str(good),
                "--out",
                str(out),
                "--time-col",
                "t",
                "--obs-cols",
                "a",
                "--action-cols",
                "b",
                "--valid-range",
                "a=100:200",
            ],
            "no episode left",
        ),
        (
            ["import", str(good), "--out", str(out), "--time-col", "t", "--obs-cols", "a", "--valid-range", "a=oops"],
            "expected lo:hi",
        ),
        (["import", str(good), "--out", str(out), "--obs-cols", "a"], "--dt SECONDS"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "fix:" in err and "Traceback" not in err, err
        assert not out.exists()
        assert _leftovers(tmp_path) == []


def test_existing_output_is_untouched_on_error(tmp_path):
    good = _csv(tmp_path, "t,a,b\n0,1,1\n10,2,2\n20,3,3\n")
    out = tmp_path / "out.h5"
    out.write_bytes(b"previous")
    assert main(["import", str(good), "--out", str(out), "--time-col", "t", "--obs-cols", "zzz"]) == 2
    assert out.read_bytes() == b"previous"


def test_table_flags_rejected_for_log_layout_sources(tmp_path, capsys):
    p = tmp_path / "log.npz"
    np.savez(p, observations=np.zeros((5, 2)), actions=np.zeros((5, 1)))
    assert main(["import", str(p), "--out", str(tmp_path / "o.h5"), "--time-col", "t"]) == 2
    assert "only apply to tables" in capsys.readouterr().err
    assert main(["import", str(p), "--out", str(tmp_path / "o.h5"), "--dt", "0.1", "--obs-cols", "x,v"]) == 0
    with open_log(tmp_path / "o.h5") as log:
        assert log.meta.observation_names == ["x", "v"] and log.meta.dt == 0.1
