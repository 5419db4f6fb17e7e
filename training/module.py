"""The Lightning module: one optimiser step of the world model, its logging and its checkpoints.

Owns: manual optimisation with `LaProp` (so the optimiser's own statistics can be logged under
`train/opt/*`), the fixed TensorBoard namespaces (`train/loss/*`, `train/kl/*`, `train/entropy/*`,
`train/opt/*`, `val/*`, `openloop/*`), the open-loop evaluation at each validation (with a
true / predicted / error video per camera key, `openloop/video/<key>`), and what a
checkpoint carries besides Lightning's own state (the resolved config, normalisation statistics,
channel names and the training-data hash, all as JSON strings).
"""

from __future__ import annotations

import contextlib
import json

import lightning as L
import numpy as np
import torch

from wmcheck.training.config import RunConfig
from wmcheck.training.openloop import channel_figure, evaluate_openloop
from wmcheck.training.openloop_video import log_openloop_videos
from wmcheck.training.optim import LaProp
from wmcheck.worldmodel import WorldModel


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite; training stops before the step is applied."""

    def __init__(self, step: int, value: float):
        super().__init__(f"the training loss is {value} at step {step}")
        self.step, self.value = step, value


class WorldModelModule(L.LightningModule):
    def __init__(
        self, run_config: RunConfig, normalizer: dict | None = None, channels: dict | None = None, data_hash: str = ""
    ):
        super().__init__()
        self.run_config = run_config
        self.model = WorldModel(run_config.model)
        self.normalizer = normalizer or {}
        self.channels = channels or {}
        self.data_hash = data_hash
        self.automatic_optimization = False
        self._openloop_seq = None  # set by the data module: held-out windows for openloop/*
        self._stop_seq = None  # and the (more) windows of val/openloop_nrmse when early stopping uses it

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

    def validation_step(self, batch, batch_idx):
        # The same latent draws at every validation: the loss moves only with the weights, which is
        # what early stopping and the best checkpoint compare.
        with self._fixed_draws(batch_idx):
            out = self.model.loss(batch)
        logs = {f"val/{k}": v for k, v in out.metrics.items()}
        self.log_dict(logs, on_step=False, on_epoch=True, batch_size=batch.obs.shape[0], sync_dist=True)

    def _openloop(self, seq):
        """evaluate_openloop on held-out windows with fixed draws (every rank and every validation
        the same random numbers, as the loss above)."""
        from wmcheck.training.datamodule import batch_to

        t = self.run_config.train
        with self._fixed_draws(999):
            return evaluate_openloop(self.model, batch_to(seq, self.device), t.openloop_context, t.openloop_horizons)

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        t = self.run_config.train
        if self._stop_seq is not None:  # the early-stopping metric exists on every rank (DDP needs it)
            stop = self._openloop(self._stop_seq)
            self.log(
                "val/openloop_nrmse", float(np.nanmean(stop.step_nrmse)), on_epoch=True, sync_dist=True, batch_size=1
            )
        if self._openloop_seq is None or not self.trainer.is_global_zero:
            return
        res = self._openloop(self._openloop_seq)
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
        self.log_dict(logs, on_step=False, on_epoch=True, rank_zero_only=True, batch_size=1)
        writer = getattr(self.logger, "experiment", None)
        if writer is not None and hasattr(writer, "add_figure"):
            for d, name in enumerate(names[:16]):  # a figure per channel (capped for wide logs)
                writer.add_figure(f"openloop/{name}", channel_figure(res, d, name), self.global_step)
            # camera frames: true / predicted / error video per image key (reference report protocol)
            with self._fixed_draws(998):
                log_openloop_videos(writer, self.model, self._openloop_seq, t.openloop_context, self.global_step)

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
