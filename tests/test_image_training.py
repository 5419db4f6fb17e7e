"""Training from pixels on a real MuJoCo log: streamed image windows, a falling image loss, the
open-loop video in TensorBoard, and a model that reloads from model.pt with its CNNs."""

from __future__ import annotations

import io

import numpy as np
import pytest  # noqa: F401  (fixtures from conftest)

from wmcheck.training.checkpoint import load_model
from wmcheck.training.openloop_video import video_grid


@pytest.fixture(scope="module")
def trained(pusher_pixel_run):
    return pusher_pixel_run


def test_image_loss_falls_and_video_is_logged(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(trained.run_dir / "tb"), size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    image = [e.value for e in ea.Scalars("train/loss/image")]
    assert len(image) >= 10
    # 16x16x3 = 768 pixels: a constant mid-grey prediction scores ~sum((0.5 - x)^2); the model must
    # go well below where it started
    assert np.mean(image[-3:]) < 0.6 * np.mean(image[:3]), image
    assert "openloop/video/image" in ea.Tags()["images"]
    gif = ea.Images("openloop/video/image")[-1].encoded_image_string
    from PIL import Image

    im = Image.open(io.BytesIO(gif))
    assert im.format == "GIF" and im.n_frames == 5 + 10  # context + imagined frames of the window


def test_model_reloads_with_its_cnns(trained):
    bundle = load_model(trained.run_dir)
    cfg = bundle.model.cfg
    assert cfg.image_keys == ["image"] and cfg.image_shape == [16, 16, 3] and cfg.cnn_mults == [2, 3]
    assert bundle.model.image_encoder is not None
    assert bundle.channels["image_keys"] == ["image"]


def test_video_grid_rows_and_borders():
    B, T, H, W = 2, 4, 3, 5
    truth = np.full((B, T, H, W, 3), 100, np.uint8)
    pred = truth.copy()
    pred[1, 3] = 140
    grid = video_grid(truth, pred, context=2)  # (T, 3 * (H + 2), B * (W + 2), 3)
    assert grid.shape == (T, 3 * (H + 2), B * (W + 2), 3)
    assert tuple(grid[0, 0, 0]) == (0, 200, 0) and tuple(grid[3, 0, 0]) == (220, 0, 0)  # context green, imagined red
    cell = lambda t, r, b: grid[t, r * (H + 2) + 1 : r * (H + 2) + 1 + H, b * (W + 2) + 1 : b * (W + 2) + 1 + W]  # noqa: E731
    assert (cell(3, 0, 1) == 100).all() and (cell(3, 1, 1) == 140).all()  # true / predicted rows
    assert (cell(3, 2, 1) == (140 - 100 + 255) // 2).all() and (cell(3, 2, 0) == 127).all()  # error row


def test_datamodule_streams_frames_and_no_images_ignores_them(pusher_pixel_log):
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.datamodule import LogDataModule

    cfg = TrainConfig(batch_size=3, seq_len=7, val_fraction=0.25)
    dm = LogDataModule(pusher_pixel_log, cfg)
    dm.prepare()
    assert dm.image_spec == {"image_keys": ["image"], "image_key_channels": [3], "image_shape": [16, 16, 3]}
    batch = next(iter(dm.train_dataloader()))
    assert batch.images["image"].shape == (3, 7, 16, 16, 3) and batch.obs.shape[:2] == (3, 7)
    assert dm._train_sampler._stream.images == {}  # frames stay in the file
    off = LogDataModule(pusher_pixel_log, TrainConfig(batch_size=3, seq_len=7, val_fraction=0.25, images=False))
    off.prepare()
    assert off.image_spec == {} and off.channels["image_keys"] == []
