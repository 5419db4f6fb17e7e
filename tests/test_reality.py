"""Realities with known gaps: each wrapper does exactly what it documents, on real gymnasium envs."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from wmcheck.checks.reality import (
    REALITY_ENV,
    RealityProfile,
    make_reality_env,
    reality_env_args,
    record_reality,
    single_gap_profiles,
)
from wmcheck.checks.reality_wrappers import ActuatorGap, PhysicsGap, SensorGap
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.record import record_episodes

T = 60


def rollout(env, actions, seed):
    """Observations (T+1, D) and infos of one episode under a fixed action sequence."""
    obs, info = env.reset(seed=seed)
    observations, infos = [obs], [info]
    for a in actions:
        obs, _, _, _, info = env.step(a)
        observations.append(obs)
        infos.append(info)
    return np.stack(observations), infos


def torques(n=T, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, size=(n, 1)).astype(np.float32)  # (T, 1)


def delayed(actions, k, fill=0.0):
    return np.concatenate([np.full((k, actions.shape[1]), fill, actions.dtype), actions[: len(actions) - k]])


# ---- latency ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_latency_applies_the_action_from_k_steps_earlier(k):
    a = torques()
    real, _ = rollout(make_reality_env("Pendulum-v1", RealityProfile(latency_steps=k)), a, seed=7)
    plain = gym.make("Pendulum-v1")
    expected, _ = rollout(plain, delayed(a, k), seed=7)
    np.testing.assert_array_equal(real, expected)
    wrong, _ = rollout(plain, delayed(a, k - 1), seed=7)  # an off-by-one must show
    assert not np.allclose(real, wrong)


@pytest.mark.parametrize("steps", [0.5, 1.25, 2.75])
def test_a_fractional_latency_holds_the_time_weighted_mean_of_two_commands(steps):
    """k + f steps: the step applies f u_{t-k-1} + (1 - f) u_{t-k}; neither whole delay matches."""
    a = torques()
    k, f = int(steps), steps - int(steps)
    env = make_reality_env("Pendulum-v1", RealityProfile(latency_steps=steps))
    real, infos = rollout(env, a, seed=5)
    plain = gym.make("Pendulum-v1")
    expected, _ = rollout(plain, (f * delayed(a, k + 1) + (1 - f) * delayed(a, k)).astype(np.float32), seed=5)
    np.testing.assert_allclose(real, expected, rtol=1e-6, atol=1e-6)
    for whole in (k, k + 1):
        other, _ = rollout(plain, delayed(a, whole), seed=5)
        assert not np.allclose(real, other)
    assert infos[0]["reality"]["latency"]["steps"] == steps
    assert f"latency {steps:g} steps" in RealityProfile(latency_steps=steps).describe()
    with pytest.raises(UserError, match="Box action"):
        make_reality_env("CartPole-v1", {"latency_steps": steps})


def test_latency_fifo_is_refilled_at_reset():
    env = make_reality_env("Pendulum-v1", RealityProfile(latency_steps=2))
    a = torques()
    first, infos = rollout(env, a, seed=3)
    second, _ = rollout(env, a, seed=3)  # the actions left in the FIFO must not leak into episode 2
    np.testing.assert_array_equal(first, second)
    assert infos[0]["reality"]["latency"] == {"steps": 2, "neutral_action": [0.0]}


def test_a_latency_spike_delays_only_inside_its_window_and_drops_stale_commands():
    """Steps 20-39 apply u_{t-3} (the real earlier commands, not the neutral fill); every other step
    applies u_t, so the commands still queued when the spike ends are dropped."""
    a = torques()
    profile = RealityProfile(latency_steps=3, latency_window=[20, 40])
    real, infos = rollout(make_reality_env("Pendulum-v1", profile), a, seed=4)
    applied = a.copy()
    applied[20:40] = a[17:37]
    expected, _ = rollout(gym.make("Pendulum-v1"), applied, seed=4)
    np.testing.assert_array_equal(real, expected)
    np.testing.assert_array_equal(real[:21], rollout(gym.make("Pendulum-v1"), a, seed=4)[0][:21])  # before it
    constant, _ = rollout(make_reality_env("Pendulum-v1", RealityProfile(latency_steps=3)), a, seed=4)
    assert not np.allclose(real, constant)
    assert infos[0]["reality"]["latency"]["window"] == [20, 40]
    assert "latency 3 steps over steps 20-39" in profile.describe()
    for bad in ([40, 20], [5], [0.5, 9], [-1, 4]):
        with pytest.raises(UserError, match="latency window"):
            RealityProfile(latency_steps=3, latency_window=bad)
    with pytest.raises(UserError, match="without a latency"):
        RealityProfile(latency_window=[0, 9])


def test_a_start_state_replaces_the_envs_draw_and_recomputes_the_observation():
    """Pendulum (theta, theta_dot) and MountainCar (position, velocity) start where the profile says,
    null entries keep the env's own draw, and the dynamics run on from there."""
    env = make_reality_env("Pendulum-v1", RealityProfile(start_state=[np.pi / 2, None]))
    obs, info = env.reset(seed=1)
    draw = gym.make("Pendulum-v1").unwrapped
    draw.reset(seed=1)
    np.testing.assert_allclose(obs, [0.0, 1.0, draw.state[1]], atol=1e-6)  # cos, sin of pi/2; its own speed
    assert info["reality"]["start_state"] == pytest.approx([np.pi / 2, draw.state[1]])
    car = make_reality_env("MountainCarContinuous-v0", {"start_state": [0.3, 0.0]})
    obs, _ = car.reset(seed=0)
    np.testing.assert_allclose(obs, [0.3, 0.0], atol=1e-7)
    obs, *_ = car.step(np.zeros(1, np.float32))
    assert obs[1] < 0 and obs[0] < 0.3  # rolls back down the right-hand hill
    assert make_reality_env("MountainCarContinuous-v0").reset(seed=0)[1]["reality"]["start_state"] is None
    cheetah = make_reality_env("HalfCheetah-v5", {"start_state": [None, None, np.pi] + [None] * 15})  # qpos, qvel
    assert cheetah.reset(seed=0)[0][1] == pytest.approx(np.pi)  # the torso's angle: upside down
    with pytest.raises(UserError, match="3 entries"):
        make_reality_env("Pendulum-v1", {"start_state": [0.0, 0.0, 1.0]}).reset(seed=0)
    with pytest.raises(UserError, match="start state must be"):
        make_reality_env("Pendulum-v1", {"start_state": "up"})


