"""The Lightning module: one optimiser step of the world model, its logging and its checkpoints.

Owns: manual optimisation with `LaProp` (so the optimiser's own statistics can be logged under
`train/opt/*`), the fixed TensorBoard namespaces (`train/loss/*`, `train/kl/*`, `train/entropy/*`,
`train/opt/*`, `val/*`, `openloop/*`), the open-loop evaluation at each validation (with a
true / predicted / error video per camera key, `openloop/video/<key>`), and what a
checkpoint carries besides Lightning's own state (the resolved config, normalisation statistics,
channel names and the training-data hash, all as JSON strings).

Reusable in a user's own `lightning.Trainer` (scripts/example_lightning.py): the constructor's
arguments are saved as plain hyper-parameters (the config dataclasses as dicts), so
`WorldModelModule.load_from_checkpoint(path, weights_only=True)` rebuilds the module from a checkpoint
alone, never unpickling objects; `from_datamodule` sizes a module for a `LogDataModule`'s log; the
held-out open-loop windows come from the Trainer's datamodule when they are not given; the
hyper-parameters go to TensorBoard's HParams tab at the start of fit; and a run that ends before its
first validation (fewer steps than the validation interval, a time budget, a Trainer that never
validates an endless epoch) is evaluated once at its end, so `val/*` and `openloop/*` always exist.
"""

from __future__ import annotations

import contextlib
import json

import lightning as L
import numpy as np
import torch

