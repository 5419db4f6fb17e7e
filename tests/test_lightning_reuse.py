"""The Lightning pieces in a user's own Trainer, and what TensorBoard shows of a run and of a check.

The example script (scripts/example_lightning.py) trains with a plain `lightning.Trainer` and
reloads with `load_from_checkpoint` from the checkpoint alone (weights_only=True); a run's
hyper-parameters are in the HParams plugin of its own run folder; a check is one TensorBoard run;
a run shorter than the validation interval still has val/* and openloop/*; the training progress
counts steps of max_steps, a bar on a terminal and sparse lines in a log.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from wmcheck.training.config import TrainConfig
from wmcheck.training.datamodule import LogDataModule
from wmcheck.training.module import WorldModelModule


def _events(logdir: Path) -> EventAccumulator:
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def _event_dirs(root: Path) -> set[Path]:
    """Every folder under root holding an event file: each is a run in TensorBoard's list."""
    return {p.parent for p in root.rglob("events.out.tfevents.*")}


def _hparams(ea: EventAccumulator) -> dict:
    """The HParams plugin's session-start parameters of a run ({} when the plugin has no data)."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = ea.PluginTagToContent("hparams")
    if "_hparams_/session_start_info" not in content:
        return {}
    ssi = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in ssi.hparams.items()}


def _metric_tags(ea: EventAccumulator) -> list[str]:
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    exp = HParamsPluginData.FromString(ea.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    return [m.name.tag for m in exp.metric_infos]


@pytest.fixture(scope="module")
def example_run(pendulum_log, tmp_path_factory):
    """scripts/example_lightning.py on the small Pendulum log: 12 steps of a user's plain Trainer."""
    from wmcheck.scripts.example_lightning import main

    out = tmp_path_factory.mktemp("example")
    res = main([str(pendulum_log), "--out", str(out), "--max-steps", "12", "--batch-size", "4", "--seq-len", "16"])
    return res, out


def test_the_example_reloads_the_trained_module_from_its_checkpoint_alone(example_run):
    """load_from_checkpoint with no other argument rebuilds the module: the same weights, the same
    config, normaliser and channels, and it predicts (finite open-loop errors, the same predictions
    as the trained module under the same random numbers). The checkpoint loads without pickle and
    its hyper-parameters are plain JSON-able values."""
    res, _ = example_run
    trained, reloaded = res["module"].cpu(), res["reloaded"]
    assert res["trainer"].global_step == 12
    assert isinstance(reloaded, WorldModelModule)
    mine, theirs = trained.state_dict(), reloaded.state_dict()
    assert mine.keys() == theirs.keys()
    for k, v in mine.items():
        assert torch.equal(v, theirs[k]), k
    assert reloaded.run_config.to_dict() == trained.run_config.to_dict()
    assert reloaded.normalizer == trained.normalizer and reloaded.channels == trained.channels
    assert reloaded.data_hash == trained.data_hash and len(reloaded.data_hash) == 64

    ckpt = torch.load(res["checkpoint"], weights_only=True)  # no pickled objects
    json.dumps(ckpt["hyper_parameters"])
    json.dumps(ckpt["datamodule_hyper_parameters"])
    assert set(ckpt["hyper_parameters"]) == {"run_config", "normalizer", "channels", "data_hash"}
    again = WorldModelModule.load_from_checkpoint(res["checkpoint"], map_location="cpu")  # the default load
    assert torch.equal(next(iter(again.state_dict().values())), next(iter(theirs.values())))

    result = res["openloop"]
    assert result is not None and np.isfinite(result.nrmse[0]).all()
    dm = LogDataModule.load_from_checkpoint(res["checkpoint"], weights_only=True)
    dm.prepare()
    seq = dm.openloop_sequence(windows=4)
    preds = []
    for m in (trained, reloaded):
        torch.manual_seed(0)
        preds.append(m.model.openloop(seq, 16)["mean"])
    assert torch.isfinite(preds[0]).all() and torch.equal(preds[0], preds[1])


def test_the_example_run_has_hparams_and_an_evaluation_at_its_end(example_run):
    """A plain Trainer never reaches Lightning's end-of-epoch validation (the epoch is endless): the
    module evaluates once when training ends, so val/* and openloop/* exist; the hyper-parameters
    are in the HParams plugin of the run's own folder, not of a sub-run."""
    _, out = example_run
    assert _event_dirs(out) == {out / "tb"}
    ea = _events(out / "tb")
    tags = set(ea.Tags()["scalars"])
    assert {"val/loss/total", "openloop/nrmse_mean/h1", "openloop/coverage90_mean"} <= tags
    assert [e.step for e in ea.Scalars("val/loss/total")] == [12]
    hp = _hparams(ea)
    assert hp["train.max_steps"] == 12 and hp["model.obs_dim"] == 3 and hp["train.preset"] == "debug"


