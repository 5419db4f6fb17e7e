"""Early stopping on diminishing returns (training/stopping.py): the rule against brute force and
closed forms, its invariance to the loss's scale and level, and its state across a resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wmcheck.training.stopping import DiminishingReturnsStopping, plateaued


def first_stop(values, patience, share):
    """The index of the validation at which training stops, or None."""
    for k in range(1, len(values) + 1):
        if plateaued(list(values[:k]), patience, share):
            return k - 1
    return None


def test_share_zero_is_no_new_best_in_patience_validations():
    """With a share of 0 the rule is the usual one: stop at the first validation that is the
    `patience`-th in a row without a new best (brute force on random curves)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        values = np.cumsum(rng.normal(-0.1, 1.0, 30))
        patience = int(rng.integers(1, 5))
        expected, best, since = None, math.inf, 0
        for k, v in enumerate(values):
            if v < best:
                best, since = v, 0
            else:
                since += 1
                if since >= patience:
                    expected = k
                    break
        assert first_stop(values, patience, 0.0) == expected


def test_a_geometric_curve_stops_where_the_closed_form_says():
    """v_k = r^k: the last W validations bring r^(k-W) (1 - r^W), the total is 1 - r^k; the first k
    with r^(k-W) (1 - r^W) <= f (1 - r^k) is the stop."""
    for r, W, f in [(0.8, 4, 0.05), (0.9, 2, 0.1), (0.7, 3, 0.02)]:
        values = [r**k for k in range(200)]
        expected = next(k for k in range(W, 200) if r ** (k - W) * (1 - r**W) <= f * (1 - r**k))
        assert first_stop(values, W, f) == expected


def test_a_steady_decline_stops_when_the_window_is_the_share_of_the_whole():
    """A straight line falls by W steps' worth in the window and k steps' worth in all: W / k <= f."""
    values = [100.0 - 0.5 * k for k in range(100)]  # exact in binary: the tie at k = W / f is a stop
    assert first_stop(values, 4, 0.25) == 16
    assert first_stop(values, 4, 0.0) is None


def test_the_rule_ignores_the_losss_scale_and_level():
    """The world model's loss goes below zero and its level depends on the system."""
    rng = np.random.default_rng(1)
    for _ in range(100):
        values = np.cumsum(rng.normal(-0.2, 1.0, 40))
        a, b = float(rng.uniform(0.01, 100)), float(rng.normal(0, 50))
        assert first_stop(values, 3, 0.05) == first_stop(a * values + b, 3, 0.05)


def test_non_finite_values_never_count_as_improvement():
    assert plateaued([1.0, 0.5, math.nan, math.nan], 2, 0.0)
    assert not plateaued([1.0, math.nan, 0.5, 0.2], 2, 0.05)
    assert plateaued([math.nan, math.nan, math.nan], 2, 0.05)


VALUES = [3.0, 1.0, 0.2, 0.1, 0.09, 0.085, 0.084, 0.0839, 0.0838, 0.0837]
"""Validation values, one per validation; with patience 2 and share 0.05 the rule stops at the 5th."""
EVERY = 2  # optimiser steps between validations


class _Scripted:
    """A LightningModule whose validation logs VALUES[k] at its k-th validation (k from the global
    step, so a resumed run logs what the uninterrupted one did) under `metric`."""

    def __new__(cls, metric="val/loss/total"):
        import lightning as L
        import torch

        class Module(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))

            def training_step(self, batch, _):
                return (self.w - batch[0]).pow(2).mean()

            def validation_step(self, batch, _):
                self.log(metric, VALUES[self.global_step // EVERY - 1])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        return Module()


def _fit(tmp_path, max_steps, metric="val/loss/total", ckpt_path=None, share=0.05):
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = DataLoader(TensorDataset(torch.ones(1000, 1)), batch_size=1)
    stopper = DiminishingReturnsStopping("val/loss/total", 2, share)
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[stopper],
        val_check_interval=EVERY,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=str(tmp_path),
    )
    trainer.fit(_Scripted(metric), train_dataloaders=data, val_dataloaders=data, ckpt_path=ckpt_path)
    return trainer, stopper


@pytest.mark.parametrize("split_at", [1, 3, 4])  # validations before the interruption (the stop is the 5th)
def test_a_resumed_run_stops_where_the_uninterrupted_one_does(split_at, tmp_path):
    """Through a real Lightning Trainer and its checkpoint: the history is saved and restored."""
    expected = first_stop(VALUES, 2, 0.05)
    whole, stopper = _fit(tmp_path / "whole", max_steps=100)
    assert stopper.stopped and whole.global_step == (expected + 1) * EVERY
    first, _ = _fit(tmp_path / "first", max_steps=split_at * EVERY)
    ckpt = tmp_path / "first.ckpt"
    first.save_checkpoint(ckpt)
    resumed, again = _fit(tmp_path / "resumed", max_steps=100, ckpt_path=str(ckpt))
    assert again.stopped and resumed.global_step == whole.global_step
    assert again.history == stopper.history == pytest.approx(VALUES[: expected + 1])  # logged as float32


def test_a_missing_metric_is_an_error_not_a_silent_run_to_the_cap(tmp_path):
    with pytest.raises(RuntimeError, match="val/loss/total"):
        _fit(tmp_path, max_steps=10, metric="val/other")


def test_a_run_resumed_after_it_stopped_trains_no_further_step(tmp_path):
    """`wmcheck train` again on a run that stopped early (here with a higher step cap) stops
    before its first step, on the restored history; a smaller share trains on where it says."""
    whole, stopper = _fit(tmp_path / "whole", max_steps=100)
    ckpt = tmp_path / "stopped.ckpt"
    whole.save_checkpoint(ckpt)
    again, again_stopper = _fit(tmp_path / "again", max_steps=200, ckpt_path=str(ckpt))
    assert again_stopper.stopped and again.global_step == whole.global_step
    assert again_stopper.history == stopper.history  # no validation ran

    assert first_stop(VALUES, 2, 0.0) is None  # every value is a new best: share 0 never stops
    cap = len(VALUES) * EVERY
    later, later_stopper = _fit(tmp_path / "later", max_steps=cap, ckpt_path=str(ckpt), share=0.0)
    assert not later_stopper.stopped and later.global_step == cap
    assert later_stopper.history == pytest.approx(VALUES)
