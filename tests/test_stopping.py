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


class _Strategy:
    def reduce_boolean_decision(self, decision, all=True):
        return decision


class _Trainer:
    """The attributes the callback reads: the Lightning Trainer's own names."""

    def __init__(self, value):
        from lightning.pytorch.trainer.states import TrainerFn, TrainerState

        self.sanity_checking = False
        self.state = TrainerState(fn=TrainerFn.FITTING)
        self.callback_metrics = {"val/loss/total": value}
        self.strategy = _Strategy()
        self.should_stop = False


@pytest.mark.parametrize("split_at", [1, 3, 5])
def test_a_resumed_callback_decides_as_the_uninterrupted_one(split_at):
    values = [3.0, 1.0, 0.2, 0.1, 0.09, 0.085, 0.084, 0.0839]
    whole = DiminishingReturnsStopping("val/loss/total", 2, 0.05)
    stops = []
    for v in values:
        t = _Trainer(v)
        whole.on_validation_end(t, None)
        stops.append(t.should_stop)
    first = DiminishingReturnsStopping("val/loss/total", 2, 0.05)
    for v in values[:split_at]:
        first.on_validation_end(_Trainer(v), None)
    resumed = DiminishingReturnsStopping("val/loss/total", 2, 0.05)
    resumed.load_state_dict(first.state_dict())
    again = []
    for v in values[split_at:]:
        t = _Trainer(v)
        resumed.on_validation_end(t, None)
        again.append(t.should_stop)
    assert again == stops[split_at:]
    assert any(stops) and resumed.stopped == whole.stopped


def test_a_missing_metric_is_an_error_not_a_silent_run_to_the_cap():
    cb = DiminishingReturnsStopping("val/openloop_nrmse", 2, 0.05)
    with pytest.raises(RuntimeError, match="val/openloop_nrmse"):
        cb.on_validation_end(_Trainer(1.0), None)
