"""Training end to end on a real simulator log: the loss falls, open loop beats persistence,
checkpoints load without pickle, and a killed run resumes where it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from wmcheck.datasets.normalize import Normalizer
from wmcheck.training.checkpoint import load_model
from wmcheck.training.config import TrainConfig
from wmcheck.training.datamodule import LogDataModule
from wmcheck.training.openloop import evaluate_openloop, horizon_metrics
from wmcheck.training.run import build_run_config, train


@pytest.fixture(scope="module")
def trained(pendulum_log, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(
        preset="debug",
        max_steps=400,
        batch_size=16,
        seq_len=32,
        lr=1e-3,
        warmup=50,
        val_every=200,
        ckpt_every=100,
        log_every=10,
        progress_bar=False,
        seed=0,
    )
    result = train(pendulum_log, out, build_run_config(cfg))
    return result, cfg


def test_loss_falls(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result, _ = trained
    ea = EventAccumulator(str(result.run_dir / "tb"), size_guidance={"scalars": 0})
    ea.Reload()
    total = [e.value for e in ea.Scalars("train/loss/total")]
    assert len(total) >= 10
    assert np.mean(total[-3:]) < 0.5 * np.mean(total[:3])
    tags = set(ea.Tags()["scalars"])
    for needed in (
        "train/kl/dyn",
        "train/entropy/post",
        "train/opt/grad_norm",
        "train/opt/update_rms",
        "val/loss/total",
        "openloop/nrmse_mean/h4",
        "openloop/coverage90_mean",
    ):
        assert needed in tags, needed
    assert any(t.startswith("openloop/") for t in ea.Tags()["images"])


def test_openloop_beats_persistence(trained, pendulum_log):
    result, cfg = trained
    bundle = load_model(result.run_dir)
    dm = LogDataModule(pendulum_log, cfg)
    dm.prepare()
    seq = dm.openloop_sequence(windows=32, length=16 + 32)
    torch.manual_seed(0)
    res = evaluate_openloop(bundle.model, seq, 16, (1, 4, 16, 32))
    truth = seq.obs[:, 16:].numpy()
    persistence = np.repeat(seq.obs[:, 15:16].numpy(), truth.shape[1], axis=1)
    base, _ = horizon_metrics(persistence, truth, (1, 4, 16, 32))
    model_err = res.nrmse.mean(1)
    base_err = base.mean(1)
    assert (model_err[1:] < base_err[1:]).all(), (model_err, base_err)


def test_model_file_loads_weights_only_and_rebuilds(trained):
    result, _ = trained
    payload = torch.load(result.model_path, weights_only=True)
    assert payload["format"] == "wmcheck-model" and len(payload["data_hash"]) == 64
    bundle = load_model(result.model_path)
    norm = Normalizer.from_dict(bundle.normalizer)
    assert norm.dims == (3, 1, 0)
    assert bundle.channels["observation_names"] == ["cos_theta", "sin_theta", "theta_dot"]
    assert bundle.run_config["model"]["obs_dim"] == 3
    # Lightning's resumable checkpoint also loads without pickle
    ckpt = torch.load(result.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 400 and "wmcheck" in ckpt


def test_bad_model_file_is_a_user_error(tmp_path):
    from wmcheck.datasets.errors import UserError

    bad = tmp_path / "model.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="cannot read model file"):
        load_model(bad)


def test_killed_run_resumes(pendulum_log, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "wmcheck.scripts.cli",
        "train",
        str(pendulum_log),
        "--out",
        str(out),
        "--max-steps",
        "150",
        "--ckpt-every",
        "20",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--val-every",
        "1000",
        "--no-progress",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    last = out / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 900  # a safety net for a hung child, not a speed assertion
    step = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if last.exists():
            try:
                step = int(torch.load(last, weights_only=True)["global_step"])
            except Exception:  # being replaced right now
                step = 0
            if step >= 40:
                break
        time.sleep(0.2)
    assert proc.poll() is None, "training finished before it could be killed; lower ckpt-every"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(torch.load(last, weights_only=True)["global_step"])  # the checkpoint survived the kill
    assert 40 <= killed_at < 150
    assert not (out / "model.pt").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from {last} at step {killed_at}" in done.stdout
    assert int(torch.load(last, weights_only=True)["global_step"]) == 150
    assert (out / "model.pt").exists()
