"""`wmcheck train` as a function: from a log file to RUNDIR with checkpoints, TensorBoard and model.pt.

Owns the run directory layout:
  RUNDIR/config.json              the resolved RunConfig (world model + training)
  RUNDIR/checkpoints/last.ckpt    Lightning's resumable state (written atomically every ckpt_every steps)
  RUNDIR/checkpoints/best.ckpt    the state with the lowest monitored validation metric so far (exported as model.pt)
  RUNDIR/training.json            how training ended: steps, best step, stop reason
  RUNDIR/quality.json             the model-quality card (training/quality.py), also in TensorBoard
  RUNDIR/tb/                      the TensorBoard run (tensorboard --logdir RUNDIR): scalars, figures,
                                  the hyper-parameters in the HParams tab and as a text table
  RUNDIR/model.pt                 the exported model (weights + JSON config/normaliser/channels + data hash)
A run killed at any point resumes from last.ckpt when `train` is called again with the same RUNDIR.

Training ends at the first of: `max_steps` (a cap), early stopping (the last `patience` validations
brought at most `min_improvement` of the total improvement of the `stop_on` metric: by default the
validation loss, or the held-out open-loop NRMSE; training/stopping.py), the wall-clock budget
`max_minutes`. Any of these is a finished run; a
run that stops otherwise (a signal, a crash) is not, and the next call resumes it. With a
validation split the exported model is the best checkpoint's, not the last step's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmcheck.datasets.atomic import remove_stale_temporaries, write_text_atomic
from wmcheck.datasets.errors import Interrupted, UserError
from wmcheck.datasets.folder_lock import folder_lock
from wmcheck.training.checkpoint import atomic_checkpoint_io, file_sha256, read_checkpoint, save_model
from wmcheck.training.config import STOP_METRICS, RunConfig, TrainConfig
from wmcheck.training.datamodule import LogDataModule
from wmcheck.training.module import NonFiniteLoss, WorldModelModule
from wmcheck.training.progress import training_progress
from wmcheck.training.quality import QualityCard, compute_card, log_card, write_card
from wmcheck.training.stopping import DiminishingReturnsStopping
from wmcheck.worldmodel.config import preset


@dataclass
class TrainResult:
    run_dir: Path
    model_path: Path
    steps: int
    metrics: dict
    best_step: int | None = None  # the step of the exported weights (None: the last step, no validation)
    stop_reason: str = "max_steps"  # max_steps / early_stopping / time_budget
    quality: QualityCard | None = None  # None without held-out episodes
    global_zero: bool = True  # False in the other processes of a multi-device run (they print and calibrate nothing)
    monitor: str = STOP_METRICS["loss"]  # the validation metric that chose best_step (TrainConfig.stop_on)
    folds: list = field(default_factory=list)  # a cross-fitted run's: every fold's TrainResult (training/crossfit.py)


def resolve_precision(train: TrainConfig) -> str:
    if train.precision != "auto":
        return train.precision
    gpu = torch.cuda.is_available() and train.accelerator in ("auto", "gpu", "cuda")
    return "bf16-mixed" if gpu else "32-true"


def _devices(value: str):
    if isinstance(value, int) or value == "auto":
        return value
    if value.isdigit() or (value.startswith("-") and value[1:].isdigit()):
        return int(value)
    return [int(v) for v in value.split(",") if v.strip()]


def device_kwargs(t: TrainConfig) -> dict:
    """The Lightning Trainer's device arguments of a TrainConfig (one place for the run and its check)."""
    return dict(
        accelerator=t.accelerator, devices=_devices(t.devices), strategy=t.strategy, precision=resolve_precision(t)
    )


def build_run_config(train: TrainConfig, ensemble: int = 1, **model_overrides) -> RunConfig:
    try:
        model = preset(train.preset, ensemble=ensemble, **model_overrides)
    except KeyError as exc:
        raise UserError(str(exc).strip("'\""), "pass --preset with one of the listed names") from None
    return RunConfig(model=model, train=train)


