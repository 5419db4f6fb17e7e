"""Shadow mode on Pendulum-v1: a baseline (sample-and-hold torques) acts, a candidate's proposals are
logged beside it, and `wmcheck shadow` predicts what following them would have done. The truth is
computed here by setting the real pendulum to each logged state and applying both action sequences."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from wmcheck.datasets.episode import Episode
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.validate import validate_log
from wmcheck.scripts.cli import main


@pytest.fixture(scope="module")
def shadow_log(pendulum_checked):
    from wmcheck.checks.reality import RealityProfile, reality_env_args
    from wmcheck.datasets.record import record_to_log

    run, meta, tmp = pendulum_checked
    rid, kw = reality_env_args("Pendulum-v1", RealityProfile())
    path = tmp / "shadow_swing.h5"
    record_to_log(path, rid, "hold:5", 6, 200, 2000, kw, "real", shadow="policy_helpers:swing_up")
    return run, path, tmp


def true_differences(path, report, H):
    """Per start: the real pendulum's return under the proposals minus under the baseline's commands."""
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)

    def ret(obs, actions):
        env.state = np.array([np.arctan2(obs[1], obs[0]), obs[2]])
        return sum(env.step(a)[1] for a in actions)

    with open_log(path) as log:
        eps = {i: log.read(i) for i in log.episode_ids}
    out = []
    for e, s in zip(report["per_start"]["episode"], report["per_start"]["row"]):
        ep, o = eps[e], eps[e].observations[s - 1]
        out.append(ret(o, ep.proposed_actions[s - 1 : s + H - 1]) - ret(o, ep.actions[s - 1 : s + H - 1]))
    return np.array(out)


def test_proposals_round_trip_and_validate(shadow_log):
    _, path, _ = shadow_log
    assert validate_log(path).ok
    with open_log(path) as log:
        ep = log.read(log.episode_ids[0])
    assert ep.proposed_actions.shape == ep.actions.shape and not np.allclose(ep.proposed_actions, ep.actions)


def test_shadow_predicts_what_following_the_proposals_does(shadow_log, tmp_path):
    run, path, _ = shadow_log
    out = tmp_path / "shadow"
    code = main(["shadow", str(run), "--log", str(path), "--out", str(out)])
    report = json.loads((out / "shadow.json").read_text())
    truth = true_differences(path, report, report["horizon"])
    pred = np.array(report["per_start"]["difference"])
    ranks = [np.argsort(np.argsort(x)) for x in (truth, pred)]
    assert np.corrcoef(*ranks)[0, 1] > 0.9  # start by start, the model ranks the differences as reality does
    lo, hi = report["return_difference"]["ci95"]
    assert lo <= truth.mean() <= hi, (truth.mean(), lo, hi)  # the interval covers the true mean difference
    assert report["verdict"] == ("worse" if hi < 0 else "better" if lo > 0 else "no difference")
    assert code == report["exit_code"] and (out / "shadow.html").exists()
    assert 0 <= report["competence"]["proposals_leave"] <= 0.2  # torques inside the logged range


def test_identical_proposals_make_no_difference_and_a_plain_log_is_refused(shadow_log, tmp_path, capsys):
    run, path, tmp = shadow_log
    with open_log(path) as log:
        meta, eps = log.meta, [log.read(i) for i in log.episode_ids]
    same = [Episode(e.observations, e.actions, rewards=e.rewards, id=e.id, proposed_actions=e.actions) for e in eps]
    write_log(tmp_path / "same.h5", same, meta)
    assert main(["shadow", str(run), "--log", str(tmp_path / "same.h5"), "--out", str(tmp_path / "s")]) == 0
    report = json.loads((tmp_path / "s" / "shadow.json").read_text())
    assert report["verdict"] == "no difference" and np.allclose(report["per_start"]["difference"], 0)
    plain = [Episode(e.observations, e.actions, rewards=e.rewards, id=e.id) for e in eps]
    write_log(tmp_path / "plain.h5", plain, meta)
    assert main(["shadow", str(run), "--log", str(tmp_path / "plain.h5"), "--out", str(tmp_path / "p")]) == 2
    assert "no proposed_actions" in capsys.readouterr().err
