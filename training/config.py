"""Training configuration: `TrainConfig` (optimiser, batches, schedule, devices) and `RunConfig`.

The resolved `RunConfig` (world model + training) is written as RUNDIR/config.json and inside every
checkpoint; a resumed run must match it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from wmcheck.worldmodel.config import WorldModelConfig

STOP_METRICS = {"openloop": "val/openloop_nrmse", "loss": "val/loss/total"}
"""TrainConfig.stop_on -> the logged validation metric it monitors (lower is better)."""


@dataclass
class TrainConfig:
    preset: str = "debug"
    """World-model size preset (see wmcheck.worldmodel.config.PRESETS)."""
    max_steps: int = 10000
    """Cap on optimiser steps; training usually ends earlier by early stopping (`patience`)."""
    batch_size: int = 16
    """Sequences per batch B (reference 16)."""
    seq_len: int = 64
    """Steps per sequence T (reference 64; every window starts from the zero state, replay_context=0)."""
    lr: float = 1e-3
    """Peak learning rate. The reference's 4e-5 is tuned for online RL with a replay buffer that grows;
    offline on a fixed log it leaves the model near its initialisation after thousands of steps
    (docs/model.md, "Training defaults", has the measurements)."""
    warmup: int = 100
    """Linear learning-rate warm-up in optimiser steps (reference 1000)."""
    agc: float = 0.3
    eps: float = 1e-20
    seed: int = 0
    """Seed of the weights, the split and the window sampler."""
    val_fraction: float = 0.2
    """Fraction of episodes held out (episode-level, deterministic) for val/* and openloop/*."""
    folds: int = 0
    """Cross-fitting (`train --folds K`, K >= 2): K models, each with one fold of the episodes held
    out (datasets.split.fold_of); val_fraction is then unused. 0: one model, the validation split."""
    fold: int = 0
    """Which fold this model holds out (0 .. folds - 1; set by `train --folds`, one run per fold)."""
    val_every: int = 250
    """Optimiser steps between validation + open-loop evaluations (and early-stopping decisions)."""
    patience: int = 4
    """Early stopping: stop when the last `patience` validations together improved the best value of
    the `stop_on` metric by at most `min_improvement` of its total improvement since the first
    validation (0 = never stop early). The best checkpoint, not the last, becomes RUNDIR/model.pt."""
    min_improvement: float = 0.02
    """Early stopping's share (training/stopping.py): 0 = stop only after `patience` validations
    without any new best. The validation loss keeps creeping down long after the open-loop error has
    levelled off, so the last few percent of it cost most of the time; 0.05 stopped HalfCheetah
    with a model barely better than ARX, 0.02 did not (docs/model.md, "Training defaults")."""
    stop_on: str = "loss"
    """The metric of early stopping and of the best checkpoint: "loss" = `val/loss/total`, the
    training objective on held-out windows; "openloop" = `val/openloop_nrmse`, the mean NRMSE over
    every imagined step of `stop_windows` held-out open-loop windows (what the check judges a model
    by), which falls back to "loss" when no held-out episode is long enough for a window. The loss
    is the default: measured on Pendulum, the open-loop error moves between neighbouring
    validations by more than it improves (0.47 -> 0.56 -> 0.48 on 128 windows), so stopping on it
    ends early on a lucky validation (docs/benchmarks.md, "World-model defaults")."""
    max_minutes: float = 0.0
    """Wall-clock budget for training in minutes (0 = none); the best checkpoint so far is kept."""
    val_batches: int = 4
    ckpt_every: int = 200
    """Optimiser steps between resumable checkpoints (RUNDIR/checkpoints/last.ckpt)."""
    log_every: int = 25
    openloop_context: int = 16
    openloop_horizons: tuple[int, ...] = (1, 4, 16, 64)
    openloop_windows: int = 16
    """Number of held-out windows evaluated open-loop at each validation for TensorBoard's openloop/*."""
    stop_windows: int = 128
    """Held-out windows of the early-stopping metric `val/openloop_nrmse` (stop_on "openloop"): other
    window starts than the quality card's, in the same held-out episodes. More than the figures'
    16: on Pendulum, 16 windows drawn again gave 0.24-0.44 for the same weights, 256 gave 0.40-0.42."""
    accelerator: str = "auto"
    """Lightning accelerator: auto, cpu, gpu, ..."""
    devices: str = "auto"
    """Lightning devices: auto, N, or a list like 0,1."""
    strategy: str = "auto"
    """Lightning strategy: auto, ddp, ..."""
    precision: str = "auto"
    """"auto": bf16-mixed on CUDA GPUs (norms, softmax and losses stay fp32), 32-true elsewhere."""
    progress_bar: bool = True
    images: bool = True
    """Model the log's camera groups ((N+1, H, W, C) uint8) with the CNN encoder/decoder; False = vectors only."""

    def __post_init__(self) -> None:
        if isinstance(self.openloop_horizons, list):
            self.openloop_horizons = tuple(self.openloop_horizons)
        for name in ("max_steps", "batch_size", "seq_len", "val_every", "ckpt_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "eps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not (math.isfinite(self.agc) and self.agc >= 0) or self.warmup < 0:
            raise ValueError(f"agc must be finite and >= 0 and warmup >= 0, got {self.agc}, {self.warmup}")
        if self.patience < 0 or not (math.isfinite(self.max_minutes) and self.max_minutes >= 0):
            raise ValueError(f"patience and max_minutes must be >= 0, got {self.patience}, {self.max_minutes}")
        if not (isinstance(self.min_improvement, (int, float)) and 0.0 <= self.min_improvement < 1.0):
            raise ValueError(f"min_improvement must be in [0, 1), got {self.min_improvement}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.folds == 1 or self.folds < 0 or not (self.folds == 0 or 0 <= self.fold < self.folds):
            raise ValueError(
                f"folds must be 0 or >= 2 and fold in [0, folds), got folds {self.folds}, fold {self.fold}"
            )
        if self.stop_on not in STOP_METRICS:
            raise ValueError(f"stop_on must be one of {', '.join(STOP_METRICS)}, got {self.stop_on!r}")
        if self.openloop_context < 1:
            raise ValueError("openloop_context must be >= 1")
        if self.openloop_windows < 1 or self.stop_windows < 1:
            raise ValueError(
                f"openloop_windows and stop_windows must be >= 1, got {self.openloop_windows}, {self.stop_windows}"
            )


@dataclass
class RunConfig:
    model: WorldModelConfig = field(default_factory=WorldModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return {"model": self.model.to_dict(), "train": dataclasses.asdict(self.train)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Strict: unknown keys (another wmcheck version's config) are an error, not ignored."""
        unknown = sorted(set(d) - {"model", "train"}) + sorted(
            set(d.get("train", {})) - {f.name for f in dataclasses.fields(TrainConfig)}
        )
        if unknown:
            raise ValueError(f"unknown run config keys {unknown}: the run was written by another wmcheck version")
        return cls(WorldModelConfig.from_dict(d["model"]), TrainConfig(**d["train"]))