def train(
    log_path: str | os.PathLike, out_dir: str | os.PathLike, run_config: RunConfig, resume: bool = True
) -> TrainResult:
    out = Path(out_dir)
    t = run_config.train
    dm = LogDataModule(log_path, t)
    dm.prepare()  # validates the log, splits episodes, fits the normaliser (errors are UserErrors)
    if dm.cfg.openloop_context != t.openloop_context:  # prepare fitted it: held-out episodes too short
        if not relaunched_rank():
            print(
                f"the held-out episodes' median length is {int(np.median(dm.val_lengths))} steps: the open-loop "
                f"metrics and the quality card observe {dm.cfg.openloop_context} steps (not {t.openloop_context}) "
                "before imagining",
                flush=True,
            )
        t = dm.cfg
        run_config = dataclasses.replace(run_config, train=t)
    try:
        model_cfg = dm.model_config(run_config.model)
    except ValueError as exc:  # e.g. frames whose size does not fit the CNN stages
        raise UserError(
            f"{log_path}: the camera frames do not fit the world model: {exc}",
            "re-record with --render 64x64 (or 32x32 / 16x16), or train with --no-images",
        ) from None
    if t.folds and model_cfg.image_keys:
        raise UserError(
            f"{log_path} has camera frames: cross-fitted runs (--folds) are checked on vector channels only",
            "train with --no-images, or without --folds",
        )
    run_config = RunConfig(model=model_cfg, train=t)
    check_device_options(t)  # before anything is written
    with run_lock(out):
        return _train_in(out, log_path, dm, run_config, resume)


