"""Recording rendered camera frames (`wmcheck record --render WxH`) and the visual-gap wrapper."""

from __future__ import annotations

import os

import numpy as np
import pytest

from wmcheck.checks.reality import make_reality_env, record_reality, single_gap_profiles
from wmcheck.checks.reality_wrappers import VisualGap
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.record import parse_render_size, record_episodes, resize_frame
from wmcheck.scripts.cli import main


def test_cli_records_mujoco_frames(tmp_path, capsys):
    out = tmp_path / "pusher.h5"
    assert (
        main(
            [
                "record",
                "Pusher-v5",
                "--out",
                str(out),
                "--episodes",
                "2",
                "--max-steps",
                "12",
                "--policy",
                "hold:3",
                "--render",
                "16x12",
            ]
        )
        == 0
    )
    assert "frames 16x12" in capsys.readouterr().out
    assert os.environ.get("MUJOCO_GL")  # set by the recorder when unset
    with open_log(out) as log:
        ep = log.read(1)
        assert log.group_specs(1) == {"image": ((12, 16, 3), np.dtype(np.uint8))}
    frames = ep.obs_groups["image"]  # (N+1, H, W, C)
    assert frames.shape == (13, 12, 16, 3) and frames.dtype == np.uint8
    assert ep.observations.shape == (13, 23)  # Pusher-v5: 23-d state
    assert frames.std() > 5  # a scene, not a blank frame
    assert np.abs(np.diff(frames.astype(int), axis=0)).sum() > 0  # the arm moves between frames


def test_frames_replay_with_the_seed_whatever_the_recording_started_with():
    """The same episode seed gives the same frames, whether it is a recording's first episode or its
    third (gymnasium's MuJoCo camera aims at the first rendered state: the recorder fixes that state)."""
    a = record_episodes("Pusher-v5", "hold:3", episodes=3, max_steps=10, seed=1, render=(16, 16))[2]
    b = record_episodes("Pusher-v5", "hold:3", episodes=1, max_steps=10, seed=3, render=(16, 16))[0]
    np.testing.assert_array_equal(a.observations, b.observations)
    np.testing.assert_array_equal(a.obs_groups["image"], b.obs_groups["image"])


def test_resize_and_size_parsing():
    frame = np.zeros((8, 8, 3), np.uint8)
    frame[:4] = 200
    small = resize_frame(frame, (4, 2))  # (W, H) = (4, 2)
    assert small.shape == (2, 4, 3) and small[0].min() == 200 and small[1].max() == 0
    assert parse_render_size("64x48") == (64, 48)
    for bad in ("64", "0x5", "ax4"):
        with pytest.raises(UserError, match="WxH"):
            parse_render_size(bad)


def test_env_without_rgb_frames_is_refused(tmp_path, monkeypatch):
    (tmp_path / "blind_env.py").write_text(
        "import gymnasium as gym, numpy as np\n"
        "class Blind(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)\n"
        "    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)\n"
        "    def reset(self, seed=None, options=None):\n"
        "        return np.zeros(1, np.float32), {}\n"
        "    def step(self, a):\n"
        "        return np.zeros(1, np.float32), 0.0, False, False, {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="rgb_array"):
        record_episodes("blind_env:Blind", episodes=1, max_steps=3, render=(16, 16))


def _frames(profile, seed=0):
    return record_reality("Pusher-v5", profile, "hold:3", episodes=1, max_steps=8, seed=seed, render=(16, 16))[0]


def test_visual_gap_changes_frames_only():
    clean = _frames({})
    for profile, check in [
        ({"visual_brightness": 1.3}, lambda x, y: y.mean() > 1.15 * x.mean()),
        (
            {"visual_colour": [1.0, 1.0, 0.5]},
            lambda x, y: y[..., 2].mean() < 0.6 * x[..., 2].mean() and np.array_equal(x[..., 0], y[..., 0]),
        ),
        (
            {"visual_blur": 1.5},
            lambda x, y: (
                np.abs(np.diff(y.astype(float), axis=2)).mean() < 0.8 * np.abs(np.diff(x.astype(float), axis=2)).mean()
            ),
        ),
        ({"visual_noise_std": 10.0}, lambda x, y: 6 < (y.astype(float) - x).std() < 12),
    ]:
        gap = _frames(profile)
        np.testing.assert_array_equal(gap.observations, clean.observations)  # states untouched
        np.testing.assert_array_equal(gap.actions, clean.actions)
        assert check(clean.obs_groups["image"], gap.obs_groups["image"]), profile
    env = make_reality_env("Pusher-v5", {"visual_blur": 1.0}, render_mode="rgb_array", width=16, height=16)
    _, info = env.reset(seed=0)
    assert info["reality"]["visual"]["blur"] == 1.0
    env.close()


def test_visual_gap_validation_and_profiles():
    with pytest.raises(UserError, match="brightness"):
        VisualGap(make_reality_env("Pendulum-v1"), brightness=-1.0)
    with pytest.raises(UserError, match=">= 0"):
        single_gap_profiles("visual_blur", [-1.0])[0]
    profiles = single_gap_profiles("visual_brightness", [0.0, 0.3])
    assert profiles[0].visual_brightness is None and profiles[1].visual_brightness == pytest.approx(1.3)
    assert "visual brightness 1.3" in profiles[1].describe()