def test_latency_on_discrete_actions_uses_the_first_class():
    env = make_reality_env("CartPole-v1", {"latency_steps": 1})
    _, infos = rollout(env, [1, 1, 0], seed=0)
    assert infos[0]["reality"]["latency"]["neutral_action"] == 0


# ---- actuator -----------------------------------------------------------------------------------------


def test_gain_half_equals_the_plain_env_under_halved_actions():
    a = torques()
    real, infos = rollout(make_reality_env("Pendulum-v1", {"actuator_gain": 0.5}), a, seed=1)
    expected, _ = rollout(gym.make("Pendulum-v1"), (0.5 * a.astype(np.float64)).astype(np.float32), seed=1)
    np.testing.assert_array_equal(real, expected)
    assert infos[1]["reality"]["action_applied"] == pytest.approx([0.5 * a[0, 0]])


def test_actuator_transform_order_deadband_gain_offset_saturation_then_space():
    env = ActuatorGap(gym.make("Pendulum-v1"), gain=2.0, offset=0.1, deadband=0.5, saturation=1.5)
    cmd = [-1.0, -0.5, -0.2, 0.0, 0.3, 0.5, 0.75, 1.0, 2.0]
    # dead zone: |a| <= 0.5 -> 0, else a -+ 0.5; then 2a + 0.1; then clip to +-1.5
    want = [-0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 1.1, 1.5]
    got = [float(env.action(np.array([c], np.float32))[0]) for c in cmd]
    assert got == pytest.approx(want, abs=1e-6)
    big = ActuatorGap(gym.make("Pendulum-v1"), gain=4.0)  # 4 N m is outside Box(-2, 2): the space clips
    assert big.action(np.array([1.0], np.float32)).tolist() == [2.0]
    assert big.action(np.array([1.0], np.float32)).dtype == np.float32