def _train_in(out: Path, log_path, dm: LogDataModule, run_config: RunConfig, resume: bool) -> TrainResult:
    """The run itself, in a locked RUNDIR (see train)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    t = run_config.train
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    for name in ("last.ckpt", "best.ckpt"):  # what a kill during a checkpoint write left behind
        remove_stale_temporaries(ckpt_dir, name)
    cfg_path = out / "config.json"
    data_hash = file_sha256(log_path)
    if cfg_path.exists() and last.exists() and resume:
        refuse_other_run(out, run_config, data_hash)  # before anything in the folder changes
    write_text_atomic(cfg_path, run_config.to_json())
    write_text_atomic(
        out / "data.json", json.dumps({"log": str(Path(log_path).resolve()), "sha256": data_hash}, indent=2)
    )
    # Seed before the model exists: its initial weights come from the same seed, so a run is
    # reproducible (seeding after construction left the init to whatever the process drew before).
    L.seed_everything(t.seed, workers=True, verbose=False)
    module = WorldModelModule(
        run_config,
        dm.normalizer.to_dict(),
        dm.channels,
        data_hash,
        openloop_seq=dm.openloop_sequence(),
        stop_seq=dm.openloop_sequence(windows=t.stop_windows, stream="stop") if t.stop_on == "openloop" else None,
    )

    logger = TensorBoardLogger(save_dir=str(out), name="", version="tb", default_hp_metric=False)
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, filename="last", save_top_k=0, save_last=True, every_n_train_steps=t.ckpt_every
    )
    callbacks = [checkpoint] + ([training_progress()] if t.progress_bar else [])  # steps of max_steps, not epochs
    best_ckpt = early = None
    monitor = monitored_metric(t, module.stop_seq is not None)
    if dm.has_validation:
        # best.ckpt is written at a validation that improves the monitored metric; model.pt takes its weights
        best_ckpt = ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best",
            monitor=monitor,
            mode="min",
            save_top_k=1,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
        callbacks.append(best_ckpt)
        if t.patience:
            early = DiminishingReturnsStopping(monitor, t.patience, t.min_improvement)
            callbacks.append(early)
    for noisy in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__`.*")
    # We checkpoint after the optimiser step on purpose (resume continues from the stepped state).
    warnings.filterwarnings("ignore", message=".*manual optimization and every_n_train_steps.*")
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")  # a resume
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_epochs=-1,
        **device_kwargs(t),
        logger=logger,
        callbacks=callbacks,
        max_time={"seconds": t.max_minutes * 60} if t.max_minutes else None,
        # capped at max_steps: a run shorter than val_every still validates (val/*, openloop/*) at its end
        val_check_interval=min(t.val_every, t.max_steps) if dm.has_validation else None,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches if dm.has_validation else 0,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        deterministic=False,
        plugins=[atomic_checkpoint_io()],
    )
    ckpt_path = str(last) if (resume and last.exists()) else None
    if ckpt_path and trainer.is_global_zero:
        step = int(read_checkpoint(last, _DAMAGED_RESUME.format(last=last)).get("global_step", 0))
        print(f"resuming from {last} at step {step}", flush=True)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    except (KeyboardInterrupt, SystemExit) as exc:  # Lightning turns SIGINT and SIGTERM into SystemExit
        raise interrupted(trainer, last, exc) from None
    except NonFiniteLoss as exc:
        raise UserError(
            f"training diverged: {exc}; {last} holds the last good state"
            + (
                f" (step {int(read_checkpoint(last, _DAMAGED_RESUME.format(last=last))['global_step'])})"
                if last.exists()
                else ""
            ),
            "train again with a smaller --lr (or a longer --warmup) in a new --out folder; check the log "
            "for extreme values with `wmcheck validate`",
        ) from None
    except ValueError as exc:
        if "checkpoint" in str(exc):
            raise UserError(f"cannot resume from {last}: {exc}", "use a new --out folder") from None
        raise
    reason = stop_reason(trainer, t, early)
    if reason is None:
        raise UserError(
            f"training stopped at step {trainer.global_step} of {t.max_steps}",
            "run the same command again to resume from the last checkpoint",
        )
    # The final state is a checkpoint too, so a finished run "resumes" from it.
    trainer.save_checkpoint(last, weights_only=False)
    best_step = restore_best(module, best_ckpt)
    model_path = out / "model.pt"
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    result = TrainResult(
        out,
        model_path,
        trainer.global_step,
        metrics,
        best_step,
        reason,
        global_zero=trainer.is_global_zero,
        monitor=monitor,
    )
    if trainer.is_global_zero:
        save_model(model_path, module.model, run_config.to_dict(), dm.normalizer.to_dict(), dm.channels, data_hash)
        summary = training_summary(result, best_ckpt)
        write_text_atomic(out / "training.json", json.dumps(summary, indent=2))
        module.model.cpu()
        result.quality = compute_card(module.model, dm, t.openloop_context, max(t.openloop_horizons), seed=t.seed)
        if result.quality is not None:
            result.quality.training = summary
            write_card(out, result.quality)
            log_card(logger.experiment, result.quality, trainer.global_step)
            logger.experiment.flush()
    return result


def refuse_other_run(out: Path, run_config: RunConfig, data_hash: str) -> None:
    """A resume must continue the same run: the same world model, the same training data and the
    same episode split (seed, val_fraction; another split would calibrate on trained episodes).
    Schedule fields (max_steps, lr, patience, ...) may change. Raises before anything is written."""
    old = json.loads((out / "config.json").read_text())
    new = run_config.to_dict()
    if old.get("model") != new["model"]:
        raise UserError(
            f"{out} holds a run with a different world-model config",
            "use a new --out folder, or the same --preset/--ensemble to resume it",
        )
    split_keys = ("seed", "val_fraction", "folds", "fold")  # a config written before folds existed has none
    changed = [k for k in split_keys if old.get("train", {}).get(k, getattr(TrainConfig, k)) != new["train"][k]]
    if changed:
        was = ", ".join(f"{k} {old['train'].get(k)} -> {new['train'][k]}" for k in changed)
        raise UserError(
            f"{out} holds a run with another episode split ({was})",
            "use a new --out folder, or the run's own --seed / --val-fraction to resume it",
        )
    data = out / "data.json"
    if data.exists() and json.loads(data.read_text()).get("sha256") != data_hash:
        raise UserError(
            f"{out} holds a run trained on another log (its data hash differs)",
            "use a new --out folder, or pass the run's own training log to resume it",
        )


LOCK_FILE = ".train.lock"


def relaunched_rank() -> bool:
    """True in the processes Lightning re-launches for the other devices of a run (LOCAL_RANK or
    NODE_RANK set, not 0): they share their rank 0's folder lock and print nothing of their own."""
    return bool(int(os.environ.get("LOCAL_RANK", "0") or 0) or int(os.environ.get("NODE_RANK", "0") or 0))


