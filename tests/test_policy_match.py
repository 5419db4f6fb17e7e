"""The policy-shift test (checks/policy_match.py): do the checked commands follow the real logs'
behaviour policy, whatever the simulator does to the states?

The plant here is a small damped oscillator driven by one command, simulated in numpy (the test is
about the statistics, not a simulator). Each test fails when the method is wrong: a test that
judged the visited states would reject the same policy on a plant that moves them; a test that
ignores the conditions misses a feedback controller whose commands span the logs' range; one that
answers "not shifted" from two episodes claims what it cannot know.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from wmcheck.checks.policy_match import policy_pairs, policy_shift_test, uses_observations
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.normalize import Normalizer


def simulate(rng, policy: str, steps: int = 120, gain: float = 1.0, delay: int = 0, noise: float = 0.05) -> Episode:
    """One episode of x'' = -x - 0.3 x' + gain * u(t - delay), observed as (x, x') with noise."""
    x = rng.normal(0, 0.5, 2)
    obs, acts, u_hist = [], [], [0.0] * (delay + 1)
    u = rng.uniform(-1, 1)
    for _ in range(steps):
        o = x + rng.normal(0, noise, 2)
        obs.append(o)
        if policy == "hold":  # a random command held for 5 steps on average (the logs' exciting policy)
            u = rng.uniform(-1, 1) if rng.random() < 0.2 else u
        elif policy == "hold5":  # a random command held exactly 5 steps (the benchmarks' hold:5)
            u = rng.uniform(-1, 1) if len(acts) % 5 == 0 else u
        elif policy == "sweep":  # a scripted input: the same sinusoid in every episode (a test profile)
            u = 0.8 * float(np.sin(2 * np.pi * len(acts) / 40))
        elif policy == "pd":  # feedback towards rest, saturated like the commands' range
            u = float(np.clip(-2.0 * o[0] - 1.0 * o[1] + rng.normal(0, 0.1), -1, 1))
        acts.append([u])
        u_hist.append(u)
        applied = u_hist[-1 - delay]
        x = x + 0.1 * np.array([x[1], -x[0] - 0.3 * x[1] + gain * applied]) + rng.normal(0, 0.02, 2)
    obs.append(x + rng.normal(0, noise, 2))
    return Episode(np.asarray(obs, np.float32), np.asarray(acts, np.float32))


def group(seed: int, n: int, policy: str, **plant) -> list[Episode]:
    rng = np.random.default_rng(seed)
    eps = [simulate(rng, policy, **plant) for _ in range(n)]
    for i, e in enumerate(eps):
        e.id = i
    return eps


@pytest.fixture(scope="module")
def norm() -> Normalizer:
    return Normalizer.fit(group(999, 12, "hold"))


def rejection_rate(norm, reps: int, checked_policy: str, alpha: float = 0.1, real_policy: str = "hold", **plant):
    """Share of `reps` independent checks (8 checked vs 12 real episodes) whose test rejects at alpha."""
    hits = 0
    for r in range(reps):
        real = policy_pairs(group(10_000 + r, 12, real_policy), norm)
        checked = policy_pairs(group(20_000 + r, 8, checked_policy, **plant), norm)
        res = policy_shift_test(checked, real, alpha, np.random.default_rng(r), permutations=199)
        hits += res.rejects
    return hits / reps


def test_the_level_holds_when_only_the_simulator_differs(norm):
    """The same held random policy on a plant with 1.5x the gain and a 1-step delay: the policy did
    not change, so the test rejects at most at its level (60 checks, alpha 0.1: mean 6; the bound
    is the binomial 99.5 % quantile): the states differ, the policy does not."""
    rate = rejection_rate(norm, 60, "hold", gain=1.5, delay=1)
    assert rate <= 13 / 60, rate


def test_the_level_holds_when_the_simulator_moves_the_states_far(norm):
    """A gain x2 on this lightly damped plant moves the visited states far from the real ones. A
    plain distance between the two groups' fits rejected 30 % of these checks at alpha 0.1 (the
    sparse side's fit extrapolates, a permuted split never does); the Wald form stays at its level."""
    rate = rejection_rate(norm, 60, "hold", gain=2.0, delay=2)
    assert rate <= 13 / 60, rate


