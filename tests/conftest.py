"""Shared fixtures: small real-simulator logs recorded with gymnasium (no mocks)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

# One thread: these tiny recurrent models gain nothing from two, and two threads per process slow
# down by orders of magnitude as soon as another process shares the cores (CI machines are shared).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WMCHECK_THREADS", "1")


def record_pendulum(path, episodes: int = 12, steps: int = 200, hold: int = 5, seed: int = 0):
    """Pendulum-v1 under a random sample-and-hold torque (an exciting input), written as a real log."""
    import gymnasium as gym

    from wmcheck.datasets.episode import Episode, LogMeta
    from wmcheck.datasets.logformat import write_log

    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    eps = []
    for i in range(episodes):
        o, _ = env.reset(seed=seed * 1000 + i)
        obs, acts, rews = [o], [], []
        a = np.zeros(1, np.float32)
        for t in range(steps):
            if t % hold == 0:
                a = rng.uniform(-2, 2, size=(1,)).astype(np.float32)
            o, r, term, trunc, _ = env.step(a)
            obs.append(o)
            acts.append(a)
            rews.append(r)
        eps.append(Episode(np.array(obs, np.float32), np.array(acts, np.float32),
                           rewards=np.array(rews, np.float32), id=i))
    env.close()
    meta = LogMeta(source="real", dt=0.05, observation_names=["cos_theta", "sin_theta", "theta_dot"],
                   action_names=["torque"], units={"theta_dot": "rad/s", "torque": "N m"})
    write_log(path, eps, meta)
    return path


@pytest.fixture(scope="session")
def pendulum_log(tmp_path_factory):
    return record_pendulum(tmp_path_factory.mktemp("logs") / "pendulum.h5")
