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


def record_reacher_pixels(path, episodes: int = 24, size: int = 16, seed: int = 0, profile: dict | None = None,
                          source: str = "real"):
    """Reacher-v5 (MuJoCo) with rendered camera frames (size x size) under random held torques,
    through a `wmcheck.checks.reality` profile (e.g. a visual gap); 50 steps per episode."""
    from wmcheck.checks.reality import reality_env_args
    from wmcheck.datasets.record import record_to_log

    rid, kw = reality_env_args("Reacher-v5", profile or {})
    record_to_log(path, rid, "hold:3", episodes=episodes, seed=seed, env_kwargs=kw, source=source, render=(size, size))
    return path


@pytest.fixture(scope="session")
def reacher_pixel_log(tmp_path_factory):
    return record_reacher_pixels(tmp_path_factory.mktemp("pixels") / "reacher_real.h5")


@pytest.fixture(scope="session")
def reacher_pixel_run(reacher_pixel_log, tmp_path_factory):
    """A debug world model trained on the pixel log (frames + vector state), calibrated for blocks of 8 + 16."""
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.config import CheckConfig
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    out = tmp_path_factory.mktemp("pixel_run")
    cfg = TrainConfig(preset="debug", max_steps=200, batch_size=8, seq_len=16, lr=1e-3, warmup=20,
                      val_every=200, ckpt_every=200, log_every=5, progress_bar=False, seed=0, val_fraction=0.25,
                      openloop_context=5, openloop_horizons=(1, 4, 10), openloop_windows=4)
    result = train(reacher_pixel_log, out, build_run_config(cfg))
    calibrate(out, reacher_pixel_log, CheckConfig(context=8, horizon=16), verbose=False)
    return result


@pytest.fixture(scope="session")
def reacher_pixel_recorder():
    """`record_reacher_pixels` for tests that record their own (e.g. gap-injected) pixel logs."""
    return record_reacher_pixels
