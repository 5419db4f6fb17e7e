"""Shared fixtures: small real-simulator logs recorded with gymnasium (no mocks)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# One thread: these tiny recurrent models gain nothing from two, and two threads per process slow
# down by orders of magnitude as soon as another process shares the cores (CI machines are shared).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WMCHECK_THREADS", "1")
# The helpers beside the tests (`browser`, `policy_helpers`) import by name; pytest's importlib mode
# does not put this folder on sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))


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
        eps.append(
            Episode(np.array(obs, np.float32), np.array(acts, np.float32), rewards=np.array(rews, np.float32), id=i)
        )
    env.close()
    meta = LogMeta(
        source="real",
        dt=0.05,
        observation_names=["cos_theta", "sin_theta", "theta_dot"],
        action_names=["torque"],
        units={"theta_dot": "rad/s", "torque": "N m"},
    )
    write_log(path, eps, meta)
    return path


# Session fixtures that train a model (minutes each). Under pytest-xdist (`make test` runs
# `pytest -n auto --dist loadgroup`) every test that uses one of them runs on the same worker, so
# each is trained once; every other test stays with its module (module fixtures are built once too).
TRAINED_SESSION_FIXTURES = ("pendulum_checked", "pusher_pixel_run")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = next((f for f in TRAINED_SESSION_FIXTURES if f in item.fixturenames), None)
        item.add_marker(pytest.mark.xdist_group(shared or item.module.__name__))


@pytest.fixture(scope="session")
def pendulum_log(tmp_path_factory):
    return record_pendulum(tmp_path_factory.mktemp("logs") / "pendulum.h5")


def light_check_config():
    """Coarser search grids than the defaults keep each check to seconds on a CI CPU; they still
    contain the sizes the tests inject (gain 0.5) and the identity."""
    from wmcheck.checks.config import CheckConfig

    return CheckConfig(
        gain_grid=(0.3, 0.5, 0.8, 1.0, 1.25, 2.0),
        offset_grid=(-0.5, 0.0, 0.5),
        deadband_grid=(0.0, 0.25),
        max_delay=3,
        bootstrap=200,
    )


def train_and_calibrate(tmp, real_log, steps: int, extra_real: list | None = None):
    """A `debug` world model trained on `real_log` for `steps` steps, calibrated with the light config
    on the log's validation split and every episode of the `extra_real` logs."""
    from wmcheck.checks.calibration import calibrate
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    run = tmp / "run"
    cfg = TrainConfig(
        preset="debug",
        max_steps=steps,
        seq_len=32,
        batch_size=32,
        lr=1e-3,
        warmup=100,
        val_every=steps,
        ckpt_every=steps,
        progress_bar=False,
        seed=0,
    )
    train(real_log, run, build_run_config(cfg))
    calibrate(run, real_log, light_check_config(), verbose=False, extra_real=extra_real)
    return run


@pytest.fixture(scope="session")
def light_config():
    return light_check_config()


@pytest.fixture(scope="session")
def check_trainer():
    return train_and_calibrate


@pytest.fixture(scope="session")
def pendulum_checked(tmp_path_factory):
    """The checks' "reality": Pendulum-v1 logs (40 episodes of 200 steps, hold:5 torques) and a debug
    world model trained on them (2000 steps), calibrated on the 6 held-out episodes of that log and
    12 more real episodes it never trained on (`calibrate --real`, as the docs advise: 6 episodes
    leave the attribution tests too little power; with them alone a x0.3 actuator gain was an
    unattributed divergence, evidence 0.94, on one install and attributed on another). Trained once
    per session, shared by the check tests and the policy tests. Returns (run, meta, tmp)."""
    from wmcheck.checks.reality import RealityProfile, record_reality
    from wmcheck.datasets.episode import LogMeta
    from wmcheck.datasets.logformat import write_log

    tmp = tmp_path_factory.mktemp("pendulum")
    eps = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=40, max_steps=200, seed=0)
    meta = LogMeta(
        source="real", dt=0.05, observation_names=["cos_theta", "sin_theta", "theta_dot"], action_names=["torque"]
    )
    write_log(tmp / "real.h5", eps, meta)
    extra = record_reality("Pendulum-v1", RealityProfile(), "hold:5", episodes=12, max_steps=200, seed=100_000)
    write_log(tmp / "real_extra.h5", extra, meta)
    return train_and_calibrate(tmp, tmp / "real.h5", 2000, extra_real=[tmp / "real_extra.h5"]), meta, tmp


def record_pusher_pixels(
    path, episodes: int = 24, size: int = 16, seed: int = 0, profile: dict | None = None, source: str = "real"
):
    """Pusher-v5 (MuJoCo) with rendered camera frames (size x size) under random held torques,
    through a `wmcheck.checks.reality` profile (e.g. a visual gap); 50 steps per episode."""
    from wmcheck.checks.reality import reality_env_args
    from wmcheck.datasets.record import record_to_log

    rid, kw = reality_env_args("Pusher-v5", profile or {})
    record_to_log(
        path,
        rid,
        "hold:3",
        episodes=episodes,
        max_steps=50,
        seed=seed,
        env_kwargs=kw,
        source=source,
        render=(size, size),
    )
    return path


@pytest.fixture(scope="session")
def pusher_pixel_log(tmp_path_factory):
    return record_pusher_pixels(tmp_path_factory.mktemp("pixels") / "pusher_real.h5")


@pytest.fixture(scope="session")
def pusher_pixel_run(pusher_pixel_log, tmp_path_factory):
    """A debug world model trained on the pixel log (frames + vector state), calibrated for blocks of 8 + 16."""
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.config import CheckConfig
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    out = tmp_path_factory.mktemp("pixel_run")
    cfg = TrainConfig(
        preset="debug",
        max_steps=200,
        batch_size=8,
        seq_len=16,
        lr=1e-3,
        warmup=20,
        val_every=200,
        ckpt_every=200,
        log_every=5,
        progress_bar=False,
        seed=0,
        val_fraction=0.25,
        openloop_context=5,
        openloop_horizons=(1, 4, 10),
        openloop_windows=4,
    )
    result = train(pusher_pixel_log, out, build_run_config(cfg))
    calibrate(out, pusher_pixel_log, CheckConfig(context=8, horizon=16), verbose=False)
    return result


@pytest.fixture(scope="session")
def pusher_pixel_recorder():
    """`record_pusher_pixels` for tests that record their own (e.g. gap-injected) pixel logs."""
    return record_pusher_pixels