def test_the_level_holds_for_a_command_held_exactly_five_steps(norm):
    """The benchmarks' hold:5 (a command held exactly 5 steps) on a plant with 2x the gain and a
    2-step delay: at most the level."""
    rate = rejection_rate(norm, 60, "hold5", real_policy="hold5", gain=2.0, delay=2)
    assert rate <= 13 / 60, rate


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs gymnasium[mujoco]")
def test_a_simulator_that_moves_halfcheetahs_states_is_not_another_policy(tmp_path):
    """HalfCheetah under hold:5, a simulator with 3x the joint damping and no noise against the
    noisy reality. hold:5 depends on the time since the command changed, and 17 observation channels
    carry some of that phase, differently under other dynamics: conditioned on (observation,
    previous command) the test rejected such simulators under the logs' own policy (p 0.001 on the
    first HalfCheetah detection run, 17 of 28 gapped checks at p <= 0.005). The real commands are
    not predicted by the observations beyond the previous command, so the test now conditions on
    it alone: no rejection here, while another excitation (hold:2) is still found."""
    from wmcheck.checks.reality import RealityProfile, reality_env_args
    from wmcheck.datasets.record import Recorder

    def record(profile, policy, n, seed):
        rid, kw = reality_env_args("HalfCheetah-v5", profile)
        with Recorder(rid, policy, seed, kw, 200) as rec:
            return list(rec.episodes(n))

    reality = RealityProfile(latency_steps=1, actuator_gain=0.9, sensor_noise_std=0.02, process_noise_std=0.1)
    real = record(reality, "hold:5", 12, 0)
    damped = RealityProfile(latency_steps=1, actuator_gain=0.9, physics={"dof_damping": {"scale": 3.0}})
    hc_norm = Normalizer.fit(real)
    real_pairs = policy_pairs(real, hc_norm)
    assert not uses_observations(real_pairs, np.random.default_rng(0))
    same = policy_shift_test(
        policy_pairs(record(damped, "hold:5", 6, 100), hc_norm), real_pairs, 0.05, np.random.default_rng(0)
    )
    other = policy_shift_test(
        policy_pairs(record(reality, "hold:2", 6, 200), hc_norm), real_pairs, 0.05, np.random.default_rng(0)
    )
    assert not same.shifted and other.shifted, (same.p_value, other.p_value)


def arm_episodes(seed: int, n: int, policy: str, channels: int = 7, steps: int = 100) -> list[Episode]:
    """An arm of `channels` first-order joints (Pusher has 7) under commands held exactly 5 steps
    (the logs' excitation) or a scripted sweep (sinusoids of periods 30-60 steps, the same in
    every episode, as a test profile or a drive cycle is)."""
    rng = np.random.default_rng(seed)
    periods = np.linspace(30, 60, channels)
    out = []
    for i in range(n):
        x, u, obs, acts = np.zeros(2 * channels), np.zeros(channels), [], []
        for t in range(steps):
            obs.append(x + rng.normal(0, 0.05, 2 * channels))
            if policy == "sweep":
                u = 0.8 * np.sin(2 * np.pi * t / periods)
            elif t % 5 == 0:
                u = rng.uniform(-1, 1, channels)
            acts.append(u.copy())
            x = 0.9 * x + 0.1 * np.concatenate([u, -u]) + rng.normal(0, 0.02, 2 * channels)
        obs.append(x)
        out.append(Episode(np.asarray(obs, np.float32), np.asarray(acts, np.float32), id=i))
    return out


def test_a_scripted_input_on_many_channels_is_another_policy():
    """The same sweep in every checked episode against commands held 5 steps, on 7 channels: the
    checked conditions fill a thin curve, and the Wald form weighs a difference there as hardly
    determined (on Pusher it gave p = 1.0, and faithful simulators under the sweep failed on
    actuator and divergence). The pairs' joint law, a valid test where the real commands ignore
    the states, finds it in every check; the conditional test alone misses some. Under the logs'
    policy the combined test keeps its level."""
    arm_norm = Normalizer.fit(arm_episodes(999, 12, "hold"))
    found = []
    for r in range(4):
        real = policy_pairs(arm_episodes(10_000 + r, 18, "hold"), arm_norm)
        res = policy_shift_test(
            policy_pairs(arm_episodes(20_000 + r, 6, "sweep"), arm_norm), real, 0.05, np.random.default_rng(r), 199
        )
        found.append((res.shifted, res.conditional_p, res.joint_p))
    assert all(f[0] for f in found), found
    assert any(f[1] > 0.05 for f in found) and all(f[2] <= 0.01 for f in found), found
    false = 0
    for r in range(30):
        real = policy_pairs(arm_episodes(30_000 + r, 18, "hold"), arm_norm)
        same = policy_pairs(arm_episodes(40_000 + r, 6, "hold"), arm_norm)
        false += policy_shift_test(same, real, 0.1, np.random.default_rng(r), 199).shifted
    assert false <= 8, false  # alpha 0.1 over 30 checks: mean 3, binomial 99.5 % quantile 8


def test_the_test_conditions_on_what_the_real_policy_uses(norm):
    rng = np.random.default_rng(0)
    assert not uses_observations(policy_pairs(group(1, 12, "hold"), norm), rng)
    assert not uses_observations(policy_pairs(group(1, 12, "hold5"), norm), rng)
    assert uses_observations(policy_pairs(group(1, 12, "pd"), norm), rng)