def test_process_noise_is_a_zero_mean_random_force_reproducible_per_seed():
    env = ActuatorGap(gym.make("Pendulum-v1"), noise_std=0.3, seed=4)
    env.reset(seed=11)
    draws = np.array([env.action(np.zeros(1, np.float32))[0] for _ in range(4000)])
    assert abs(draws.mean()) < 0.03 and draws.std() == pytest.approx(0.3, rel=0.05)  # what the plant feels
    a = torques()
    one, _ = rollout(make_reality_env("Pendulum-v1", {"process_noise_std": 0.3, "seed": 4}), a, seed=1)
    two, _ = rollout(make_reality_env("Pendulum-v1", {"process_noise_std": 0.3, "seed": 4}), a, seed=1)
    other, _ = rollout(make_reality_env("Pendulum-v1", {"process_noise_std": 0.3, "seed": 4}), a, seed=2)
    clean, _ = rollout(make_reality_env("Pendulum-v1", {}), a, seed=1)
    np.testing.assert_array_equal(one, two)  # reproducible from (episode seed, profile seed)
    assert not np.allclose(one, clean) and not np.allclose(one[1:], other[1:])
    with pytest.raises(UserError, match="process noise"):
        ActuatorGap(gym.make("Pendulum-v1"), noise_std=-1.0)


def test_termination_bound_ends_episodes_reality_does_not_end():
    from wmcheck.checks.reality import record_reality

    eps = record_reality(
        "Pendulum-v1", {"termination_bounds": [None, None, 2.0]}, "hold:5", episodes=4, max_steps=200, seed=0
    )
    assert all(e.terminations[-1] and e.num_steps < 200 for e in eps)
    assert all(abs(e.observations[-1, 2]) > 2.0 and (np.abs(e.observations[:-1, 2]) <= 2.0).all() for e in eps)
    free = record_reality("Pendulum-v1", {}, "hold:5", episodes=2, max_steps=50, seed=0)
    assert not any(e.terminations.any() for e in free)
    with pytest.raises(UserError, match="one value"):
        make_reality_env("Pendulum-v1", {"termination_bounds": [1.0]})


def test_a_simulator_without_the_envs_termination_runs_on_where_it_falls():
    """ignore_termination drops the env's own termination (InvertedDoublePendulum falls within a
    few dozen steps under random commands); the bounds, where given, still end the episode."""
    env_id = "InvertedDoublePendulum-v5"
    falls = record_reality(env_id, {}, "hold:5", episodes=3, max_steps=150, seed=0)
    assert all(e.terminations[-1] and e.num_steps < 150 for e in falls)
    runs = record_reality(env_id, {"ignore_termination": True}, "hold:5", episodes=3, max_steps=150, seed=0)
    assert all(e.num_steps == 150 and not e.terminations.any() for e in runs)
    for fell, ran in zip(falls, runs):  # the same episode up to the fall, then it goes on
        np.testing.assert_allclose(ran.observations[: fell.num_steps + 1], fell.observations, atol=1e-6)
    later = [None, 0.95] + [None] * 7  # ends only once the lower pole has tilted past ~72 degrees
    ends = record_reality(
        env_id, {"ignore_termination": True, "termination_bounds": later}, "hold:5", episodes=3, max_steps=150, seed=0
    )
    assert all(e.terminations[-1] and abs(e.observations[-1, 1]) > 0.95 for e in ends)
    assert all(b.num_steps > a.num_steps for a, b in zip(falls, ends))
    with pytest.raises(UserError, match="ignore_termination"):
        make_reality_env(env_id, {"ignore_termination": "yes"})


def test_actuator_parameters_are_per_channel():
    env = gym.make("HalfCheetah-v5")
    gain = np.array([1.0, 0.5, 0.0, -1.0, 2.0, 0.25])
    wrapped = ActuatorGap(env, gain=gain)
    a = np.full(6, 0.4, np.float32)
    np.testing.assert_allclose(wrapped.action(a), np.clip(0.4 * gain, -1, 1), atol=1e-7)
    with pytest.raises(UserError, match="shape"):
        ActuatorGap(env, gain=[1.0, 2.0])
    with pytest.raises(UserError, match="Box action space"):
        ActuatorGap(gym.make("CartPole-v1"), gain=2.0)