@contextlib.contextmanager
def run_lock(out: Path):
    """Exclusive use of RUNDIR by one `train` (datasets/folder_lock.py: its PID and host in
    RUNDIR/.train.lock, a stale lock taken over). The other processes of a multi-device run
    (Lightning re-launches the script with LOCAL_RANK set) share their rank 0's."""
    if relaunched_rank():
        yield
        return
    with folder_lock(out, LOCK_FILE, "wmcheck train", "wait for it to finish, or train into another --out folder"):
        yield


def check_device_options(t: TrainConfig) -> None:
    """Lightning's accelerator / devices / strategy / precision, as Lightning itself judges them (a
    throwaway Trainer); a bad value or a device that is not there is a UserError naming the option."""
    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    opts = f"--accelerator {t.accelerator} --devices {t.devices} --strategy {t.strategy} --precision {t.precision}"
    try:
        L.Trainer(
            **device_kwargs(t),
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    except (ValueError, TypeError, MisconfigurationException) as exc:
        raise UserError(
            f"bad device option ({opts}): {str(exc).splitlines()[0][:300]}",
            "see `wmcheck train --help`; `--accelerator auto --devices auto` picks what this machine has",
        ) from None


def interrupted(trainer, last: Path, exc: BaseException) -> Interrupted:
    """A signal stopped training: save the resumable state where it stopped (the last periodic
    checkpoint stays if that fails) and say how to resume."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    sigterm = isinstance(exc, SIGTERMException) or getattr(trainer, "received_sigterm", False)
    try:
        trainer.save_checkpoint(last, weights_only=False)
        saved = f"the resumable checkpoint {last} holds step {trainer.global_step}"
    except Exception:  # noqa: BLE001 - whatever failed, the periodic checkpoint is still there
        saved = f"the last periodic checkpoint {last} is kept" if last.exists() else "no checkpoint was written yet"
    return Interrupted(
        f"training stopped by {'SIGTERM' if sigterm else 'SIGINT'} at step {trainer.global_step}; {saved}; "
        "no model.pt was exported",
        "run the same command again to resume",
        143 if sigterm else 130,
    )


def monitored_metric(t: TrainConfig, has_openloop_windows: bool) -> str:
    """The validation metric of early stopping and of the best checkpoint (TrainConfig.stop_on):
    the open-loop NRMSE needs its held-out windows (longer than the context), else the loss stands in."""
    if t.stop_on == "openloop" and not has_openloop_windows:
        return STOP_METRICS["loss"]
    return STOP_METRICS[t.stop_on]


def stop_reason(trainer, t: TrainConfig, early) -> str | None:
    """Why a finished fit ended (max_steps / early_stopping / time_budget), or None when it was
    interrupted (a signal or an error), i.e. the run is not finished."""
    if trainer.global_step >= t.max_steps:
        return "max_steps"
    if early is not None and early.stopped:
        return "early_stopping"
    timer = next((c for c in trainer.callbacks if type(c).__name__ == "Timer"), None)
    if t.max_minutes and timer is not None and (timer.time_remaining() or 0.0) <= 0.0:
        return "time_budget"
    return None


_DAMAGED_RESUME = (
    "the resumable checkpoint is damaged: delete {last} to start the run afresh, or use a new --out folder"
)


def restore_best(module: WorldModelModule, best_ckpt) -> int | None:
    """Load the best checkpoint's weights into `module` (weights only); its step, or None when
    there is none (no validation split, or no validation ran)."""
    path = getattr(best_ckpt, "best_model_path", "") if best_ckpt is not None else ""
    if not path or not Path(path).exists():
        return None
    state = read_checkpoint(path, f"delete {path} (the last checkpoint is kept) and run the same command again")
    module.load_state_dict(state["state_dict"])
    return int(state.get("global_step", 0))


def training_summary(result: TrainResult, best_ckpt) -> dict:
    score = getattr(best_ckpt, "best_model_score", None) if best_ckpt is not None else None
    best = float(score) if score is not None else None
    out = {
        "steps": result.steps,
        "stop_reason": result.stop_reason,
        "exported_step": result.best_step if result.best_step is not None else result.steps,
        "monitor": result.monitor,
        "best_score": best,
    }
    if result.monitor == STOP_METRICS["loss"]:
        out["best_val_loss"] = best  # the key before the monitored metric could be chosen
    return out
