"""`wmcheck monitor`: new real Pendulum logs, period by period, against a model trained on real logs.
Faithful new logs stay stable, a sensor bias is named with its size, the state folder makes a
re-run add nothing, and bad settings are a clean exit 2."""

from __future__ import annotations

import json

import browser
import numpy as np
import pytest

from wmcheck.checks.monitor import NewEpisode, Period, State, group_periods
from wmcheck.datasets.errors import UserError
from wmcheck.scripts.cli import main

DAY = 86400.0
T0 = 1.7e9  # 2023-11-14, a real date


def _ep(i, start=None):
    return NewEpisode(f"fp{i}", None, "new.h5", start, [0.0])


def test_periods_parse_and_label():
    assert Period.parse("5").episodes == 5 and Period.parse("3 episodes").episodes == 3
    assert Period.parse("7d").seconds == 7 * DAY and Period.parse("12h").seconds == 12 * 3600
    assert Period.parse("1d").label(int(T0 // DAY)) == "2023-11-14"
    week = Period.parse("7d")
    assert week.label(week.key(T0)) == "2023-11-13"  # T0 is a Tuesday: its week starts on Monday the 13th
    for bad in ("0", "week", "-1d", ""):
        with pytest.raises(UserError):
            Period.parse(bad)


def test_episode_periods_keep_the_unfinished_one_pending():
    state = State("h", {}, [])
    looks = group_periods(Period.parse("4"), state, [_ep(i) for i in range(10)])
    assert [k for k, _ in looks] == [0, 1] and [len(e) for _, e in looks] == [4, 4]
    assert [e["fingerprint"] for e in state.pending] == ["fp8", "fp9"]
    state.looks = [{"key": 1, "episodes": []}]
    more = group_periods(Period.parse("4"), state, [_ep(i) for i in range(10, 12)])
    assert [k for k, _ in more] == [2] and [e["fingerprint"] for e in more[0][1]] == ["fp8", "fp9", "fp10", "fp11"]


def test_calendar_periods_need_dates_and_come_in_order():
    state = State("h", {}, [])
    eps = [_ep(i, T0 + i * 0.4 * DAY) for i in range(6)]  # 6 episodes starting over 2 days
    day = Period.parse("1d")
    looks = group_periods(day, state, eps)
    assert [k for k, _ in looks] == sorted(k for k, _ in looks) and looks
    assert all(day.key(e["start_time"]) == k for k, es in looks for e in es)
    # the last day is not over in these logs: it waits, and nothing is lost
    last = day.key(eps[-1]["start_time"] if isinstance(eps[-1], dict) else eps[-1].start_time)
    assert all(day.key(e["start_time"]) == last for e in state.pending) and state.pending
    assert sum(len(e) for _, e in looks) + len(state.pending) == 6
    state.looks, state.pending = [{"key": looks[-1][0], "episodes": []}], []
    with pytest.raises(UserError, match="already tested"):
        group_periods(Period.parse("1d"), state, [_ep(9, T0)])
    with pytest.raises(UserError, match="relative clock"):
        group_periods(Period.parse("1d"), State("h", {}, []), [_ep(1, 0.0)])
    with pytest.raises(UserError, match="no timestamps"):
        group_periods(Period.parse("1d"), State("h", {}, []), [_ep(1, None)])


@pytest.fixture(scope="module")
def new_logs(pendulum_checked):
    from wmcheck.checks.reality import RealityProfile, record_reality
    from wmcheck.datasets.logformat import write_log

    run, meta, tmp = pendulum_checked
    logs = {}
    for name, profile, n, seed in [
        ("faithful", RealityProfile(), 36, 500),
        ("biased", RealityProfile(sensor_bias=[0, 0, 0.6]), 12, 900),
    ]:
        logs[name] = tmp / f"monitor_{name}.h5"
        write_log(
            logs[name], record_reality("Pendulum-v1", profile, "hold:5", episodes=n, max_steps=200, seed=seed), meta
        )
    return run, logs, tmp


def test_monitor_stays_stable_then_finds_a_drift(new_logs, capsys):
    """36 faithful episodes (6 looks of 6: 4 baseline looks, then 2 against the grown reference)
    stay stable at the default budget; a 0.6 rad/s theta_dot sensor bias from look 7 on drifts
    within its two looks, with an interval that excludes reality."""
    run, logs, tmp = new_logs
    out = tmp / "monitor"
    args = ["monitor", str(run), "--out", str(out), "--period", "6", "--no-tensorboard"]
    assert main(args + ["--real", str(logs["faithful"])]) == 0
    report = json.loads((out / "monitor.json").read_text())
    # Against the 6 held-out episodes alone, the first looks' windows (6 and 12 episodes) may not
    # reach the level: the exact test's smallest p counts every feature's extreme subsets (e.g. 14
    # of C(18, 6) = 18,564 for 7 untied two-sided features), which then says inconclusive, never pass.
    early, later = report["looks"][:2], report["looks"][2:]
    assert all(lk["verdict"] == "stable" for lk in later), [lk["verdict"] for lk in report["looks"]]
    for lk in early:
        assert lk["verdict"] in ("stable", "inconclusive")
        if lk["verdict"] == "inconclusive":
            assert not any(w["can_fire"] for w in lk["windows"].values())
    assert all(w["can_fire"] for lk in later[2:] for w in lk["windows"].values())  # the grown reference
    held = report["reference"]["episodes"]
    assert [lk["reference_episodes"] for lk in report["looks"]] == [held] * 4 + [held + 24] * 2
    assert "P(any false alarm in 52 looks) <= 0.05" in report["guarantee"]
    assert (out / "monitor.html").read_text().count("<tr>") == 7  # header + 6 looks

    # the same log again adds nothing: every episode is in the state
    assert main(args + ["--real", str(logs["faithful"])]) == 0
    assert "No new period" in capsys.readouterr().out
    assert len(json.loads((out / "monitor.json").read_text())["looks"]) == 6

    assert main([a for a in args if a != "--no-tensorboard"] + ["--real", str(logs["biased"])]) == 1
    report = json.loads((out / "monitor.json").read_text())
    assert any(p.name.startswith("events") for p in (out / "tb").iterdir())  # the new looks' scalars
    assert [lk["verdict"] for lk in report["looks"][:6]].count("drifted") == 0
    drifted = [lk for lk in report["looks"][6:] if lk["verdict"] == "drifted"]
    assert drifted, [lk["verdict"] for lk in report["looks"]]
    findings = [f for lk in drifted for f in lk["findings"]]
    assert findings and all(f["p_value"] <= lk["windows"]["1"]["level"] for lk in drifted for f in lk["findings"])
    div = [f for f in findings if f["feature"] == "divergence"]
    assert div and all(f["ci95"][0] > 1 for f in div), findings  # the model's error grew, interval above 1x
    assert not [f for f in findings if f["feature"].endswith(":cos_theta") and f["kind"] == "bias"]
    # the page renders in a real browser: latest verdict, one row per look, the trend figures inline
    dom = browser.dom(out / "monitor.html", tmp)
    assert 'id="verdict"' in dom and report["verdict"].upper() in dom
    assert dom.count("<tr>") == 1 + len(report["looks"]) and dom.count('src="data:image/png;base64,') == 2


def test_monitor_refuses_other_settings_and_timestamp_free_calendar_periods(new_logs, capsys):
    run, logs, tmp = new_logs
    out = tmp / "monitor_settings"
    base = ["monitor", str(run), "--real", str(logs["faithful"]), "--out", str(out), "--no-tensorboard"]
    assert main(base + ["--period", "1d"]) == 2
    assert "no timestamps" in capsys.readouterr().err
    # a run that completes (stable 0 or drifted 1; refused is 2): the verdicts on faithful data are
    # test_monitor_stays_stable_then_finds_a_drift's, and with windows of 16 episodes this model's
    # faithful episodes 17-32 drifted on one install (divergence 2.7x the held-out episodes')
    assert main(base + ["--period", "16"]) in (0, 1)
    assert main(base + ["--period", "16", "--alpha", "0.1"]) == 2
    assert "other settings" in capsys.readouterr().err
    state = json.loads((out / "monitor_state.json").read_text())
    assert len(state["looks"]) == 2 and len(state["pending"]) == 4  # 36 episodes: 2 looks of 16, 4 waiting
    assert np.isfinite(state["looks"][0]["windows"]["1"]["p_value"])


def test_a_second_monitor_on_the_same_folder_stops_with_exit_2(new_logs, capsys):
    """Another process holds the folder (its lock file, in a real second process): this run stops
    before reading the state, names the holder, and leaves the folder as it was; once the holder
    is killed its lock is stale and the monitor takes it over and runs."""
    import signal
    import subprocess
    import sys

    run, logs, tmp = new_logs
    out = tmp / "monitor_locked"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from wmcheck.checks.monitor import LOCK_FILE; "
            "from wmcheck.datasets.folder_lock import folder_lock\n"
            f"with folder_lock({str(out)!r}, LOCK_FILE, 'wmcheck monitor', ''):\n"
            "    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = ["monitor", str(run), "--real", str(logs["faithful"]), "--out", str(out), "--period", "16"]
        assert main(cmd + ["--no-tensorboard"]) == 2
        err = capsys.readouterr().err
        assert "in use by another wmcheck monitor" in err and str(holder.pid) in err
        assert not (out / "monitor_state.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(cmd + ["--no-tensorboard"]) in (0, 1)  # it ran (not refused, 2), whatever it found
    assert len(json.loads((out / "monitor_state.json").read_text())["looks"]) == 2


def test_bench_reference_null_scores_the_reference_left_out(pendulum_checked):
    """scripts/bench_reference_null.py on the tests' model: fresh real episodes drawn as reference
    and window, the reference's features in-sample and left out. In-sample, the reference looks
    better than the window (its scale and support bound were fitted on it); left out it moves
    toward the window: on the same draws its gap is the larger (less negative) one."""
    from wmcheck.scripts.bench_reference_null import main as bench

    run, _meta, _tmp = pendulum_checked
    out = bench(["--run", str(run), "--pool", "60", "--replicates", "30"])
    assert set(out) == {"in-sample", "left out"}
    assert out["in-sample"]["gap"] < out["left out"]["gap"], out
    assert all(0.0 <= v["p05"] <= 1.0 and v["gap_se"] > 0 for v in out.values())
