"""`wmcheck train` as a function: from a log file to RUNDIR with checkpoints, TensorBoard and model.pt.

Owns the run directory layout:
  RUNDIR/config.json              the resolved RunConfig (world model + training)
  RUNDIR/checkpoints/last.ckpt    Lightning's resumable state (written atomically every ckpt_every steps)
  RUNDIR/tb/                      the TensorBoard run (tensorboard --logdir RUNDIR)
  RUNDIR/model.pt                 the exported model (weights + JSON config/normaliser/channels + data hash)
A run killed at any point resumes from last.ckpt when `train` is called again with the same RUNDIR.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from wmcheck.datasets.atomic import write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.training.checkpoint import file_sha256, save_model
from wmcheck.training.config import RunConfig, TrainConfig
from wmcheck.training.datamodule import LogDataModule
from wmcheck.training.module import WorldModelModule
from wmcheck.worldmodel.config import preset


@dataclass
class TrainResult:
    run_dir: Path
    model_path: Path
    steps: int
    metrics: dict


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


def hparams_markdown(run_config: RunConfig, extra: dict) -> str:
    rows = ["| parameter | value |", "|---|---|"]
    for section, values in run_config.to_dict().items():
        for k, v in values.items():
            rows.append(f"| {section}.{k} | {v} |")
    for k, v in extra.items():
        rows.append(f"| {k} | {v} |")
    return "\n".join(rows)


def build_run_config(train: TrainConfig, ensemble: int = 1, **model_overrides) -> RunConfig:
    try:
        model = preset(train.preset, ensemble=ensemble, **model_overrides)
    except KeyError as exc:
        raise UserError(str(exc).strip("'\""), "pass --preset with one of the listed names") from None
    return RunConfig(model=model, train=train)


def train(
    log_path: str | os.PathLike, out_dir: str | os.PathLike, run_config: RunConfig, resume: bool = True
) -> TrainResult:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    out = Path(out_dir)
    t = run_config.train
    dm = LogDataModule(log_path, t)
    dm.prepare()  # validates the log, splits episodes, fits the normaliser (errors are UserErrors)
    try:
        model_cfg = dataclasses.replace(
            run_config.model, obs_dim=dm.dims[0], action_dim=dm.dims[1], input_dim=dm.dims[2], **dm.image_spec
        )
    except ValueError as exc:  # e.g. frames whose size does not fit the CNN stages
        raise UserError(
            f"{log_path}: the camera frames do not fit the world model: {exc}",
            "re-record with --render 64x64 (or 32x32 / 16x16), or train with --no-images",
        ) from None
    run_config = RunConfig(model=model_cfg, train=t)

    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    cfg_path = out / "config.json"
    if cfg_path.exists() and last.exists() and resume:
        old = json.loads(cfg_path.read_text())
        if old.get("model") != run_config.to_dict()["model"]:
            raise UserError(
                f"{out} holds a run with a different world-model config",
                "use a new --out folder, or the same --preset/--ensemble to resume it",
            )
    write_text_atomic(cfg_path, run_config.to_json())
    data_hash = file_sha256(log_path)
    write_text_atomic(
        out / "data.json", json.dumps({"log": str(Path(log_path).resolve()), "sha256": data_hash}, indent=2)
    )
    # Seed before the model exists: its initial weights come from the same seed, so a run is
    # reproducible (seeding after construction left the init to whatever the process drew before).
    L.seed_everything(t.seed, workers=True, verbose=False)
    module = WorldModelModule(run_config, dm.normalizer.to_dict(), dm.channels, data_hash)
    module._openloop_seq = dm.openloop_sequence()

    logger = TensorBoardLogger(save_dir=str(out), name="", version="tb", default_hp_metric=False)
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, filename="last", save_top_k=0, save_last=True, every_n_train_steps=t.ckpt_every
    )
    for noisy in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__`.*")
    # We checkpoint after the optimiser step on purpose (resume continues from the stepped state).
    warnings.filterwarnings("ignore", message=".*manual optimization and every_n_train_steps.*")
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_epochs=-1,
        accelerator=t.accelerator,
        devices=_devices(t.devices),
        strategy=t.strategy,
        precision=resolve_precision(t),
        logger=logger,
        callbacks=[checkpoint],
        val_check_interval=t.val_every if dm.has_validation else None,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches if dm.has_validation else 0,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        deterministic=False,
    )
    if trainer.is_global_zero:
        logger.experiment.add_text(
            "hparams",
            hparams_markdown(
                run_config,
                {
                    "log": str(log_path),
                    "data_sha256": data_hash,
                    "train_episodes": len(dm.train_ids),
                    "val_episodes": len(dm.val_ids),
                    "precision": resolve_precision(t),
                },
            ),
            0,
        )
    ckpt_path = str(last) if (resume and last.exists()) else None
    if ckpt_path:
        step = int(torch.load(last, map_location="cpu", weights_only=True).get("global_step", 0))
        print(f"resuming from {last} at step {step}", flush=True)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    except ValueError as exc:
        if "checkpoint" in str(exc):
            raise UserError(f"cannot resume from {last}: {exc}", "use a new --out folder") from None
        raise
    if trainer.global_step < t.max_steps:
        raise UserError(
            f"training stopped at step {trainer.global_step} of {t.max_steps}",
            "run the same command again to resume from the last checkpoint",
        )
    # The final state is a checkpoint too, so a finished run "resumes" as a no-op.
    trainer.save_checkpoint(last, weights_only=False)
    model_path = out / "model.pt"
    if trainer.is_global_zero:
        save_model(model_path, module.model, run_config.to_dict(), dm.normalizer.to_dict(), dm.channels, data_hash)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    return TrainResult(out, model_path, trainer.global_step, metrics)