def test_a_short_run_has_val_openloop_and_hparams_in_one_run(pendulum_log, tmp_path, capsys):
    """`train` with max_steps below val_every (the default 250) validates at its end; its tb/ is one
    run with the hyper-parameters in the HParams plugin (metric columns that are tags of the run)
    and in the text table; on a non-terminal the progress is no flood of bar redraws."""
    from wmcheck.training.run import build_run_config, train

    cfg = TrainConfig(preset="debug", max_steps=8, batch_size=4, seq_len=16, warmup=4, log_every=4, progress_bar=True)
    assert cfg.max_steps < cfg.val_every
    result = train(pendulum_log, tmp_path / "run", build_run_config(cfg))
    captured = capsys.readouterr()
    assert "Epoch" not in captured.out + captured.err and "\r" not in captured.err
    assert _event_dirs(tmp_path / "run") == {tmp_path / "run" / "tb"}
    ea = _events(tmp_path / "run" / "tb")
    tags = set(ea.Tags()["scalars"])
    for needed in ("val/loss/total", "openloop/nrmse_mean/h4", "openloop/coverage90_mean", "train/loss/total"):
        assert needed in tags, needed
    assert result.best_step == 8  # the validation at the end chose the exported weights
    hp = _hparams(ea)
    assert hp["train.max_steps"] == 8 and hp["train.batch_size"] == 4 and hp["model.obs_dim"] == 3
    assert hp["data.train_episodes"] + hp["data.val_episodes"] == 12 and len(hp["data.sha256"]) == 64
    assert hp["train.openloop_horizons"] == "[1, 4, 16, 64]"
    metrics = _metric_tags(ea)
    assert "val/loss/total" in metrics and "openloop/nrmse_mean/h16" in metrics
    assert set(metrics) <= tags  # every metric column is a scalar the run logs
    assert "hparams/text_summary" in ea.Tags()["tensors"]  # the text table is kept


def _report(horizons=(1, 2, 4, 8)) -> dict:
    """The fields of a check report that write_tensorboard reads (no figures, no policy)."""
    return {
        "verdict": "fail",
        "summary": {"score": 0.3, "divergent": 2, "unverifiable": 1, "consistent": 5, "message": "a gap"},
        "gaps": {"gain": {"evidence": 4.0}},
        "divergence_curve": {
            "horizon_steps": list(horizons),
            "checked_mean": [float(h) for h in horizons],
            "real_mean": [0.5 * h for h in horizons],
            "real_q": [0.8 * h for h in horizons],
        },
    }


def test_a_check_is_one_tensorboard_run(tmp_path):
    """write_tensorboard writes every summary into its own folder: no sub-folder (add_scalars made one
    per curve, two pseudo-runs beside the check's); both divergence curves are tags of that run,
    overlaid by a Custom Scalars chart."""
    from wmcheck.checks.report_write import write_tensorboard

    logdir = write_tensorboard(_report(), tmp_path / "tb")
    assert _event_dirs(tmp_path) == {tmp_path / "tb"}
    ea = _events(logdir)
    tags = set(ea.Tags()["scalars"])
    assert {"check/divergence_vs_horizon/checked", "check/divergence_vs_horizon/real", "check/score"} <= tags
    assert [e.step for e in ea.Scalars("check/divergence_vs_horizon/real")] == [1, 2, 4, 8]
    assert [e.value for e in ea.Scalars("check/divergence_vs_horizon/checked")] == [1.0, 2.0, 4.0, 8.0]
    assert "custom_scalars__config__" in ea.Tags()["tensors"]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _fit(pendulum_log, steps: int, bar) -> None:
    import lightning as L

    dm = LogDataModule(pendulum_log, TrainConfig(preset="debug", max_steps=steps, batch_size=2, seq_len=8))
    module = WorldModelModule.from_datamodule(dm)
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        callbacks=[bar],
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=dm)


def test_the_terminal_bar_counts_steps_of_max_steps(pendulum_log, monkeypatch):
    """On a terminal: one bar `step k/N` with N = max_steps, never Lightning's "Epoch 0/-2"."""
    monkeypatch.delenv("WMCHECK_PROGRESS", raising=False)  # progress on, whatever the caller's shell says
    from wmcheck.training.progress import StepProgressBar, training_progress

    tty = FakeTTY()
    bar = training_progress(tty)
    assert isinstance(bar, StepProgressBar)
    _fit(pendulum_log, 6, bar)
    text = tty.getvalue()
    assert "step 6/6" in text and "100%" in text and "Epoch" not in text, text
    assert "step 3/6" in text  # redrawn as it goes


def test_log_progress_lines_are_sparse(pendulum_log, monkeypatch):
    """In a log (not a TTY): a line every LOG_EVERY_S seconds and the last, not one per step: 30 steps
    of a clock that advances 10 s per reading give a handful of lines, no carriage returns."""
    monkeypatch.delenv("WMCHECK_PROGRESS", raising=False)
    from wmcheck.training.progress import StepLines, training_progress

    assert isinstance(training_progress(io.StringIO()), StepLines)
    clock_t = [0.0]

    def clock():
        clock_t[0] += 10.0
        return clock_t[0]

    log = io.StringIO()
    _fit(pendulum_log, 30, StepLines(stream=log, clock=clock))
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 3 <= len(lines) <= 15, lines
    assert all(line.startswith("training steps [") for line in lines)
    assert lines[-1].split("] ")[1].startswith("30/30")