def test_latency_then_actuator_order_neutral_fill_feels_the_offset():
    a = torques()
    p = RealityProfile(latency_steps=2, actuator_gain=0.5, actuator_offset=0.3)
    real, _ = rollout(make_reality_env("Pendulum-v1", p), a, seed=5)
    applied = np.clip(0.5 * delayed(a, 2).astype(np.float64) + 0.3, -2, 2).astype(np.float32)
    expected, _ = rollout(gym.make("Pendulum-v1"), applied, seed=5)
    np.testing.assert_array_equal(real, expected)


# ---- sensors ------------------------------------------------------------------------------------------


def sensor_differences(profile, seeds=(0, 1, 2, 3, 4), steps=200):
    """(noisy - clean) over several episodes, clean obs from the plain env under the same actions."""
    diffs = []
    for s in seeds:
        a = torques(steps, seed=s)
        noisy, infos = rollout(make_reality_env("Pendulum-v1", profile), a, seed=s)
        clean, _ = rollout(gym.make("Pendulum-v1"), a, seed=s)
        np.testing.assert_array_equal(np.array([i["reality"]["observation_clean"] for i in infos], np.float32), clean)
        diffs.append(noisy.astype(np.float64) - clean)
    return np.stack(diffs)  # (E, steps+1, 3)


def test_sensor_bias_and_noise_statistics():
    bias, std = np.array([0.1, -0.2, 0.5]), np.array([0.01, 0.02, 0.3])
    d = sensor_differences(RealityProfile(sensor_bias=bias, sensor_noise_std=std, seed=11)).reshape(-1, 3)
    n = len(d)  # 1005 white samples per channel
    assert np.all(np.abs(d.mean(0) - bias) < 4 * std / np.sqrt(n))
    np.testing.assert_allclose(d.std(0), std, rtol=0.1)
    lag1 = [np.corrcoef(d[:-1, c], d[1:, c])[0, 1] for c in range(3)]
    assert np.all(np.abs(lag1) < 0.15)  # white


def test_sensor_noise_is_reproducible_by_seed():
    p = RealityProfile(sensor_noise_std=0.1, seed=3)
    a = sensor_differences(p, seeds=(0,), steps=30)
    np.testing.assert_array_equal(a, sensor_differences(p, seeds=(0,), steps=30))
    assert not np.allclose(a, sensor_differences(RealityProfile(sensor_noise_std=0.1, seed=4), seeds=(0,), steps=30))
    assert not np.allclose(a, sensor_differences(p, seeds=(1,), steps=30))  # another episode seed


def test_sensor_drift_ramp_resets_each_episode_and_walk_has_the_documented_increments():
    d = sensor_differences(RealityProfile(sensor_bias=0.2, sensor_drift=0.01), seeds=(0, 1), steps=50)
    ramp = 0.2 + 0.01 * np.arange(51)
    np.testing.assert_allclose(d[:, :, 0], np.broadcast_to(ramp, (2, 51)), atol=1e-5)
    w = sensor_differences(RealityProfile(sensor_drift=0.05, sensor_drift_mode="walk", seed=0), steps=200)
    assert np.all(w[:, 0] == 0)
    np.testing.assert_allclose(np.diff(w, axis=1).reshape(-1, 3).std(0), 0.05, rtol=0.12)


def test_sensor_gap_widens_the_observation_space_to_stay_valid():
    env = SensorGap(gym.make("Pendulum-v1"), bias=[0.5, 0.0, 0.0], noise_std=[0.0, 0.0, 0.1], seed=0)
    assert env.observation_space.high.tolist() == [1.5, 1.0, np.inf]
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        assert env.observation_space.contains(obs)
        obs, *_ = env.step(env.action_space.sample())


# ---- physics ------------------------------------------------------------------------------------------


