"""`validate_log` and `wmcheck validate`: one corrupted fixture per finding, all problems at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import write_log
from wmcheck.datasets.validate import validate_log
from wmcheck.scripts.cli import main

N, D, A = 40, 3, 2
DT = 0.1


def clean_log(path: Path, episodes: int = 3) -> Path:
    eps = []
    for i in range(episodes):
        rng = np.random.default_rng(i)
        eps.append(
            Episode(
                observations=rng.normal(size=(N + 1, D)).astype(np.float32),
                actions=rng.normal(size=(N, A)).astype(np.float32),
                inputs=rng.normal(size=(N, 1)).astype(np.float32),
                rewards=rng.normal(size=N).astype(np.float32),
                timestamps=1000.0 + DT * np.arange(N + 1),
                id=i,
            )
        )
    return write_log(
        path,
        eps,
        LogMeta(source="real", dt=DT, observation_names=["x", "y", "z"], action_names=["u", "v"], input_names=["wind"]),
    )


@pytest.fixture
def log(tmp_path) -> Path:
    return clean_log(tmp_path / "log.h5")


def replace(g: h5py.Group, key: str, data) -> None:
    del g[key]
    g[key] = data


def finding(report, code):
    hits = [f for f in report.findings if f.code == code]
    assert hits, f"{code} not reported; got {report.codes()}"
    return hits[0]


def test_clean_file_has_no_findings_and_a_summary(log):
    report = validate_log(log)
    assert report.ok and report.findings == []
    s = report.summary
    assert (s.episodes, s.total_steps, s.source, s.dt) == (3, 3 * N, "real", DT)
    assert [c.name for c in s.channels["observations"]] == ["x", "y", "z"]
    assert [c.name for c in s.channels["inputs"]] == ["wind"]
    with h5py.File(log) as f:
        x = np.concatenate([f[f"episode_{i}/observations"][:, 1] for i in range(3)])
    y = s.channels["observations"][1]
    assert (y.min, y.max) == (x.min(), x.max()) and y.mean == pytest.approx(x.mean(), rel=1e-6)
    text = report.format_text()
    assert "3 episodes" in text and "wind" in text and "0 error(s)" in text


# One corruption per finding: (code, severity, expected episode, expected channel, mutate(file)).
def _nan(f):
    f["episode_1/observations"][5, 1] = np.nan
    f["episode_2/observations"][7, 1] = np.inf


def _constant(f):
    for i in range(3):
        f[f"episode_{i}/observations"][:, 0] = 2.5


def _saturated(f):
    for i in range(3):
        ds = f[f"episode_{i}/observations"]
        ds[:, 2] = np.minimum(ds[:, 2], 0.3)  # ~38% of standard normal values sit at the clip


def _dim(f):
    replace(f["episode_2"], "observations", np.zeros((N + 1, D + 1), np.float32))


def _dtype(f):
    replace(f["episode_1"], "actions", f["episode_1/actions"][()].astype(np.float64))


def _zero(f):
    g = f.create_group("episode_3")
    g.attrs.update({"id": 3, "total_steps": 0})
    g["observations"] = np.zeros((1, D), np.float32)
    g["actions"] = np.zeros((0, A), np.float32)
    g["terminations"] = np.zeros(0, bool)
    g["truncations"] = np.zeros(0, bool)


def _irregular(f):
    ts = f["episode_0/timestamps"]
    ts[10:] = ts[10:] + 0.05  # one step of 0.15 s in a 0.1 s log


def _early(f):
    f["episode_1/terminations"][5] = True


CASES = [
    ("missing_dataset", "error", 1, "terminations", lambda f: f["episode_1"].__delitem__("terminations")),
    ("row_count", "error", 0, "rewards", lambda f: replace(f["episode_0"], "rewards", np.zeros(N + 1, np.float32))),
    (
        "row_count",
        "error",
        2,
        "observations",
        lambda f: replace(f["episode_2"], "observations", np.zeros((N, D), np.float32)),
    ),
    ("row_count", "error", 1, "timestamps", lambda f: replace(f["episode_1"], "timestamps", np.arange(N, dtype=float))),
    ("row_count", "error", 1, "inputs", lambda f: replace(f["episode_1"], "inputs", np.zeros((N - 1, 1), np.float32))),
    ("total_steps_mismatch", "error", 0, None, lambda f: f["episode_0"].attrs.__setitem__("total_steps", 7)),
    ("nonfinite", "error", None, "observations/y", _nan),
    ("nonfinite", "error", 2, "rewards", lambda f: f["episode_2/rewards"].__setitem__(3, np.nan)),
    ("timestamps_not_increasing", "error", 2, "timestamps", lambda f: f["episode_2/timestamps"].__setitem__(4, 1000.0)),
    ("irregular_dt", "warning", 0, "timestamps", _irregular),
    ("constant_channel", "warning", None, "observations/x", _constant),
    ("saturated_channel", "warning", None, "observations/z", _saturated),
    ("dim_mismatch", "error", 2, None, _dim),
    ("dtype_mismatch", "error", 1, "actions", _dtype),
    ("names_mismatch", "error", None, "actions", lambda f: f.attrs.__setitem__("action_names", ["u"])),
    ("zero_steps", "warning", 3, None, _zero),
    ("early_termination", "warning", 1, "terminations", _early),
    ("id_mismatch", "warning", 2, None, lambda f: f["episode_2"].attrs.__setitem__("id", 9)),
    ("bad_attribute", "error", None, None, lambda f: f.attrs.__setitem__("dt", -1.0)),
    (
        "bad_layout",
        "error",
        0,
        "observations",
        lambda f: replace(f["episode_0"], "observations", np.array([b"a"] * (N + 1))),
    ),
]


@pytest.mark.parametrize("code,severity,episode,channel,mutate", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_each_corruption_is_reported(log, code, severity, episode, channel, mutate):
    with h5py.File(log, "a") as f:
        mutate(f)
    report = validate_log(log)
    hits = [x for x in report.findings if x.code == code and x.episode == episode and x.channel == channel]
    assert hits, f"{code} (episode {episode}, {channel}) not reported; got {report.findings}"
    assert hits[0].severity == severity
    assert report.ok == (severity == "warning" and not report.codes("error"))
    assert hits[0].format() in report.format_text()


def test_irregular_dt_uses_the_median_period_when_the_file_has_no_dt(log):
    with h5py.File(log, "a") as f:
        del f.attrs["dt"]
        f["episode_2/timestamps"][:] = 5.0 * np.arange(N + 1)  # regular at 5 s: fine on its own
        _irregular(f)
    report = validate_log(log)
    assert [(x.code, x.episode) for x in report.findings] == [("irregular_dt", 0)]
    assert "period 0.1 s" in report.findings[0].message


def test_nonfinite_counts_per_channel(log):
    with h5py.File(log, "a") as f:
        _nan(f)
    hit = finding(validate_log(log), "nonfinite")
    assert hit.message.startswith("2 NaN/inf values in 2 episode(s)") and "1, 2" in hit.message


def test_no_episodes(tmp_path):
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f.attrs["format"] = "wmcheck-log"
    report = validate_log(tmp_path / "e.h5")
    assert not report.ok and finding(report, "no_episodes")


def test_many_problems_are_all_reported(log):
    with h5py.File(log, "a") as f:
        _nan(f)
        _dim(f)
        _irregular(f)
        del f["episode_0/truncations"]
        replace(f["episode_1"], "rewards", np.zeros(3, np.float32))
    report = validate_log(log)
    assert {"nonfinite", "dim_mismatch", "irregular_dt", "missing_dataset", "row_count"} <= report.codes()
    assert not report.ok


def test_binary_and_one_hot_channels_are_not_saturated(tmp_path):
    eps = [
        Episode(
            observations=np.random.default_rng(i).normal(size=(N + 1, 2)).astype(np.float32),
            actions=np.eye(3, dtype=np.float32)[np.random.default_rng(i).integers(0, 3, N)],
            id=i,
        )
        for i in range(2)
    ]
    report = validate_log(write_log(tmp_path / "l.h5", eps, LogMeta(source="sim")))
    assert "saturated_channel" not in report.codes()


def test_minari_discrete_file_validates(tmp_path):
    with h5py.File(tmp_path / "main_data.hdf5", "w") as f:
        for i in range(2):
            g = f.create_group(f"episode_{i}")
            g.attrs.update({"id": i, "total_steps": 5})
            g["observations"] = np.random.rand(6, 2)
            g["actions"] = np.array([0, 1, 3, 1, 0])
            g["rewards"] = np.ones(5)
            g["terminations"] = np.zeros(5, bool)
            g["truncations"] = np.eye(1, 5, 4, dtype=bool)[0]
    report = validate_log(tmp_path / "main_data.hdf5")
    assert report.ok and report.summary.source == "sim"
    assert [c.name for c in report.summary.channels["actions"]] == [f"action_{i}" for i in range(4)]


# --- CLI --------------------------------------------------------------------------------------


def test_cli_exit_codes_and_json(log, capsys):
    assert main(["validate", str(log)]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    assert main(["validate", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["summary"]["episodes"] == 3 and out["report_version"] == 1
    with h5py.File(log, "a") as f:
        _nan(f)
        _irregular(f)
    assert main(["validate", str(log), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert {f["code"] for f in out["findings"]} == {"nonfinite", "irregular_dt"}


def test_cli_warnings_only_exit_zero(log, capsys):
    with h5py.File(log, "a") as f:
        _constant(f)
    assert main(["validate", str(log)]) == 0
    assert "constant_channel" in capsys.readouterr().out


def test_cli_missing_file_no_traceback(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.h5")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "fix:" in err and "Traceback" not in err


def test_validate_missing_file_raises_user_error(tmp_path):
    with pytest.raises(UserError):
        validate_log(tmp_path / "missing.h5")


def test_cli_subprocess_truncated_file(log):
    data = log.read_bytes()
    log.write_bytes(data[: len(data) // 2])
    exe = Path(sys.executable).parent / "wmcheck"
    proc = subprocess.run([str(exe), "validate", str(log)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "truncated" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_cli_json_stays_json_when_the_file_cannot_be_read(tmp_path, capsys):
    """--json promises JSON on stdout: an unreadable or missing file is one error finding, exit 2."""
    bad = tmp_path / "bad.h5"
    bad.write_text("not an HDF5 file")
    for path in (bad, tmp_path / "missing.h5"):
        assert main(["validate", str(path), "--json"]) == 2
        out = json.loads(capsys.readouterr().out)
        assert out["ok"] is False and out["summary"] is None
        assert [f["code"] for f in out["findings"]] == ["unreadable"] and path.name in out["findings"][0]["message"]
