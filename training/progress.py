"""Training progress: optimiser steps out of `max_steps`, never epochs.

Training is one endless epoch over random windows, so Lightning's own bar reads "Epoch 0/-2" and
counts nothing useful. `training_progress()` picks the display the way datasets/progress.py does for
the other long loops, on stderr (stdout stays the command's result):
  a terminal   `StepProgressBar`: one tqdm bar `step k/N` with total N = max_steps (a resumed run starts
               at its step), the loss beside it, the short validation bar under it;
  a log / CI   `StepLines`: sparse lines `training steps [####....] k/N 12 s` (the first after
               `LOG_FIRST_S` seconds, then at most one every `LOG_EVERY_S`, and the last), not one per step.
`WMCHECK_PROGRESS=0` turns both off. Either is a Lightning `ProgressBar` callback, usable in a user's
own `Trainer(callbacks=[training_progress()])`.
"""

from __future__ import annotations

import sys
import time

from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from wmcheck.datasets import progress as pg

LABEL = "training steps"


def _total(trainer) -> int | None:
    return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None


def step_description(step: int, total: int | None) -> str:
    return f"step {step}/{total}" if total else f"step {step}"


class StepProgressBar(TQDMProgressBar):
    """A tqdm bar over optimiser steps: description `step k/N`, total `trainer.max_steps`."""

    BAR_FORMAT = "{desc}{percentage:3.0f}%|{bar}| [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, stream=None):
        # leave=False: the base class would close (and re-open) the bar at every epoch boundary
        super().__init__(refresh_rate=refresh_rate, leave=False)
        self.stream = stream

    def _tqdm(self, desc: str, position: int, leave: bool, **kw) -> Tqdm:
        return Tqdm(
            desc=f"{desc}: ",  # as set_description writes it later
            position=position,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=self.stream if self.stream is not None else sys.stderr,
            bar_format=self.BAR_FORMAT,
            **kw,
        )

    def init_train_tqdm(self) -> Tqdm:
        desc = step_description(self.trainer.global_step, _total(self.trainer))
        return self._tqdm(desc, 2 * self.process_position, True, smoothing=0)

    def init_sanity_tqdm(self) -> Tqdm:
        return self._tqdm(self.sanity_check_description, 2 * self.process_position, False)

    def init_validation_tqdm(self) -> Tqdm:
        has_main_bar = self.trainer.state.fn != "validate"
        return self._tqdm(self.validation_description, 2 * self.process_position + has_main_bar, not has_main_bar)

    def on_train_start(self, trainer, pl_module) -> None:
        self.train_progress_bar = bar = self.init_train_tqdm()
        total = _total(trainer)
        bar.reset(total=total)
        bar.initial = bar.n = trainer.global_step  # a resumed run starts where it stopped
        bar.set_description(step_description(trainer.global_step, total), refresh=False)
        if not bar.disable:
            bar.refresh()

    def on_train_epoch_start(self, trainer, *_) -> None:
        """Nothing: the bar counts steps across the (endless) epoch, it is not reset per epoch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self._train_progress_bar
        n = trainer.global_step
        if bar is None or bar.disable or not self._should_update(n, bar.total):
            return
        bar.n = n
        bar.set_description(step_description(n, bar.total), refresh=False)
        bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)  # the run folder's name ("tb"), not a metric
        return items


class StepLines(ProgressBar):
    """Sparse progress lines for logs (datasets/progress.py's `Progress`): `training steps [##..] k/N t s`."""

    def __init__(self, stream=None, clock=time.monotonic):
        super().__init__()
        self.stream, self.clock = stream, clock
        self._enabled = True
        self._progress: pg.Progress | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer, pl_module) -> None:
        if not self._enabled:
            return
        self._progress = pg.Progress(_total(trainer) or 0, LABEL, self.stream, clock=self.clock)
        self._progress.done = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._progress is not None and trainer.global_step > self._progress.done:
            self._progress.update(trainer.global_step - self._progress.done)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None


def training_progress(stream=None) -> ProgressBar:
    """The progress callback for `stream` (default stderr): a step bar on a terminal, sparse lines otherwise."""
    target = stream if stream is not None else sys.stderr
    tty = bool(getattr(target, "isatty", lambda: False)())
    if tty and pg.enabled():
        return StepProgressBar(stream=stream)
    return StepLines(stream=stream)