def test_pendulum_mass_and_length_change_the_trajectory_and_persist():
    a = torques()
    env = make_reality_env("Pendulum-v1", {"physics": {"m": {"scale": 1.5}, "l": 0.7}})
    real, infos = rollout(env, a, seed=2)
    plain, _ = rollout(gym.make("Pendulum-v1"), a, seed=2)
    np.testing.assert_array_equal(real[0], plain[0])  # same initial state, different dynamics
    assert np.abs(real - plain).max() > 0.1
    assert infos[0]["reality"]["physics"] == {"m": {"before": 1.0, "after": 1.5}, "l": {"before": 1.0, "after": 0.7}}
    env.reset(seed=9)
    assert (env.unwrapped.m, env.unwrapped.l) == (1.5, 0.7)


def test_mujoco_damping_scale_reaches_the_model_and_persists_after_reset():
    base = gym.make("HalfCheetah-v5")
    original = base.unwrapped.model.dof_damping.copy()
    env = make_reality_env("HalfCheetah-v5", {"physics": {"dof_damping": {"scale": 1.5}, "body_mass": {"scale": 2}}})
    model = env.unwrapped.model
    np.testing.assert_allclose(model.dof_damping, 1.5 * original)
    np.testing.assert_allclose(model.body_subtreemass, 2 * base.unwrapped.model.body_subtreemass)  # mj_setConst ran
    a = np.random.default_rng(0).uniform(-1, 1, (15, 6)).astype(np.float32)
    real, infos = rollout(env, a, seed=0)
    plain, _ = rollout(base, a, seed=0)
    np.testing.assert_array_equal(real[0], plain[0])
    assert np.abs(real - plain).max() > 1e-3
    assert "x_position" in infos[1]  # the env's own info passes through
    for s in (1, 2):
        env.reset(seed=s)
        np.testing.assert_allclose(model.dof_damping, 1.5 * original)


def test_unknown_or_malformed_physics_changes_are_clear_errors():
    with pytest.raises(UserError, match=r"'mass'") as e:
        PhysicsGap(gym.make("Pendulum-v1"), mass=2.0)
    assert "g, l, m, max_speed, max_torque" in e.value.fix
    with pytest.raises(UserError, match="did you mean dof_damping"):
        make_reality_env("HalfCheetah-v5", {"physics": {"dof_dampin": 1.0}})
    with pytest.raises(UserError, match="derived"):
        PhysicsGap(gym.make("HalfCheetah-v5"), body_subtreemass=1.0)
    with pytest.raises(UserError, match="shape"):
        PhysicsGap(gym.make("HalfCheetah-v5"), dof_damping=[1.0, 2.0])
    with pytest.raises(UserError, match="keys"):
        PhysicsGap(gym.make("Pendulum-v1"), m={"factor": 2})


def test_cartpole_derived_masses_follow_the_change():
    env = make_reality_env("CartPole-v1", {"physics": {"masspole": 0.5, "length": 1.0}})
    assert env.unwrapped.total_mass == pytest.approx(1.5)
    assert env.unwrapped.polemass_length == pytest.approx(0.5)


# ---- profile ------------------------------------------------------------------------------------------


def test_profile_json_round_trip_and_validation():
    p = RealityProfile(
        latency_steps=2,
        actuator_gain=np.array([0.8]),
        actuator_deadband=0.05,
        sensor_noise_std=[0.01, 0.01, 0.1],
        sensor_drift=1e-3,
        physics={"m": {"scale": 1.2}},
        seed=5,
        name="combo",
    )
    d = json.loads(json.dumps(p.to_dict()))
    assert d["version"] == 1 and RealityProfile.from_dict(d) == p
    assert p.actuator_gain == [0.8]  # numpy stored as lists
    text = p.describe()
    for piece in ("combo:", "latency 2 steps", "gain [0.8]", "deadband 0.05", "noise std", "ramp", "m x1.2"):
        assert piece in text, (piece, text)
    assert RealityProfile().describe().startswith("no gaps") and not RealityProfile().has_gaps()
    with pytest.raises(UserError, match="unknown reality profile field"):
        RealityProfile.from_dict({"latency": 2})
    with pytest.raises(UserError, match="version"):
        RealityProfile.from_dict({"version": 99})
    for bad in (
        {"latency_steps": -1},
        {"latency_steps": float("nan")},
        {"latency_steps": "2"},
        {"sensor_drift_mode": "sine"},
        {"sensor_noise_std": [0.1, -0.1]},
        {"actuator_saturation": 0},
    ):
        with pytest.raises(UserError):
            RealityProfile(**bad)
    p = RealityProfile(latency_steps=np.int64(2))  # a numpy number from a config array is a number
    assert p.latency_steps == 2 and type(p.latency_steps) is int
    from wmcheck.checks.reality_wrappers import ActionLatency

    for bad in ("2", "two", -0.5):
        with pytest.raises(UserError, match="latency steps"):
            ActionLatency(gym.make("Pendulum-v1"), bad)