from wmcheck.training.config import RunConfig
from wmcheck.training.hparams import flat_params, log_hparams
from wmcheck.training.openloop import channel_figure, evaluate_openloop
from wmcheck.training.openloop_video import log_openloop_videos
from wmcheck.training.optim import LaProp
from wmcheck.worldmodel import WorldModel, WorldModelConfig
from wmcheck.worldmodel.config import preset


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite; training stops before the step is applied."""

    def __init__(self, step: int, value: float):
        super().__init__(f"the training loss is {value} at step {step}")
        self.step, self.value = step, value


class WorldModelModule(L.LightningModule):
    """One world model and its training. run_config: a RunConfig or its dict (`RunConfig.to_dict`);
    normalizer: `Normalizer.to_dict()` of the training episodes; channels: the log's channel names,
    units and dt (`LogDataModule.channels`); data_hash: SHA-256 of the training log (a resume or a
    reload on other data is refused). openloop_seq / stop_seq: held-out windows (Batch) of
    `openloop/*` and of `val/openloop_nrmse`; None: taken from the Trainer's datamodule at setup."""

    def __init__(
        self,
        run_config: RunConfig | dict,
        normalizer: dict | None = None,
        channels: dict | None = None,
        data_hash: str = "",
        openloop_seq=None,
        stop_seq=None,
    ):
        super().__init__()
        if isinstance(run_config, dict):
            run_config = RunConfig.from_dict(run_config)
        # Plain types only (checkpoints load with weights_only=True); the windows are data, not hparams.
        # Not sent to the logger as they are: on_fit_start writes a flat, readable set (training/hparams.py).
        self.save_hyperparameters(
            {
                "run_config": run_config.to_dict(),
                "normalizer": dict(normalizer or {}),
                "channels": dict(channels or {}),
                "data_hash": data_hash,
            },
            logger=False,
        )
        self.run_config = run_config
        self.model = WorldModel(run_config.model)
        self.normalizer = normalizer or {}
        self.channels = channels or {}
        self.data_hash = data_hash
        self.automatic_optimization = False
        self.openloop_seq = openloop_seq  # held-out windows for openloop/*
        self.stop_seq = stop_seq  # and the (more) windows of val/openloop_nrmse when early stopping uses it
        self._windows_asked = openloop_seq is not None or stop_seq is not None
        self._validations = 0  # validations (not sanity checks) run in this process
        self._fit_start_step = 0

    @classmethod
    def from_datamodule(cls, dm, model: WorldModelConfig | None = None) -> WorldModelModule:
        """A module for `dm`'s log (a LogDataModule, prepared here if it is not yet): `model` (default:
        the preset named by dm's TrainConfig) sized for the log's channels and cameras, with the log's
        normaliser, channel names and data hash. A ValueError when the camera frames do not fit."""
        from wmcheck.training.checkpoint import file_sha256

        if dm.normalizer is None:
            dm.prepare()
        base = model if model is not None else preset(dm.cfg.preset)
        run_config = RunConfig(model=dm.model_config(base), train=dm.cfg)
        return cls(run_config, dm.normalizer.to_dict(), dm.channels, file_sha256(dm.log_path))

    def setup(self, stage: str) -> None:
        """The held-out windows from the Trainer's datamodule (a LogDataModule), when not given."""
        dm = self.trainer.datamodule
        if self._windows_asked or not hasattr(dm, "openloop_sequence"):
            return
        self._windows_asked = True
        self.openloop_seq = dm.openloop_sequence()
        if self.run_config.train.stop_on == "openloop":
            self.stop_seq = dm.openloop_sequence(windows=self.run_config.train.stop_windows, stream="stop")

    def hparam_metrics(self) -> list[str]:
        """The scalar tags shown as metric columns of TensorBoard's HParams tab."""
        t = self.run_config.train
        tags = ["val/loss/total"] + (["val/openloop_nrmse"] if t.stop_on == "openloop" else [])
        tags += [f"openloop/nrmse_mean/h{h}" for h in t.openloop_horizons] + ["openloop/coverage90_mean"]
        return tags + ["train/loss/total"]

    def on_fit_start(self) -> None:
        """The hyper-parameters to TensorBoard (HParams tab and a text table), once per fit."""
        if not self.trainer.is_global_zero:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is not installed: nothing to write to
            return
        writer = getattr(self.logger, "experiment", None)
        if not isinstance(writer, SummaryWriter):
            return
        params = flat_params(self.run_config.to_dict())
        dm = self.trainer.datamodule
        if dm is not None and hasattr(dm, "log_path"):
            params["data.log"] = str(dm.log_path)
            params["data.train_episodes"] = len(getattr(dm, "train_ids", []))
            params["data.val_episodes"] = len(getattr(dm, "val_ids", []))
        params["data.sha256"] = self.data_hash
        params["precision"] = str(self.trainer.precision)
        log_hparams(writer, params, self.hparam_metrics())

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        t = self.run_config.train
        return LaProp(self.model.parameters(), lr=t.lr, eps=t.eps, agc=t.agc, warmup=t.warmup)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        out = self.model.loss(batch)
        if not torch.isfinite(out.loss):
            # before the optimiser step: the weights (and the last checkpoint) are still the good ones
            raise NonFiniteLoss(self.global_step, float(out.loss.detach()))
        opt.zero_grad(set_to_none=True)
        self.manual_backward(out.loss)
        opt.step()
        t = self.run_config.train
        if self.global_step % t.log_every == 0 or self.global_step == 1:
            logs = {f"train/{k}": v for k, v in out.metrics.items()}
            inner = opt.optimizer if hasattr(opt, "optimizer") else opt
            for k, v in inner.last_stats.items():
                logs[f"train/opt/{k}"] = torch.tensor(v)
            group = inner.param_groups[0]
            logs["train/opt/lr"] = torch.tensor(inner.current_lr(group, self.global_step))
            self.log_dict(logs, on_step=True, on_epoch=False, prog_bar=False, batch_size=batch.obs.shape[0])
        self.log("loss", out.metrics["loss/total"], prog_bar=True, on_step=True, on_epoch=False, logger=False)
        return out.loss.detach()

    # ------------------------------------------------------------------ validation
    @contextlib.contextmanager
    def _fixed_draws(self, stream: int):
        """A context with its own random numbers, seeded from the run's seed and `stream`, that leaves
        the training's stream as it was: validations then draw the same latents every time (common
        random numbers), so what they measure moves only with the weights."""
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(self.run_config.train.seed * 1000 + stream)
            yield

    def _val_logs(self, batch, batch_idx) -> dict:
        # The same latent draws at every validation: the loss moves only with the weights, which is
        # what early stopping and the best checkpoint compare.
        with self._fixed_draws(batch_idx):
            out = self.model.loss(batch)
        return {f"val/{k}": v for k, v in out.metrics.items()}

    def validation_step(self, batch, batch_idx):
        logs = self._val_logs(batch, batch_idx)
        self.log_dict(logs, on_step=False, on_epoch=True, batch_size=batch.obs.shape[0], sync_dist=True)

    def _openloop(self, seq):
        """evaluate_openloop on held-out windows with fixed draws (every rank and every validation
        the same random numbers, as the loss above)."""
        from wmcheck.training.datamodule import batch_to

        t = self.run_config.train
        with self._fixed_draws(999):
            return evaluate_openloop(self.model, batch_to(seq, self.device), t.openloop_context, t.openloop_horizons)

    def _stop_metric(self) -> dict:
        if self.stop_seq is None:
            return {}
        return {"val/openloop_nrmse": float(np.nanmean(self._openloop(self.stop_seq).step_nrmse))}

    def _openloop_logs(self) -> dict:
        """openloop/* scalars of the held-out windows; their figures and videos go to the writer."""
        if self.openloop_seq is None:
            return {}
        t = self.run_config.train
        res = self._openloop(self.openloop_seq)
        names = self.channels.get("observation_names") or [f"obs_{i}" for i in range(res.nrmse.shape[1])]
        logs = {}
        for i, h in enumerate(res.horizons):
            if np.isnan(res.nrmse[i]).all():
                continue
            logs[f"openloop/nrmse_mean/h{h}"] = float(np.nanmean(res.nrmse[i]))
            for d, name in enumerate(names):
                logs[f"openloop/nrmse/{name}/h{h}"] = float(res.nrmse[i, d])
                if not np.isnan(res.fit[i, d]):
                    logs[f"openloop/fit/{name}/h{h}"] = float(res.fit[i, d])
        for d, name in enumerate(names):
            logs[f"openloop/coverage90/{name}"] = float(res.coverage[d])
        logs["openloop/coverage90_mean"] = float(res.coverage.mean())
        writer = getattr(self.logger, "experiment", None)
        if writer is not None and hasattr(writer, "add_figure"):
            for d, name in enumerate(names[:16]):  # a figure per channel (capped for wide logs)
                writer.add_figure(f"openloop/{name}", channel_figure(res, d, name), self.global_step)
            # camera frames: true / predicted / error video per image key (reference report protocol)
            with self._fixed_draws(998):
                log_openloop_videos(writer, self.model, self.openloop_seq, t.openloop_context, self.global_step)
        return logs

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        self._validations += 1
        stop = self._stop_metric()  # the early-stopping metric exists on every rank (DDP needs it)
        if stop:
            self.log_dict(stop, on_epoch=True, sync_dist=True, batch_size=1)
        if not self.trainer.is_global_zero:
            return
        logs = self._openloop_logs()
        if logs:
            self.log_dict(logs, on_step=False, on_epoch=True, rank_zero_only=True, batch_size=1)

    def on_train_start(self) -> None:
        self._fit_start_step = self.global_step

    @torch.no_grad()
    def on_train_end(self):
        """A fit that ended before its first validation (in this process) is evaluated once now: the
        validation windows' `val/*` and the held-out `openloop/*`, written straight to the loggers
        (Lightning's own logging is closed here). Nothing without a datamodule with validation data."""
        dm = self.trainer.datamodule
        trained = self.global_step > self._fit_start_step  # not a finished run called again
        if self._validations or not trained or not self.trainer.is_global_zero or not self.loggers:
            return
        if not getattr(dm, "has_validation", False):
            return
        from wmcheck.training.datamodule import batch_to

        was_training = self.training
        self.eval()
        try:
            sums, count = {}, 0
            for i, batch in enumerate(dm.val_dataloader()):
                n = batch.obs.shape[0]
                for k, v in self._val_logs(batch_to(batch, self.device), i).items():
                    sums[k] = sums.get(k, 0.0) + float(v) * n
                count += n
            logs = {k: v / max(count, 1) for k, v in sums.items()}
            logs.update(self._stop_metric())
            logs.update(self._openloop_logs())
        finally:
            self.train(was_training)
        self._validations += 1
        for logger in self.loggers:
            logger.log_metrics(logs, step=self.global_step)
            logger.save()

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint):
        checkpoint["wmcheck"] = {
            "config_json": self.run_config.to_json(),
            "normalizer_json": json.dumps(self.normalizer, sort_keys=True),
            "channels_json": json.dumps(self.channels, sort_keys=True),
            "data_hash": self.data_hash,
        }

    def on_load_checkpoint(self, checkpoint):
        stored = checkpoint.get("wmcheck", {})
        mine = json.loads(self.run_config.to_json())
        theirs = json.loads(stored.get("config_json", "{}"))
        # Schedule fields may change on resume (e.g. a larger --max-steps); the model may not.
        if theirs.get("model") != mine["model"]:
            raise ValueError("the checkpoint's world-model config differs from this run's")
        if stored.get("data_hash") and stored["data_hash"] != self.data_hash:
            raise ValueError("the checkpoint was trained on different data (data hash differs)")
