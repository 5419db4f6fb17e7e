"""Training end to end on a real simulator log: the loss falls, open loop beats persistence,
checkpoints load without pickle, and a killed run resumes where it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
        patience=0,
        stop_on="openloop",  # the best checkpoint by the open-loop metric (the default, the loss, is simpler)
        stop_windows=32,
    )
    result = train(pendulum_log, out, build_run_config(cfg))
    return result, cfg


def test_exported_model_is_the_best_checkpoint(trained):
    """model.pt holds the weights of the validation with the lowest monitored metric (here the
    held-out open-loop NRMSE), and training.json says which metric, which step and why training
    ended."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result, cfg = trained
    ea = EventAccumulator(str(result.run_dir / "tb"))
    ea.Reload()
    summary = json.loads((result.run_dir / "training.json").read_text())
    assert summary["monitor"] == "val/openloop_nrmse"
    val = {e.step: e.value for e in ea.Scalars(summary["monitor"])}
    assert len(val) == 2  # a validation every 200 of 400 steps
    best = torch.load(result.run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    # Lightning logs a validation at global_step - 1; the checkpoint after it holds global_step
    assert best["global_step"] - 1 == min(val, key=val.get)
    exported = torch.load(result.model_path, weights_only=True)["state_dict"]
    for k, v in best["state_dict"].items():
        assert torch.equal(exported[k.removeprefix("model.")], v), k
    assert summary["best_score"] == pytest.approx(min(val.values()), rel=1e-6)
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 400
    assert summary["exported_step"] == best["global_step"] == result.best_step


def test_quality_card_compares_with_arx_and_persistence(trained):
    """The card has one NRMSE per imagined step for the model and both baselines, coverages in
    [0, 1], the held-out episode count of the split, and it round-trips through quality.json."""
    from wmcheck.training.quality import read_card

    result, cfg = trained
    card = read_card(result.run_dir)
    assert card is not None and card.to_dict() == result.quality.to_dict()
    H = max(cfg.openloop_horizons)
    assert card.horizon == H and card.context == cfg.openloop_context
    for method in ("world_model", "arx", "persistence"):
        assert len(card.nrmse[method]) == H and all(np.isfinite(card.nrmse[method]))
    assert all(0 <= c <= 1 for c in card.coverage_raw)
    # the calibrated coverage is measured on held-out episodes the scale was not fitted on: it
    # needs two; this log holds out one, so the card says "not measured" (NaN) rather than a number
    calibrated = np.array(card.coverage_calibrated, float)
    assert np.isnan(calibrated).all() if card.heldout_episodes < 2 else ((calibrated >= 0) & (calibrated <= 1)).all()
    dm = LogDataModule(pendulum_log_path(result), cfg)
    dm.prepare()
    assert card.heldout_episodes == len(dm.val_ids) and card.train_episodes == len(dm.train_ids)
    # persistence cannot follow a swinging pendulum 16 steps ahead; the trained model can
    assert card.nrmse["world_model"][15] < card.nrmse["persistence"][15]
    c = card.competence(48)
    assert c.horizon == 48 and c.competent == (c.world_model < c.arx)


def pendulum_log_path(result):
    import json

    return json.loads((result.run_dir / "data.json").read_text())["log"]


@pytest.mark.parametrize("stop_on,metric", [("openloop", "val/openloop_nrmse"), ("loss", "val/loss/total")])
def test_early_stopping_ends_a_run_that_does_not_improve(stop_on, metric, pendulum_log, tmp_path):
    """With a learning rate too small to change the weights, no validation after the first is an
    improvement of either metric (both use the same draws at every validation): training stops
    after `patience` more validations, and that is a finished run."""
    cfg = TrainConfig(
        stop_on=stop_on,
        preset="debug",
        max_steps=1000,
        batch_size=4,
        seq_len=16,
        lr=1e-30,
        warmup=1,
        val_every=10,
        patience=2,
        progress_bar=False,
    )
    result = train(pendulum_log, tmp_path / "run", build_run_config(cfg))
    assert result.stop_reason == "early_stopping"
    assert result.steps == 30 and result.best_step == 10
    assert result.monitor == metric


def test_the_stop_windows_are_not_the_quality_cards(pendulum_log):
    """Selecting weights on the card's own windows would make the card optimistic: the early-stopping
    windows come from another stream (other starts in the same held-out episodes)."""
    from wmcheck.training.datamodule import LogDataModule

    dm = LogDataModule(pendulum_log, TrainConfig(seed=0, val_fraction=0.25))
    dm.prepare()
    card = dm.openloop_sequence(windows=16, length=40)
    stop = dm.openloop_sequence(windows=16, length=40, stream="stop")
    assert card.obs.shape == stop.obs.shape
    assert not torch.equal(card.obs, stop.obs)
    assert torch.equal(card.obs, dm.openloop_sequence(windows=16, length=40).obs)  # each stream is fixed


def test_the_openloop_metric_falls_back_to_the_loss_without_windows():
    from wmcheck.training.run import monitored_metric

    assert monitored_metric(TrainConfig(stop_on="openloop"), True) == "val/openloop_nrmse"
    assert monitored_metric(TrainConfig(stop_on="openloop"), False) == "val/loss/total"
    assert monitored_metric(TrainConfig(), True) == "val/loss/total"  # the default


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
    with pytest.raises(UserError, match="cannot read .*model.pt"):
        load_model(bad)


def _train_cmd(log, out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wmcheck.scripts.cli",
        "train",
        str(log),
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


def _start_and_wait_for_step(cmd, env, last, step_at_least: int = 40):
    """Start training in a child process and return it once a checkpoint of >= step_at_least exists."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 900  # a safety net for a hung child, not a speed assertion
    while time.monotonic() < deadline and proc.poll() is None:
        if last.exists():
            try:
                if int(torch.load(last, weights_only=True)["global_step"]) >= step_at_least:
                    break
            except Exception:  # being replaced right now
                pass
        time.sleep(0.2)
    assert proc.poll() is None, "training finished before it could be stopped; lower ckpt-every"
    return proc


def test_killed_run_resumes(pendulum_log, tmp_path):
    out = tmp_path / "run"
    cmd = _train_cmd(pendulum_log, out)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    last = out / "checkpoints" / "last.ckpt"
    proc = _start_and_wait_for_step(cmd, env, last)
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


def test_sigterm_saves_where_training_stopped_and_says_how_to_resume(pendulum_log, tmp_path):
    """SIGTERM (a scheduler's stop) ends with exit 143, one line naming the step and the
    checkpoint, that checkpoint holding exactly that step, and no model.pt; the same command
    resumes from there."""
    import re

    out = tmp_path / "run"
    cmd = _train_cmd(pendulum_log, out)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    last = out / "checkpoints" / "last.ckpt"
    proc = _start_and_wait_for_step(cmd, env, last)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 143, text
    m = re.search(r"stopped by SIGTERM at step (\d+); the resumable checkpoint \S+ holds step (\d+)", text)
    assert m and m.group(1) == m.group(2), text
    assert "run the same command again to resume" in text and "Traceback" not in text
    stopped_at = int(m.group(1))
    assert int(torch.load(last, weights_only=True)["global_step"]) == stopped_at
    assert not (out / "model.pt").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and f"resuming from {last} at step {stopped_at}" in done.stdout, done.stderr


def test_an_internal_error_has_its_own_exit_code_and_a_traceback_file(tmp_path, monkeypatch):
    """An unexpected exception is a bug in wmcheck: exit 4 (not 1, a check's "gap found"), one line
    on stderr naming the log file, and the traceback in that file."""
    from wmcheck.scripts import cli

    def boom(args):
        raise ZeroDivisionError("an injected bug")

    log = tmp_path / "x.h5"
    log.write_bytes(b"")
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser, boom))
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["validate", str(log)])
    assert code == 4
    line = err.getvalue()
    assert "internal error (a bug in wmcheck" in line and "ZeroDivisionError: an injected bug" in line
    path = Path(line.rsplit("traceback written to ", 1)[1].strip())
    assert path.exists() and "Traceback" in path.read_text() and "an injected bug" in path.read_text()
    path.unlink()


def _with_func(parser, func):
    """The parser with the `validate` subcommand's function replaced (an injected bug)."""
    sub = parser._subparsers._group_actions[0].choices["validate"]
    sub.set_defaults(func=func)
    return parser


def test_a_diverging_run_stops_with_a_clear_error(pendulum_log, tmp_path):
    """A learning rate that blows the weights up makes the loss non-finite: training stops before
    that step is applied and says so (a UserError, exit 2 from the CLI), instead of exporting an
    all-NaN model; a non-finite or non-positive --lr is refused before any work."""
    from wmcheck.datasets.errors import UserError

    cfg = TrainConfig(preset="debug", max_steps=50, batch_size=4, seq_len=16, lr=1e30, warmup=1, progress_bar=False)
    with pytest.raises(UserError, match="training diverged: the training loss is"):
        train(pendulum_log, tmp_path / "run", build_run_config(cfg))
    assert not (tmp_path / "run" / "model.pt").exists()
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match="lr must be a finite number > 0"):
            TrainConfig(lr=bad)


@pytest.mark.parametrize(
    "option,words",
    [
        (["--precision", "bogus"], "Precision 'bogus' is invalid"),
        (["--strategy", "bogus"], "invalid strategy name"),
        (["--devices", "x"], "--devices x"),
        (["--alpha", "2"], "alpha must be in (0, 1)"),
        (["--horizon", "1"], "horizon >= 2"),
        (["--lr", "nan"], "lr must be a finite number > 0"),
        (["--stop-on", "bogus"], "stop_on must be one of openloop, loss"),
        (["--min-improvement", "1"], "min_improvement must be in [0, 1)"),
    ],
)
def test_bad_training_options_are_refused_before_anything_is_written(option, words, pendulum_log, tmp_path, capsys):
    from wmcheck.scripts.cli import main

    out = tmp_path / "run"
    code = main(["train", str(pendulum_log), "--out", str(out), "--max-steps", "2", "--no-progress", *option])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err
    assert not out.exists()  # nothing was written: a corrected command starts clean


def _tiny(**kw) -> TrainConfig:
    return TrainConfig(
        **{
            **dict(
                preset="debug", max_steps=4, batch_size=4, seq_len=16, val_every=2, ckpt_every=2, progress_bar=False
            ),
            **kw,
        }
    )


def test_a_run_folder_is_locked_while_training_and_a_stale_lock_is_taken_over(pendulum_log, tmp_path):
    import socket

    from wmcheck.datasets.errors import UserError

    out = tmp_path / "run"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".train.lock").write_text(f"{sleeper.pid} {socket.gethostname()}")
        with pytest.raises(UserError, match=f"in use by another wmcheck train \\({sleeper.pid}"):
            train(pendulum_log, out, build_run_config(_tiny()))
        assert not (out / "config.json").exists()  # refused before anything was written
    finally:
        sleeper.kill()
        sleeper.wait()
    # the holder is gone (a kill): its lock is stale, the next train takes it over and removes it
    result = train(pendulum_log, out, build_run_config(_tiny()))
    assert result.steps == 4 and not (out / ".train.lock").exists()


def test_a_resume_with_another_split_or_log_is_refused_and_changes_nothing(pendulum_log, tmp_path):
    from wmcheck.datasets.errors import UserError

    out = tmp_path / "run"
    train(pendulum_log, out, build_run_config(_tiny()))
    before = {p.name: p.read_bytes() for p in (out / "config.json", out / "data.json")}
    with pytest.raises(UserError, match="another episode split \\(seed 0 -> 1\\)"):
        train(pendulum_log, out, build_run_config(_tiny(seed=1, max_steps=6)))
    with pytest.raises(UserError, match="another episode split \\(val_fraction 0.2 -> 0.3\\)"):
        train(pendulum_log, out, build_run_config(_tiny(val_fraction=0.3, max_steps=6)))
    other = tmp_path / "other.h5"
    other.write_bytes(Path(pendulum_log).read_bytes() + b"\0")  # the same episodes, another data hash
    with pytest.raises(UserError, match="trained on another log"):
        train(other, out, build_run_config(_tiny(max_steps=6)))
    assert {p.name: p.read_bytes() for p in (out / "config.json", out / "data.json")} == before
    # a schedule change is a resume, not another run
    assert train(pendulum_log, out, build_run_config(_tiny(max_steps=6, lr=5e-4))).steps == 6


def test_the_open_loop_context_fits_held_out_episodes_that_fall_within_a_window(tmp_path):
    """Hopper-v5 under held random torques falls within 7-40 steps: the asked 16 observed steps
    leave no window to imagine in. The data module fits its open-loop context to the median
    held-out episode when it is prepared (datasets.windows.fitted_geometry), so a module built from
    it (the Lightning path, without `train`) evaluates windows that are longer than their context,
    on many held-out episodes, not the one longest."""
    from wmcheck.checks.reality import RealityProfile, record_reality
    from wmcheck.datasets.episode import LogMeta
    from wmcheck.datasets.logformat import write_log
    from wmcheck.datasets.windows import MIN_HORIZON
    from wmcheck.training.module import WorldModelModule

    eps = record_reality("Hopper-v5", RealityProfile(), "hold:5", episodes=60, max_steps=200, seed=3)
    meta = LogMeta(
        source="real", dt=0.008, observation_names=[f"obs{i}" for i in range(11)], action_names=["a0", "a1", "a2"]
    )
    write_log(tmp_path / "hop.h5", eps, meta)
    dm = LogDataModule(tmp_path / "hop.h5", TrainConfig(preset="debug", seq_len=16, batch_size=8))
    dm.prepare()
    median = int(np.median(dm.val_lengths))
    assert median < 16 + MIN_HORIZON  # the asked context could not be observed and imagined from
    context = dm.cfg.openloop_context
    assert context < 16 and context + MIN_HORIZON <= median, (context, median)
    seq, which = dm.openloop_sequence(with_episodes=True)
    assert seq.obs.shape[1] == context + MIN_HORIZON and len(set(which.tolist())) >= len(dm.val_ids) // 3
    module = WorldModelModule.from_datamodule(dm)
    assert module.run_config.train.openloop_context == context
    res = evaluate_openloop(module.model, seq, context, (1, 4, 64))  # a context of 16 raised here
    assert len(res.step_nrmse) == MIN_HORIZON and np.isfinite(res.step_nrmse).all()