def test_single_gap_profiles_have_exactly_one_gap():
    for kind in (
        "latency",
        "actuator_gain",
        "actuator_offset",
        "actuator_deadband",
        "sensor_noise",
        "sensor_bias",
        "sensor_drift",
        "dynamics",
    ):
        zero, one, two = single_gap_profiles(kind, [0, 1, 2], parameter="m")
        assert not zero.has_gaps() and one.has_gaps() and len(two._parts()) == 1, kind
        make_reality_env("Pendulum-v1", two).reset(seed=0)
    assert single_gap_profiles("actuator_gain", [0.2])[0].actuator_gain == pytest.approx(1.2)
    assert single_gap_profiles("dynamics", [0.5], parameter="l")[0].physics == {"l": {"scale": 1.5}}
    with pytest.raises(UserError, match="unknown gap kind"):
        single_gap_profiles("visual", [1])
    with pytest.raises(UserError, match="parameter"):
        single_gap_profiles("dynamics", [1])


# ---- composition and recording ------------------------------------------------------------------------

COMBO = RealityProfile(
    latency_steps=2,
    actuator_gain=0.8,
    actuator_offset=0.1,
    actuator_deadband=0.05,
    actuator_saturation=1.8,
    sensor_bias=[0.0, 0.0, 0.2],
    sensor_noise_std=0.02,
    sensor_drift=1e-3,
    physics={"m": {"scale": 1.2}},
    seed=4,
)


def test_composed_reality_records_reproducibly_and_differs_from_the_simulator():
    eps = record_reality("Pendulum-v1", COMBO, policy="hold:5", episodes=2, max_steps=30, seed=10)
    again = record_reality("Pendulum-v1", COMBO, policy="hold:5", episodes=2, max_steps=30, seed=10)
    sim = record_episodes("Pendulum-v1", "hold:5", episodes=2, max_steps=30, seed=10)
    assert [e.observations.shape for e in eps] == [(31, 3), (31, 3)] and eps[0].seed == 10
    for e, e2, s in zip(eps, again, sim):
        np.testing.assert_array_equal(e.observations, e2.observations)
        np.testing.assert_array_equal(e.actions, s.actions)  # the same commands were recorded ...
        assert np.abs(e.observations - s.observations).max() > 0.05  # ... and reality answered differently
    rid, kw = reality_env_args("Pendulum-v1", COMBO)  # the "module:callable" route any recorder takes
    assert rid == REALITY_ENV and json.loads(json.dumps(kw)) == kw
    direct = record_episodes(rid, "hold:5", episodes=1, max_steps=30, seed=10, env_kwargs=kw)
    np.testing.assert_array_equal(direct[0].observations, eps[0].observations)


def test_composed_reality_passes_the_gymnasium_checker_and_rebuilds_from_its_spec():
    from gymnasium.utils.env_checker import check_env

    env = make_reality_env("Pendulum-v1", COMBO)
    with pytest.warns(UserWarning):  # the checker warns about wrappers and unbounded spaces; errors fail
        check_env(env, skip_render_check=True)
    _, info = env.reset(seed=0)
    assert set(info["reality"]) == {
        "physics",
        "start_state",
        "actuator",
        "latency",
        "sensor",
        "visual",
        "observation_clean",
    }
    rebuilt = gym.make(env.spec)
    a = torques(20)
    np.testing.assert_array_equal(rollout(rebuilt, a, seed=1)[0], rollout(env, a, seed=1)[0])
