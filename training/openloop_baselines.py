"""Open-loop baselines for the world model: persistence and a linear ARX model, in normalised units.

Owns the two reference predictors that scripts/bench_worldmodel.py compares the world model with,
under the same protocol as `wmcheck.training.openloop`: observe `context` steps of a window, then
predict the remaining steps under the logged controls, without seeing any further observation.

Data are in the training view of `wmcheck.datasets.windows` (normalised with the training
normaliser, DreamerV3 alignment): `obs[t]` = o_t and `ctrl[t]` = concat(prev_action, prev_input)[t]
= u_{t-1}, the control that acted on the step from t-1 to t (zero at an episode's first row).

- Persistence: o_hat_{t} = o_{context-1} for every t >= context (the last observed value).
- ARX(p, q): o_t = c + sum_{i=1..p} A_i o_{t-i} + sum_{j=1..q} B_j u_{t-j}, fitted by ridge-regularised
  least squares on every step of the training episodes with a full history (t >= max(p, q), so
  the zero "control before the first row" never enters a regressor). Open loop, the predictions
  replace the observations in the regressors after the context; the controls are the logged ones.
  `select_arx` chooses (p, q) on an inner split of the training episodes (never the evaluation
  episodes), by open-loop error (default, the strongest baseline for an open-loop benchmark) or
  by one-step error.

Everything is numpy; nothing here depends on the world model.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepSeq:
    """One episode (or window) in the training view."""

    obs: np.ndarray  # (T, D) normalised observations o_t
    ctrl: np.ndarray  # (T, U) u_{t-1}: previous action and input, normalised (U may be 0)


def step_seqs_from_batches(batches) -> list[StepSeq]:
    """Batches with B = 1 (WindowSampler.episodes()) -> StepSeqs (numpy)."""
    out = []
    for b in batches:
        obs = np.asarray(b.obs, np.float64)[0]  # (T, D)
        ctrl = np.concatenate(
            [np.asarray(b.prev_action, np.float64)[0], np.asarray(b.prev_input, np.float64)[0]], -1
        )  # (T, U)
        out.append(StepSeq(obs, ctrl))
    return out


def persistence(obs: np.ndarray, context: int) -> np.ndarray:
    """obs (B, T, D) -> predictions (B, T-context, D): the last context value, held."""
    B, T, D = obs.shape
    return np.repeat(obs[:, context - 1 : context], T - context, axis=1)


@dataclass
class ARX:
    """Multi-output linear ARX model with orders p (observations) and q (controls)."""

    p: int = 2
    q: int = 2
    ridge: float = 1e-6
    """Ridge penalty relative to the mean diagonal of X^T X (scale-free); only guards collinearity."""
    coef: np.ndarray | None = field(default=None, repr=False)  # (p*D + q*U + 1, D)

    def __post_init__(self) -> None:
        if self.p < 1 or self.q < 0:
            raise ValueError(f"ARX needs p >= 1 and q >= 0, got p={self.p}, q={self.q}")

    @property
    def lag(self) -> int:
        return max(self.p, self.q)

    def _features(self, obs_hist: np.ndarray, ctrl_hist: np.ndarray) -> np.ndarray:
        """obs_hist (N, p, D) = o_{t-1..t-p}; ctrl_hist (N, q, U) = u_{t-1..t-q} -> (N, p*D + q*U + 1)."""
        N = obs_hist.shape[0]
        return np.concatenate([obs_hist.reshape(N, -1), ctrl_hist.reshape(N, -1), np.ones((N, 1))], -1)

    def _rows(self, s: StepSeq) -> tuple[np.ndarray, np.ndarray]:
        """Regressors and targets of every step t in [lag, T) of one sequence."""
        T = s.obs.shape[0]
        ts = np.arange(self.lag, T)  # (N,)
        if ts.size == 0:
            return np.zeros((0, self._nfeat(s)), np.float64), np.zeros((0, s.obs.shape[1]))
        oi = ts[:, None] - np.arange(1, self.p + 1)[None, :]  # (N, p): t-1 .. t-p
        ci = ts[:, None] - np.arange(0, self.q)[None, :]  # (N, q): ctrl[t] = u_{t-1} .. ctrl[t-q+1] = u_{t-q}
        return self._features(s.obs[oi], s.ctrl[ci]), s.obs[ts]

    def _nfeat(self, s: StepSeq) -> int:
        return self.p * s.obs.shape[1] + self.q * s.ctrl.shape[1] + 1

    def fit(self, seqs: Sequence[StepSeq]) -> ARX:
        xs, ys = zip(*(self._rows(s) for s in seqs))
        X, Y = np.concatenate(xs), np.concatenate(ys)  # (N, F), (N, D)
        if X.shape[0] < X.shape[1]:
            raise ValueError(f"ARX({self.p},{self.q}): {X.shape[0]} training rows for {X.shape[1]} coefficients")
        G = X.T @ X  # (F, F)
        lam = self.ridge * np.trace(G) / G.shape[0]
        self.coef = np.linalg.solve(G + lam * np.eye(G.shape[0]), X.T @ Y)  # (F, D)
        return self

    def one_step(self, seqs: Sequence[StepSeq]) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, targets) (N, D) of every step with a full history, from true past observations."""
        xs, ys = zip(*(self._rows(s) for s in seqs))
        return np.concatenate(xs) @ self.coef, np.concatenate(ys)

    def openloop(self, obs: np.ndarray, ctrl: np.ndarray, context: int) -> np.ndarray:
        """obs (B, T, D), ctrl (B, T, U) -> predictions (B, T-context, D) of steps context..T-1.

        Uses obs[:, :context] only; ctrl at every step (the logged controls)."""
        if self.coef is None:
            raise RuntimeError("fit the ARX model first")
        B, T, D = obs.shape
        if context < self.p or context < self.q - 1:
            raise ValueError(f"context {context} is shorter than the ARX orders p={self.p}, q={self.q}")
        hist = obs[:, :context].astype(np.float64).copy()  # (B, context, D), grows with predictions
        hist = np.concatenate([hist, np.zeros((B, T - context, D))], 1)  # (B, T, D)
        for t in range(context, T):
            oh = hist[:, t - self.p : t][:, ::-1]  # (B, p, D): t-1 .. t-p
            ch = ctrl[:, t - self.q + 1 : t + 1][:, ::-1] if self.q else ctrl[:, :0]  # (B, q, U)
            with np.errstate(over="ignore", invalid="ignore"):
                hist[:, t] = self._features(oh, ch.astype(np.float64)) @ self.coef
        return hist[:, context:]


