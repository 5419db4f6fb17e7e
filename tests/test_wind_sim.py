"""The La Haute Borne power-curve simulator and its yaw/pitch policy: physics, env API, replay."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from wmcheck.datasets.embedded import embedded_data_path, embedded_mapping_path
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers import build_mapping, import_to_log
from wmcheck.datasets.logformat import open_log, write_log
from wmcheck.datasets.sims.wind_policy import YawPitchPolicy
from wmcheck.datasets.sims.wind_turbine import (
    TurbineParams,
    WindTurbineSim,
    air_density,
    replay_episode,
    replay_log,
    turbine_power,
)
from wmcheck.datasets.validate import validate_log

P = TurbineParams()


@pytest.fixture(scope="module")
def lhb(tmp_path_factory):
    path = tmp_path_factory.mktemp("lhb") / "lhb.h5"
    import_to_log(embedded_data_path(), path, mapping=build_mapping(embedded_mapping_path()))
    return path


def test_power_curve_shape():
    v = np.arange(0.0, 30.0, 0.5)
    p = turbine_power(v, 0.0, 15.0, P.fine_pitch_deg, P)
    assert np.all(p[v < P.cut_in_ms] == 0) and np.all(p[v >= P.cut_out_ms] == 0)
    running = (v >= P.cut_in_ms) & (v < P.cut_out_ms)
    assert np.all(np.diff(p[running]) >= -1e-9)  # non-decreasing in the wind at fine pitch
    assert p.max() == pytest.approx(P.rated_kw) and p[v == 6.0][0] < 0.3 * P.rated_kw
    # partial load: the cube law times Cp, so doubling 4 -> 8 m/s gives far more than 2x
    assert turbine_power(8.0, 0, 15, -1, P) / turbine_power(4.0, 0, 15, -1, P) > 5


def test_density_yaw_and_pitch_effects():
    cold, warm = turbine_power(7.0, 0, -5.0, -1, P), turbine_power(7.0, 0, 25.0, -1, P)
    assert cold / warm == pytest.approx(air_density(-5.0, P) / air_density(25.0, P), rel=1e-9) and cold > warm
    aligned, off = turbine_power(7.0, 0.0, 15, -1, P), turbine_power(7.0, 30.0, 15, -1, P)
    assert off / aligned == pytest.approx(np.cos(np.radians(30.0)) ** P.yaw_loss_exponent, rel=1e-9)
    assert turbine_power(15.0, 0, 15, 20.0, P) < turbine_power(15.0, 0, 15, 5.0, P) <= P.rated_kw


def test_env_follows_the_gymnasium_api():
    check_env(WindTurbineSim(max_steps=50), skip_render_check=True)
    env = WindTurbineSim(max_steps=20)
    obs, _ = env.reset(seed=3)
    n = 0
    while True:
        obs, r, term, trunc, info = env.step(np.array([-1.0, obs[4]], np.float32))
        n += 1
        assert r == pytest.approx(info["power_kw"] * 600 / 3.6e6)
        if term or trunc:
            break
    assert n == 20


def test_replay_with_logged_commands_keeps_the_logged_weather(lhb, tmp_path):
    with open_log(lhb) as log:
        meta, ep = log.meta, next(iter(log))
    sim = replay_episode(ep, meta.input_names, meta.action_names)
    np.testing.assert_allclose(sim.actions, ep.actions, atol=1e-3)
    np.testing.assert_allclose(sim.inputs[:, [0, 2]], ep.inputs[:, [0, 2]], atol=1e-4)  # wind speed, temperature
    np.testing.assert_allclose(((sim.inputs[:, 1] - ep.inputs[:, 1]) + 180) % 360 - 180, 0, atol=1e-3)
    assert sim.observations[0, 0] == ep.observations[0, 0]  # the same initial condition
    # an engineering model, not reality: close on the bulk of running steps, not identical
    running = ep.inputs[:, 0] > 5
    rel = (sim.observations[1:, 0] - ep.observations[1:, 0])[running] / np.maximum(ep.observations[1:, 0][running], 50)
    assert abs(np.median(rel)) < 0.3 and np.mean(np.abs(rel) > 1e-3) > 0.9
    out = tmp_path / "sim.h5"
    replay_log(lhb, out, [ep.id])
    assert validate_log(out).ok
    with open_log(out) as log:
        assert log.meta.source == "sim" and log.meta.observation_names == ["P_avg"]


def test_policy_yaws_onto_the_wind_and_holds_rated_power():
    pol = YawPitchPolicy()
    pitch, heading = pol(np.array([500, 8.0, 20.0, 10.0, 100.0]))
    assert heading == pytest.approx(120.0) and pitch == pytest.approx(P.fine_pitch_deg)
    _, heading = pol(np.array([500, 8.0, 5.0, 10.0, 100.0]))
    assert heading == pytest.approx(100.0)  # inside the dead band: hold
    assert pol(np.array([0, 2.0, 0, 10, 0]))[0] == 45.0 and pol(np.array([0, 26.0, 0, 10, 0]))[0] == 90.0
    for v in (13.0, 16.0, 20.0):
        pitch, _ = pol(np.array([2000, v, 0.0, 10.0, 0.0]))
        assert pitch > P.fine_pitch_deg and turbine_power(v, 0.0, 10.0, pitch, P) == pytest.approx(P.rated_kw, rel=0.02)


def test_policy_replay_reduces_misalignment(lhb, tmp_path):
    with open_log(lhb) as log:
        meta, ep = log.meta, next(iter(log))
    closed = replay_episode(ep, meta.input_names, meta.action_names, policy=YawPitchPolicy())
    assert np.median(np.abs(closed.inputs[:, 1])) <= np.median(np.abs(ep.inputs[:, 1])) + 1.0
    assert not np.allclose(closed.actions, ep.actions)


def test_replay_refuses_a_log_without_the_turbine_channels(tmp_path):
    from wmcheck.datasets.episode import Episode, LogMeta

    path = tmp_path / "other.h5"
    ep = Episode(observations=np.zeros((5, 1), np.float32), actions=np.zeros((4, 1), np.float32))
    write_log(path, [ep], LogMeta(dt=1.0, observation_names=["x"], action_names=["u"]))
    with pytest.raises(UserError, match="La Haute Borne channels"):
        replay_log(path, tmp_path / "out.h5")
