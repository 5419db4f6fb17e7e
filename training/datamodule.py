"""The Lightning data module over a wmcheck log: split, normalise, sample training windows.

Owns: validating the log before training (errors become one UserError listing every problem),
the deterministic episode-level split, fitting the normaliser once on the training episodes,
an endless stream of random training windows (B, T) in DreamerV3's alignment, a fixed set of
validation windows, and the held-out windows used for `openloop/*`.

Reusable in a user's own `lightning.Trainer`: its arguments are saved as plain hyper-parameters
(the log path and the TrainConfig as a dict), so `LogDataModule.load_from_checkpoint(path)` works
with weights_only=True too; `model_config` sizes a world-model config for the log.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import training_split
from wmcheck.datasets.validate import validate_log
from wmcheck.datasets.windows import MIN_HORIZON, Batch, WindowSampler, fitted_geometry
from wmcheck.training.config import TrainConfig
from wmcheck.worldmodel.config import WorldModelConfig


def image_spec(specs: dict, path) -> dict:
    """World-model config fields for the log's camera groups: {key: ((H, W, C), dtype)} ->
    image_keys / image_key_channels / image_shape (keys stacked on the channel axis)."""
    frames = {k: (shape, dtype) for k, (shape, dtype) in specs.items() if len(shape) == 3 and dtype == np.uint8}
    if not frames:
        return {}
    sizes = {tuple(shape[:2]) for shape, _ in frames.values()}
    if len(sizes) > 1:
        raise UserError(
            f"{path}: camera groups {sorted(frames)} have different sizes {sorted(sizes)}",
            "record all cameras at one size (wmcheck record --render WxH), or train with --no-images",
        )
    keys = sorted(frames)
    channels = [int(frames[k][0][2]) for k in keys]
    H, W = sizes.pop()
    return {"image_keys": keys, "image_key_channels": channels, "image_shape": [int(H), int(W), sum(channels)]}


def batch_to(batch: Batch, device) -> Batch:
    """Move a tensor Batch to `device`."""
    return batch.map(lambda x: x.to(device))


class _RandomWindows(IterableDataset):
    """Endless random windows. The RNG is seeded from (seed, rank, start step), so a resumed run
    draws new windows rather than replaying the ones seen before the kill."""

    def __init__(self, sampler: WindowSampler, batch_size: int, seed: int):
        self.sampler, self.batch_size, self.seed = sampler, batch_size, seed
        self.start_step = 0
        self.rank = 0

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.rank, self.start_step])
        while True:
            yield self.sampler.sample(rng, self.batch_size).to_torch()


class LogDataModule(L.LightningDataModule):
    """Windows of the wmcheck log at `log_path` for training and validation. train: a TrainConfig
    or its dict (batch size, window length, split, seed, ...)."""

    def __init__(self, log_path: str | os.PathLike, train: TrainConfig | dict):
        super().__init__()
        if isinstance(train, dict):
            train = TrainConfig(**train)
        self.save_hyperparameters({"log_path": str(log_path), "train": dataclasses.asdict(train)}, logger=False)
        self.log_path = Path(log_path)
        self.cfg = train
        self.normalizer: Normalizer | None = None
        self.train_ids: list[int] = []
        self.val_ids: list[int] = []
        self.val_lengths: list[int] = []  # step views (steps + 1) of the held-out episodes
        self.channels: dict = {}
        self.image_spec: dict = {}
        self._train_sampler = self._val_sampler = None

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.normalizer.dims

    @property
    def has_validation(self) -> bool:
        return self._val_sampler is not None

    def prepare(self) -> None:
        """Validate, split and fit the normaliser (runs in the main process, before the Trainer)."""
        report = validate_log(self.log_path)
        if not report.ok:
            errors = [f for f in report.findings if f.severity == "error"]
            listing = "; ".join(f.message for f in errors[:10]) + (
                f"; ... {len(errors) - 10} more" if len(errors) > 10 else ""
            )
            raise UserError(
                f"{self.log_path} has {len(errors)} problem(s): {listing}",
                f"run `wmcheck validate {self.log_path}` for the full list and fix or re-import the log",
            )
        c = self.cfg
        with open_log(self.log_path) as log:
            meta = log.meta
            ids = log.episode_ids
            self.train_ids, self.val_ids = training_split(ids, c.val_fraction, c.seed, c.folds, c.fold)
            # Cross-fitted folds share one normaliser (fitted on every episode: channel means and
            # stds only), so that all folds' scores live in the same normalised units and pool.
            fit_ids = ids if c.folds else self.train_ids
            self.normalizer = Normalizer.fit(log.episodes(fit_ids, groups=False), meta)
            self.val_lengths = [log.num_steps(i) + 1 for i in self.val_ids]
            val_steps = sum(self.val_lengths)
            specs = log.group_specs(ids[0])
        if not c.folds:  # a cross-fitted fold keeps the context train_folds fitted to every episode
            self.cfg = c = dataclasses.replace(c, openloop_context=self.openloop_geometry()[0])
        self.image_spec = image_spec(specs, self.log_path) if c.images else {}
        self.channels = {
            "observation_names": self.normalizer.names["obs"],
            "image_keys": list(self.image_spec.get("image_keys", [])),
            "action_names": self.normalizer.names["action"],
            "input_names": self.normalizer.names["input"],
            "units": dict(meta.units),
            "dt": meta.dt,
            "source": meta.source,
        }
        self._train_sampler = WindowSampler(self.log_path, self.train_ids, self.normalizer, c.seq_len)
        if self.val_ids and val_steps >= c.seq_len:
            self._val_sampler = WindowSampler(self.log_path, self.val_ids, self.normalizer, c.seq_len)

    def openloop_geometry(self) -> tuple[int, int]:
        """(context, window length) of the held-out open-loop windows: the asked
        `openloop_context` + its longest horizon, shrunk by the check's rule
        (datasets.windows.fitted_geometry) until a window fits the median held-out episode, so
        that the quality card and the stopping metric rest on at least half of the held-out
        episodes and on the geometry calibration will choose. `prepare` fits the config's
        `openloop_context` to it (the rule is idempotent), so every user of `cfg` (the module, its
        metrics, the card) observes the same steps."""
        return openloop_geometry(self.cfg, self.val_lengths)

    def model_config(self, base: WorldModelConfig) -> WorldModelConfig:
        """`base` sized for this log: its observation / action / input dimensions and camera groups
        (prepares the module first if needed). A ValueError when the frames do not fit the CNN."""
        if self.normalizer is None:
            self.prepare()
        obs_dim, action_dim, input_dim = self.dims
        return dataclasses.replace(base, obs_dim=obs_dim, action_dim=action_dim, input_dim=input_dim, **self.image_spec)

    def setup(self, stage: str | None = None) -> None:
        if self.normalizer is None:
            self.prepare()

    def train_dataloader(self):
        ds = _RandomWindows(self._train_sampler, self.cfg.batch_size, self.cfg.seed)
        if self.trainer is not None:
            ds.start_step = self.trainer.global_step
            ds.rank = self.trainer.global_rank
        return DataLoader(ds, batch_size=None, num_workers=0)

    def val_dataloader(self):
        if self._val_sampler is None:
            return []
        rng = np.random.default_rng([self.cfg.seed, 12345])  # the same validation windows every time
        batches = [self._val_sampler.sample(rng, self.cfg.batch_size).to_torch() for _ in range(self.cfg.val_batches)]
        return DataLoader(batches, batch_size=None, num_workers=0)

    def openloop_sequence(
        self,
        windows: int | None = None,
        length: int | None = None,
        with_episodes: bool = False,
        stream: str = "card",
    ):
        """Held-out windows lying inside single validation episodes (no episode start inside),
        of length context + max horizon (shortened to what the episodes allow): a Batch (B, T, ...),
        or None when no validation episode is long enough. with_episodes: also each window's
        validation episode index (B,), as a tuple (batch, episodes) (None, None when there is none).
        stream: "card" (the quality card's and TensorBoard's windows) or "stop" (the early-stopping
        metric's: other window starts, so that weights are not selected on the card's windows)."""
        if not self.val_ids:
            return (None, None) if with_episodes else None
        c = self.cfg
        windows = windows or c.openloop_windows
        length = min(length or (c.openloop_context + max(c.openloop_horizons)), self.openloop_geometry()[1])
        length = max(length, c.openloop_context + MIN_HORIZON)  # a fold's shorter episodes: fewer windows, not none
        sampler = self._val_sampler or WindowSampler(self.log_path, self.val_ids, self.normalizer, 1)
        episodes = [(i, b) for i, b in enumerate(sampler.episodes()) if b.obs.shape[1] > c.openloop_context + 1]
        if not episodes:
            return (None, None) if with_episodes else None
        length = min(length, max(b.obs.shape[1] for _, b in episodes))
        usable = [(i, b) for i, b in episodes if b.obs.shape[1] >= length]
        rng = np.random.default_rng([c.seed, WINDOW_STREAMS[stream]])
        picks, which = [], []
        for k in range(windows):
            i, b = usable[k % len(usable)]
            start = int(rng.integers(0, b.obs.shape[1] - length + 1))
            picks.append(_slice(b, start, start + length))
            which.append(i)
        batch = Batch.concat(picks).to_torch()
        return (batch, np.array(which)) if with_episodes else batch


def openloop_geometry(t: TrainConfig, lengths: list[int]) -> tuple[int, int]:
    """(context, window length) of open-loop windows over episodes of `lengths` steps (step views):
    `t.openloop_context` + its longest horizon, fitted by datasets.windows.fitted_geometry. One
    place for the data module's held-out windows and for cross-fitting's one context of all folds."""
    context, horizon = fitted_geometry(lengths, t.openloop_context, max(t.openloop_horizons))
    return context, context + horizon


WINDOW_STREAMS = {"card": 777, "stop": 778}
"""Random streams of the held-out open-loop windows (LogDataModule.openloop_sequence)."""


def _slice(b: Batch, start: int, stop: int) -> Batch:
    return b.map(lambda x: x[:, start:stop].copy()).start_from_initial_state()