def windows_from_seqs(seqs: Sequence[StepSeq], length: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """All windows of `length` steps (every `stride`) inside single sequences: obs (B, L, D), ctrl (B, L, U)."""
    obs, ctrl = [], []
    for s in seqs:
        for start in range(0, s.obs.shape[0] - length + 1, stride):
            obs.append(s.obs[start : start + length])
            ctrl.append(s.ctrl[start : start + length])
    if not obs:
        raise ValueError(f"no sequence holds a window of {length} steps")
    return np.stack(obs), np.stack(ctrl)


def openloop_error(pred: np.ndarray, truth: np.ndarray) -> float:
    """Mean squared error over windows, steps and channels; inf for a diverging prediction."""
    err = np.mean((pred - truth) ** 2)
    return float(err) if np.isfinite(err) else float("inf")


@dataclass
class Selection:
    p: int
    q: int
    criterion: str
    scores: dict[str, float]  # "p,q" -> inner-validation score (lower is better)
    inner_train: int  # sequences used to fit during selection
    inner_val: int  # sequences used to score


def select_arx(
    train: Sequence[StepSeq],
    inner_val: Sequence[StepSeq],
    orders_p=(1, 2, 3, 4, 8),
    orders_q=(1, 2, 4, 8),
    criterion: str = "openloop",
    context: int = 16,
    horizon: int = 64,
    stride: int = 8,
    ridge: float = 1e-6,
) -> Selection:
    """Choose (p, q) on `inner_val` after fitting on `train` (both from the training episodes).

    criterion "openloop": mean squared open-loop error over windows of context + horizon steps
    (horizon shortened to what the inner-validation sequences allow); "onestep": one-step error.
    """
    if criterion not in ("openloop", "onestep"):
        raise ValueError(f"criterion must be 'openloop' or 'onestep', got {criterion!r}")
    scores = {}
    if criterion == "openloop":
        longest = max(s.obs.shape[0] for s in inner_val)
        horizon = max(1, min(horizon, longest - context))
        w_obs, w_ctrl = windows_from_seqs(inner_val, context + horizon, stride)
    for p, q in itertools.product(orders_p, orders_q):
        if p > context or q > context:
            continue
        try:
            m = ARX(p, q, ridge).fit(train)
        except (ValueError, np.linalg.LinAlgError):
            continue
        if criterion == "openloop":
            scores[f"{p},{q}"] = openloop_error(m.openloop(w_obs, w_ctrl, context), w_obs[:, context:])
        else:
            pred, y = m.one_step(inner_val)
            scores[f"{p},{q}"] = openloop_error(pred, y)
    if not scores:
        raise ValueError("no ARX order could be fitted: too little training data")
    best = min(scores, key=scores.get)
    p, q = (int(v) for v in best.split(","))
    return Selection(p, q, criterion, scores, len(train), len(inner_val))
