"""The visual gap check: real-vs-real calibration in the world model's image embedding, a
brightness-shifted simulator told apart from a faithful one, photometric explanations, the CLIP
path on a tiny random-weights CLIP built here, and the report's visual row end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wmcheck.checks.clip_embedding import practice_band
from wmcheck.checks.visual import STATS, VisualCalibration, _photometric_shift, photometric, visual_gap
from wmcheck.datasets.logformat import open_log
from wmcheck.training.checkpoint import load_model


@pytest.fixture(scope="module")
def sims(tmp_path_factory, pusher_pixel_recorder):
    """Checked simulators: faithful (new seeds) and with brighter rendering (x1.3), same dynamics."""
    record_pusher_pixels = pusher_pixel_recorder
    d = tmp_path_factory.mktemp("sims")
    faithful = record_pusher_pixels(d / "faithful.h5", episodes=8, seed=500, source="sim")
    bright = record_pusher_pixels(
        d / "bright.h5", episodes=8, seed=500, source="sim", profile={"visual_brightness": 1.3}
    )
    return faithful, bright


def _episodes(path):
    with open_log(path) as log:
        return list(log)


def test_photometric_statistics_and_wording():
    rng = np.random.default_rng(0)
    real = rng.integers(90, 110, size=(40, 8, 8, 3)).astype(np.uint8)
    real_eps = np.repeat(np.arange(4), 10)
    stats = photometric(real)  # (40, 6)
    assert stats.shape == (40, len(STATS))
    np.testing.assert_allclose(stats[:, 0], (real.astype(float) @ [0.299, 0.587, 0.114]).mean((1, 2)))
    brighter = np.clip(real.astype(float) * 1.32, 0, 255).round().astype(np.uint8)
    out = _photometric_shift(brighter, real_eps, real, real_eps)
    assert out["explains"][0].startswith("simulated frames 32% brighter")
    assert out["relative_change"]["luminance"] == pytest.approx(0.32, abs=0.005)
    same = _photometric_shift(real[::-1].copy(), real_eps, real, real_eps)  # the same frames: nothing to explain
    assert same["explains"] == []
    blurred = real.copy()
    blurred[:] = real.mean((1, 2), keepdims=True).astype(np.uint8)
    assert any("blurrier" in s for s in _photometric_shift(blurred, real_eps, real, real_eps)["explains"])


def test_visual_calibration_is_stored(pusher_pixel_run):
    cal = VisualCalibration.load(pusher_pixel_run.run_dir)
    assert cal is not None and cal.keys == ["image"]
    assert cal.frames["image"].dtype == np.uint8 and cal.frames["image"].shape[1:] == (16, 16, 3)
    assert cal.reference["image"].shape[1:] == (16, 16, 3) and len(cal.reference["image"]) > len(cal.frames["image"])
    assert len(np.unique(cal.episode)) >= 5 and len(cal.null) == len(
        np.unique(cal.episode)
    )  # short episodes: one segment each
    # a 16x16 frame can repeat one of the reference exactly (distance 0), but not typically
    assert np.median(cal.frame_set) > 0 and (cal.frame_step >= cal.frame_set).all()


def test_brightness_shift_is_separated_from_a_faithful_sim(pusher_pixel_run, sims):
    model = load_model(pusher_pixel_run.run_dir).model
    cal = VisualCalibration.load(pusher_pixel_run.run_dir)
    faithful, bright = sims
    ok = visual_gap(model, cal, _episodes(faithful), alpha=0.05)
    bad = visual_gap(model, cal, _episodes(bright), alpha=0.05)
    assert ok["verdict"] == "absent", ok["explanation"]
    assert bad["verdict"] == "present", bad["explanation"]
    assert bad["evidence"] > ok["evidence"] and bad["estimate"]["distance_ratio"] > ok["estimate"]["distance_ratio"]
    assert "brighter" in bad["explanation"] and "brighter" not in ok["explanation"]
    assert bad["estimate"]["photometric"]["image"]["relative_change"]["luminance"] == pytest.approx(0.3, abs=0.05)


def test_no_frames_means_not_checked(pusher_pixel_run):
    model = load_model(pusher_pixel_run.run_dir).model
    row = visual_gap(model, None, [], alpha=0.05)
    assert row["verdict"] == "not_checked" and "calibrat" in row["explanation"]


def test_clip_practice_bands():
    assert "stable" in practice_band(0.1) and "watch" in practice_band(0.22)
    assert "intervention" in practice_band(0.27) and "randomisation" in practice_band(0.35)


def tiny_clip(tmp_path):
    """A random-weights CLIP vision tower with projection, saved as local files (no download)."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=16,
    )
    path = tmp_path / "tiny-clip"
    transformers.CLIPVisionModelWithProjection(cfg).save_pretrained(path)
    return path


