"""Policies and success rules for the closed-loop policy tests, importable as `policy_helpers:...`.

`swing_up` is an energy-shaping swing-up with a PD catch for Pendulum-v1 (observation
[cos theta, sin theta, theta_dot], theta = 0 upright): it pumps the pendulum's energy towards the
upright rest energy, then balances with PD feedback once it is near the top. `upright` is a success
rule on the recorded episode; `UprightPendulum` is Pendulum-v1 reporting `info["is_success"]`;
`NoisySwingUp` is the swing-up with held torque noise, for recording "real" logs around the policy.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

MAX_TORQUE = 2.0
# Pendulum-v1: theta'' = 3 g / (2 l) sin(theta) + 3 / (m l^2) u, g = 10, l = 1, m = 1.
GRAVITY_TERM = 15.0


def swing_up(obs) -> np.ndarray:
    c, s, w = (float(v) for v in np.asarray(obs, float).reshape(-1)[:3])
    theta = math.atan2(s, c)
    energy = 0.5 * w * w + GRAVITY_TERM * (math.cos(theta) - 1.0)  # 0 at rest upright, -30 at rest hanging
    if abs(theta) < 0.6 and abs(energy) < 8.0:
        u = -(10.0 * theta + 2.0 * w)  # PD catch near the top
    else:
        u = -0.5 * energy * (1.0 if w >= 0 else -1.0)  # pump energy: dE/dt = 3 u theta_dot
    return np.array([min(MAX_TORQUE, max(-MAX_TORQUE, u))], np.float32)


class NoisySwingUp:
    """`swing_up` plus Gaussian torque noise held for `hold` steps: an operator's controller with
    excitation, the kind of policy real logs are recorded under."""

    def __init__(self, std: float = 0.7, hold: int = 5, seed: int = 0):
        self.std, self.hold, self.rng, self.t, self.noise = std, hold, np.random.default_rng(seed), 0, 0.0

    def reset(self, seed: int) -> None:
        self.rng, self.t = np.random.default_rng([seed, 7]), 0

    def __call__(self, obs) -> np.ndarray:
        if self.t % self.hold == 0:
            self.noise = float(self.rng.normal(0.0, self.std))
        self.t += 1
        return np.clip(swing_up(obs) + self.noise, -MAX_TORQUE, MAX_TORQUE).astype(np.float32)


def _upright_tail(observations, steps: int = 20, tol: float = 0.3) -> bool:
    tail = np.asarray(observations, float)[-steps:]
    return bool(np.all(np.abs(np.arctan2(tail[:, 1], tail[:, 0])) < tol))


def upright(episode, info) -> bool:
    """Success: the pendulum stays within 0.3 rad of upright over the episode's last 20 rows."""
    return _upright_tail(episode.observations)


class UprightPendulum(gym.Wrapper):
    """Pendulum-v1 whose step info carries `is_success` (upright over the last 20 steps)."""

    def __init__(self, **kwargs):
        super().__init__(gym.make("Pendulum-v1", **kwargs))
        self._recent: list = []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._recent = [obs]
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self._recent = (self._recent + [obs])[-20:]
        info = dict(info, is_success=_upright_tail(self._recent))
        return obs, r, term, trunc, info


def idle(obs) -> np.ndarray:
    """No torque: the pendulum never comes up (a policy that fails its task)."""
    return np.zeros(1, np.float32)
