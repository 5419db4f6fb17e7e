"""Closed-loop rollouts inside the world model: row alignment, who acts on what, stateful policies.

A real (untrained, `debug`) world model and real Pendulum-v1 episodes: the alignment of observed
rows, commands, rewards and the end of each episode does not depend on training.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmcheck.checks.policy_rollout import ClosedLoopConfig, closed_loop
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.record import Recorder
from wmcheck.worldmodel.config import preset
from wmcheck.worldmodel.model import WorldModel

C = 5


class Tracking:
    """A stateless PD-like policy that remembers every observation it was given."""

    def __init__(self):
        self.seen = []

    def __call__(self, obs):
        self.seen.append(np.array(obs, np.float32))
        return np.clip(np.array([-2.0 * obs[1] - 0.5 * obs[2]], np.float32), -2, 2)


class Counter:
    """A stateful policy: its action counts the calls since its last reset."""

    def __init__(self):
        self.t = 0

    def reset(self, seed):
        self.t = 0

    def __call__(self, obs):
        self.t += 1
        return np.array([min(2.0, 0.1 * self.t)], np.float32)


@pytest.fixture(scope="module")
def setting():
    torch.manual_seed(0)
    with Recorder("Pendulum-v1", "random", seed=1, max_steps=12) as rec:
        eps = [rec.episode(0), rec.episode(1)]
    with Recorder("Pendulum-v1", "random", seed=1, max_steps=9) as rec:
        eps.append(rec.episode(2))  # a shorter episode: padded, never imagined past its end
    norm = Normalizer.fit(eps)
    model = WorldModel(preset("debug", obs_dim=3, action_dim=1, input_dim=0)).eval()
    with torch.no_grad():
        model.cont.out.bias.fill_(8.0)  # an untrained continue head says 50%: make it predict "continue"
    return eps, norm, model


def test_rows_commands_rewards_align(setting):
    eps, norm, model = setting
    policy = Tracking()
    with Recorder("Pendulum-v1", policy) as rec:
        cl = closed_loop(model, norm, eps, policy, rec.codec, rec.env, C, ClosedLoopConfig(samples=3, chunk=4))
    n, S, T = len(eps), 3, 13
    assert cl.obs.shape == (n, S, T, 3) and cl.actions.shape == (n, S, T - 1, 1) and cl.rewards.shape == (n, S, T - 1)
    for i, e in enumerate(eps):
        N = e.num_steps
        for s in range(S):
            np.testing.assert_array_equal(cl.obs[i, s, :C], e.observations[:C])  # observed context rows
            np.testing.assert_array_equal(cl.actions[i, s, :C], e.actions[:C])  # the logged commands up to a_{C-1}
            np.testing.assert_array_equal(cl.rewards[i, s, : C - 1], e.rewards[: C - 1])  # shared rewards
            assert np.isfinite(cl.obs[i, s, : N + 1]).all() and np.isnan(cl.obs[i, s, N + 1 :]).all()
            assert np.isfinite(cl.actions[i, s, :N]).all() and np.isnan(cl.actions[i, s, N:]).all()
            assert cl.alive[i, s, :N].all() and not cl.alive[i, s, N:].any()
            assert not np.allclose(cl.obs[i, s, C : N + 1], e.observations[C : N + 1])  # imagined, not copied
    np.testing.assert_allclose(cl.returns(), np.where(cl.alive, cl.rewards, 0).sum(-1))
    # the policy acted on the model's predicted rows C .. N - 1 (row C is reached under the logged a_{C-1}),
    # and each of its actions is the stored command of that row
    imagined = [cl.obs[i, s, t] for i, e in enumerate(eps) for s in range(S) for t in range(C, e.num_steps)]
    assert len(policy.seen) == len(imagined)
    for row in imagined:
        assert any(np.allclose(row, seen, atol=1e-6) for seen in policy.seen)
    a = cl.actions[0, 0, C]
    np.testing.assert_allclose(a, np.clip(-2.0 * cl.obs[0, 0, C, 1] - 0.5 * cl.obs[0, 0, C, 2], -2, 2), atol=1e-5)
    # latent draws differ between the rollouts of one episode
    assert not np.allclose(cl.obs[0, 0, C + 3 :], cl.obs[0, 1, C + 3 :])


def test_predicted_termination_ends_the_imagined_episode(setting):
    eps, norm, model = setting
    with Recorder("Pendulum-v1", "random") as rec:
        with torch.no_grad():
            model.cont.out.bias.fill_(-8.0)  # the continue head now predicts termination everywhere
        try:
            cl = closed_loop(
                model,
                norm,
                eps[:1],
                lambda o: np.zeros(1, np.float32),
                rec.codec,
                rec.env,
                C,
                ClosedLoopConfig(samples=2),
            )
        finally:
            with torch.no_grad():
                model.cont.out.bias.fill_(8.0)
    # the step into row C still counts (its reward arrives with the terminal state), nothing after it
    assert cl.alive[0, :, :C].all() and not cl.alive[0, :, C:].any()
    assert (cl.rewards[0, :, C:] == 0).all()
    np.testing.assert_allclose(cl.returns()[0], cl.rewards[0, :, :C].sum(-1))


def test_stateful_policy_gets_one_reset_copy_per_rollout(setting):
    eps, norm, model = setting
    policy = Counter()
    with Recorder("Pendulum-v1", policy) as rec:
        cl = closed_loop(model, norm, eps[:2], policy, rec.codec, rec.env, C, ClosedLoopConfig(samples=2))
    # every rollout's own copy counts 1, 2, 3, ... from row C on; the original is untouched
    for i in range(2):
        for s in range(2):
            np.testing.assert_allclose(cl.actions[i, s, C:12, 0], 0.1 * np.arange(1, 12 - C + 1), atol=1e-6)
    assert policy.t == 0


def test_errors(setting):
    eps, norm, model = setting
    with Recorder("Pendulum-v1", "random") as rec:
        with pytest.raises(UserError, match="fewer than 20 steps"):
            closed_loop(model, norm, eps, lambda o: np.zeros(1, np.float32), rec.codec, rec.env, 20)

        def broken(obs):
            raise ValueError("boom")

        with pytest.raises(UserError, match="the policy failed on a model-predicted observation.*boom"):
            closed_loop(model, norm, eps, broken, rec.codec, rec.env, C)
    with pytest.raises(ValueError, match="samples"):
        ClosedLoopConfig(samples=1)