def test_clip_path_end_to_end(pusher_pixel_run, sims, tmp_path):
    path = tiny_clip(tmp_path)
    from wmcheck.checks.clip_embedding import ClipEmbedder

    clip = ClipEmbedder.load(path)
    frames = VisualCalibration.load(pusher_pixel_run.run_dir).frames["image"][:10]
    emb = clip.embed(frames)
    assert emb.shape == (10, 16)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    model = load_model(pusher_pixel_run.run_dir).model
    cal = VisualCalibration.load(pusher_pixel_run.run_dir)
    faithful, bright = sims
    rows = [visual_gap(model, cal, _episodes(p), alpha=0.05, clip=clip) for p in (faithful, bright)]
    for row in rows:
        c = row["estimate"]["clip"]
        assert c["model"].startswith("transformers:") and 0 <= c["mean_cosine_distance"] <= 2
        assert c["practice_thresholds"] == {"stable_below": 0.2, "intervention_above": 0.25, "randomise_above": 0.3}
        assert "CLIP mean cosine distance" in row["explanation"]
    assert rows[1]["estimate"]["clip"]["set_cosine_distance"] > rows[0]["estimate"]["clip"]["set_cosine_distance"]


def test_clip_missing_weights_is_a_user_error(tmp_path):
    from wmcheck.checks.clip_embedding import ClipEmbedder
    from wmcheck.datasets.errors import UserError

    with pytest.raises(UserError, match="does not exist"):
        ClipEmbedder.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="config.json"):
        ClipEmbedder.load(tmp_path / "empty")


def test_check_report_has_the_visual_row(pusher_pixel_run, sims, tmp_path):
    """`wmcheck check` end to end: a brightness-shifted simulator fails with the visual gap on top,
    the report validates against its schema, the HTML shows the row and TensorBoard the video."""
    jsonschema = pytest.importorskip("jsonschema")
    from wmcheck.checks.report_write import schema
    from wmcheck.scripts.cli import main

    _, bright = sims
    args = ["check", str(pusher_pixel_run.run_dir), "--rollouts", str(bright), "--out", str(tmp_path / "rep")]
    try:
        clip_args = ["--clip-model", str(tiny_clip(tmp_path))]
    except pytest.skip.Exception:
        clip_args = []
    assert main(args + clip_args) == 1
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    jsonschema.validate(report, schema())
    vis = report["gaps"]["visual"]
    assert vis["verdict"] == "present" and "brighter" in vis["explanation"]
    assert report["summary"]["top_gap"] in ("visual", "none")
    if clip_args:
        assert vis["estimate"]["clip"]["mean_cosine_distance"] >= 0
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "brighter" in html
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "rep" / "tb"), size_guidance={"images": 0})
    ea.Reload()
    assert "check/openloop_video/image" in ea.Tags()["images"]


def test_too_few_segments_is_not_a_pass(pusher_pixel_run, sims):
    """With one checked episode against few real ones the rank test cannot reach alpha: the row says
    so (not_checked) instead of reporting the gap absent, even for a strongly shifted simulator."""
    model = load_model(pusher_pixel_run.run_dir).model
    cal = VisualCalibration.load(pusher_pixel_run.run_dir)
    _, bright = sims
    row = visual_gap(model, cal, _episodes(bright)[:1], alpha=0.001)
    assert row["verdict"] == "not_checked" and "smallest attainable p" in row["explanation"]
    assert row["estimate"]["distance_ratio"] > 1.5


def test_gate_tolerance_turns_a_small_visual_gap_amber(pusher_pixel_run, sims):
    model = load_model(pusher_pixel_run.run_dir).model
    cal = VisualCalibration.load(pusher_pixel_run.run_dir)
    _, bright = sims
    eps = _episodes(bright)
    strict = visual_gap(model, cal, eps, alpha=0.05, tolerance={"max_distance_ratio": 1.01})
    loose = visual_gap(model, cal, eps, alpha=0.05, tolerance={"max_distance_ratio": 1e6})
    assert strict["verdict"] == "present" and loose["verdict"] == "tolerated"
    from wmcheck.datasets.errors import UserError

    with pytest.raises(UserError, match="max_distance_ratio"):
        visual_gap(model, cal, eps, alpha=0.05, tolerance={"max_ratio": 2})
