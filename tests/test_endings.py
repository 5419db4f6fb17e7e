"""The ending test (checks/endings.py) and Fisher's exact test, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.checks.endings import ending_evidence, real_endings
from wmcheck.checks.stats import fisher_exact_p
from wmcheck.datasets.episode import Episode


def _ep(i, steps, terminated, last=0.0):
    obs = np.zeros((steps + 1, 1), np.float32)
    obs[-1] = last
    term = np.zeros(steps, bool)
    term[-1] = terminated
    return Episode(obs, np.zeros((steps, 1), np.float32), terminations=term, id=i)


def test_fisher_exact_matches_textbook_values():
    assert fisher_exact_p(3, 10, 1, 10) == pytest.approx(0.5820, abs=1e-4)  # scipy.stats.fisher_exact
    assert fisher_exact_p(8, 8, 0, 48) < 1e-8 and fisher_exact_p(0, 5, 0, 40) == 1.0
    assert fisher_exact_p(5, 10, 5, 10) == 1.0


def test_ending_test_finds_early_terminations_and_ignores_truncations():
    real = real_endings([_ep(i, 200, False) for i in range(40)])
    assert real == {"episodes": 40, "terminated": 0, "terminated_steps_mean": None}
    level = 0.005
    early = ending_evidence([_ep(i, 30, True) for i in range(8)], real, level, (np.array([-1.0]), np.array([1.0])))
    assert early.fires and early.detail.checked_terminated == 8 and early.detail.checked_steps == 30
    cut = ending_evidence([_ep(i, 30, False) for i in range(8)], real, level)  # a time limit, not an ending
    assert not cut.fires and cut.checked
    # terminations outside the real logs' range are not judged (a goal no real log reached)
    far = ending_evidence(
        [_ep(i, 30, True, last=5.0) for i in range(8)], real, level, (np.array([-1.0]), np.array([1.0]))
    )
    assert not far.checked and "outside" in far.reason
    assert not ending_evidence([_ep(0, 30, True)], None, level).checked  # an older calibration