def test_a_feedback_controller_is_another_policy(norm):
    """A PD controller's commands span the logs' range, but given the state they are determined:
    found in every check."""
    assert rejection_rate(norm, 10, "pd") == 1.0


def test_the_same_policy_on_the_same_plant_is_not_a_shift(norm):
    assert rejection_rate(norm, 60, "hold") <= 13 / 60


def test_effect_is_in_command_std_and_larger_for_feedback(norm):
    real = policy_pairs(group(1, 12, "hold"), norm)
    same = policy_shift_test(policy_pairs(group(2, 8, "hold"), norm), real, 0.05, np.random.default_rng(0))
    pd = policy_shift_test(policy_pairs(group(3, 8, "pd"), norm), real, 0.05, np.random.default_rng(0))
    # the logs' commands do not depend on the states, so "a given situation" is the previous command
    assert pd.effect > 2 * same.effect and pd.p_value <= 0.002 and same.p_value > 0.05
    assert set(pd.to_dict()) >= {"p_value", "effect_std", "shifted", "testable"}


def test_too_few_episodes_cannot_reach_the_level(norm):
    """2 checked and 2 real episodes have 6 splits: p >= 1/6 whatever the data, so the test says it
    was not run instead of answering `not shifted`."""
    res = policy_shift_test(
        policy_pairs(group(4, 2, "pd"), norm), policy_pairs(group(5, 2, "hold"), norm), 0.05, np.random.default_rng(0)
    )
    assert not res.testable and not res.shifted and "too few" in res.reason


def test_pairs_are_the_command_chosen_at_each_observation(norm):
    """conditions = (o_t, inputs during t, u_{t-1}), command = u_t, for t >= 1 (normalised)."""
    e = group(6, 1, "hold")[0]
    pairs = policy_pairs([e], norm, max_steps=1000)
    t = np.arange(1, e.num_steps)
    np.testing.assert_allclose(pairs.commands, norm.norm_action(e.actions[t]), rtol=1e-5)
    np.testing.assert_allclose(pairs.conditions[:, -1:], norm.norm_action(e.actions[t - 1]), rtol=1e-5)
    np.testing.assert_allclose(pairs.conditions[:, :2], norm.norm_obs(e.observations[t]), rtol=1e-5)
    assert (pairs.episode == e.id).all()
    assert len(policy_pairs([e], norm, max_steps=50)) == 50


def test_no_commands_no_test():
    e = Episode(np.zeros((11, 2), np.float32), np.zeros((10, 0), np.float32))
    assert policy_pairs([e], Normalizer.fit([e])) is None
    assert not policy_shift_test(None, None, 0.05, np.random.default_rng(0)).testable


def test_the_teams_declaration_decides_and_the_test_is_kept_for_information(norm):
    """`--checked-policy`: on a closed loop the test is approximate (module docstring), so a team
    that knows which controller chose the checked commands says so, and `shifted` follows it; the
    test's own outcome stays in `rejects` and in the report's sentence."""
    from wmcheck.checks.report_build import policy_sentence

    real_pd = policy_pairs(group(1, 12, "pd"), norm)
    hold = policy_pairs(group(2, 8, "hold"), norm)
    auto = policy_shift_test(hold, real_pd, 0.05, np.random.default_rng(0))
    assert auto.closed_loop and auto.rejects and auto.shifted  # held random commands against a PD loop
    assert "a closed loop" in policy_sentence(auto) and not auto.undetermined
    # the logs' own PD loop: the test does not reject, but on a closed loop it cannot tell (module
    # docstring), so undeclared the commands are taken as another policy's
    same = policy_shift_test(policy_pairs(group(7, 8, "pd"), norm), real_pd, 0.05, np.random.default_rng(0))
    assert same.closed_loop and not same.rejects and same.undetermined and same.shifted
    assert "does not tell" in policy_sentence(same) and "--checked-policy logs" in policy_sentence(same)
    logs = policy_shift_test(hold, real_pd, 0.05, np.random.default_rng(0), declared="logs")
    assert logs.rejects and not logs.shifted and logs.p_value == auto.p_value
    words = policy_sentence(logs)
    assert "--checked-policy logs" in words and f"p = {auto.p_value:.3g}" in words and "confounded" not in words
    real_hold = policy_pairs(group(3, 12, "hold"), norm)
    other = policy_shift_test(
        policy_pairs(group(4, 8, "hold"), norm), real_hold, 0.05, np.random.default_rng(0), declared="other"
    )
    assert not other.closed_loop and not other.rejects and other.shifted
    assert other.to_dict()["declared"] == "other" and "confounded with the policy" in policy_sentence(other)
    few = policy_shift_test(
        policy_pairs(group(5, 1, "hold"), norm),
        policy_pairs(group(6, 2, "hold"), norm),
        0.05,
        np.random.default_rng(0),
        declared="other",
    )
    assert not few.testable and few.shifted and "did not run" in policy_sentence(few)
