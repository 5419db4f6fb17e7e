"""Early stopping on diminishing returns: the rule that ends a training run before its step cap.

`plateaued(history, patience, min_improvement)` is the rule, on the monitored validation values in
the order they were measured (lower is better):

    stop when the last `patience` validations together lowered the best value by at most
    `min_improvement` x (the first value - the best value),

i.e. when the most recent window brought at most that share of all the improvement training has
made. With `min_improvement` 0 it is the usual rule ("no new best in `patience` validations"). The
share is scale- and offset-free: the validation loss of a world model is a sum of negative
log-likelihoods and KL terms whose level depends on the system (it goes below zero), so an absolute
`min_delta` would mean something different on every log.

Why a share: the validation loss keeps creeping down long after the open-loop error that a check
judges the model by has levelled off (docs/model.md, "Training defaults"), so the last few percent
of the loss cost most of the wall time and buy little.

`DiminishingReturnsStopping` is the Lightning callback: it records the monitored metric after each
validation, stops every process of a multi-device run when one decides to, and keeps its history in
the checkpoint so a resumed run decides as the uninterrupted one would. A run resumed after it
stopped (`wmcheck train` again on the same folder, e.g. with a higher `--max-steps`) applies the rule
to that history before its first step, with the settings it is given now: when it still holds, no
step is trained (before, one more validation interval was trained before the rule stopped it again);
a run given a smaller `--min-improvement` or a longer `--patience` trains on until its rule holds.
"""

from __future__ import annotations

import math

from lightning.pytorch.callbacks import Callback


def plateaued(history: list[float], patience: int, min_improvement: float) -> bool:
    """True when the last `patience` values lowered the best by at most `min_improvement` of the
    total improvement since the first value. Non-finite values never count as an improvement."""
    if patience < 1 or len(history) <= patience:
        return False
    values = [v if math.isfinite(v) else math.inf for v in history]
    best_now = min(values)
    best_before = min(values[:-patience])
    if not math.isfinite(best_now):
        return True  # nothing finite was ever measured
    gain = best_before - best_now  # what the last `patience` validations brought (>= 0)
    total = max(values[0] - best_now, 0.0) if math.isfinite(values[0]) else gain
    return gain <= min_improvement * total


class DiminishingReturnsStopping(Callback):
    """Stop training when `plateaued` holds for the monitored metric (see the module docstring)."""

    def __init__(self, monitor: str, patience: int, min_improvement: float):
        super().__init__()
        self.monitor = monitor
        self.patience = patience
        self.min_improvement = min_improvement
        self.history: list[float] = []
        self.stopped = False

    @property
    def state_key(self) -> str:
        return f"{type(self).__name__}[{self.monitor}]"

    def on_train_start(self, trainer, pl_module) -> None:
        """A resumed run whose restored history already meets the rule stops before its first step."""
        self.stopped = False  # decided again with this run's settings
        self._decide(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        from lightning.pytorch.trainer.states import TrainerFn

        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            raise RuntimeError(f"early stopping monitors {self.monitor!r}, which validation did not log")
        self.history.append(float(value))
        self._decide(trainer)

    def _decide(self, trainer) -> None:
        stop = plateaued(self.history, self.patience, self.min_improvement)
        stop = trainer.strategy.reduce_boolean_decision(stop, all=False)  # any process stopping stops all
        if stop:
            self.stopped = True
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"history": list(self.history), "stopped": self.stopped}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [float(v) for v in state_dict.get("history", [])]
        self.stopped = bool(state_dict.get("stopped", False))
