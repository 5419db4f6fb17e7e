"""Open-loop evaluation on held-out real episodes: metrics per horizon and figures per channel.

Owns the protocol used by TensorBoard `openloop/*` and by scripts/bench_worldmodel.py: observe
`context` steps of a held-out window, imagine the rest under the logged controls, and compare.

  NRMSE(h, channel) = RMSE at the h-th imagined step / the channel's training std
                      (= RMSE in normalised units: one scale for the model and the baselines)
  fit%(h, channel)  = 100 * (1 - ||y_h - yhat_h|| / ||y_h - mean(y_h)||)   (system-ID "fit")
  step NRMSE(h)     = NRMSE at imagined step h averaged over channels; its mean over h = 1..H is
                      `val/openloop_nrmse`, the early-stopping metric of stop_on "openloop"
  coverage(channel) = fraction of true values inside the model's central 90% predictive interval
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class OpenLoopResult:
    horizons: tuple[int, ...]
    nrmse: np.ndarray  # (H_eval, D) NaN where the window is shorter than the horizon
    fit: np.ndarray  # (H_eval, D)
    coverage: np.ndarray  # (D,) nominal 0.9
    step_nrmse: np.ndarray  # (H,) NRMSE at every imagined step 1..H, mean over channels
    mean: np.ndarray  # (B, H, D) predicted mean (normalised units)
    lower: np.ndarray  # (B, H, D) 5% quantile
    upper: np.ndarray  # (B, H, D) 95% quantile
    truth: np.ndarray  # (B, T, D) whole windows, context included
    context: int


def horizon_metrics(pred: np.ndarray, truth: np.ndarray, horizons) -> tuple[np.ndarray, np.ndarray]:
    """pred, truth (B, H, D) in normalised units -> nrmse, fit (len(horizons), D)."""
    B, H, D = truth.shape
    nrmse = np.full((len(horizons), D), np.nan)
    fit = np.full((len(horizons), D), np.nan)
    for i, h in enumerate(horizons):
        if h > H:
            continue
        err = pred[:, h - 1] - truth[:, h - 1]  # (B, D)
        nrmse[i] = np.sqrt((err**2).mean(0))
        dev = truth[:, h - 1] - truth[:, h - 1].mean(0)
        denom = np.sqrt((dev**2).sum(0))
        with np.errstate(divide="ignore", invalid="ignore"):
            fit[i] = np.where(denom > 0, 100.0 * (1.0 - np.sqrt((err**2).sum(0)) / denom), np.nan)
    return nrmse, fit


@torch.no_grad()
def evaluate_openloop(model, seq, context: int, horizons, samples: int = 16) -> OpenLoopResult:
    """seq: sequence object of tensors (B, T, ...) of whole held-out windows, no episode starts inside."""
    was_training = model.training
    model.eval()
    out = model.openloop(seq, context, samples=samples)
    model.train(was_training)
    draws = out["samples"].cpu().numpy()  # (N, B, H, D)
    mean = out["mean"].cpu().numpy()
    truth_h = out["truth"].cpu().numpy()
    lower, upper = np.quantile(draws, 0.05, axis=0), np.quantile(draws, 0.95, axis=0)
    nrmse, fit = horizon_metrics(mean, truth_h, horizons)
    coverage = ((truth_h >= lower) & (truth_h <= upper)).mean((0, 1))
    step_nrmse = np.sqrt(((mean - truth_h) ** 2).mean(0)).mean(-1)  # (H,)
    return OpenLoopResult(
        tuple(horizons), nrmse, fit, coverage, step_nrmse, mean, lower, upper, seq.obs.float().cpu().numpy(), context
    )


def channel_figure(result: OpenLoopResult, channel: int, name: str, window: int = 0, denorm=None):
    """Truth, predicted mean and 90% band of one channel of one window; context shaded.

    denorm: optional callable (values, channel) -> values in the channel's units.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = (lambda v: denorm(v, channel)) if denorm else (lambda v: v)
    truth = f(result.truth[window, :, channel])
    T, c = len(truth), result.context
    steps = np.arange(T)
    fig, ax = plt.subplots(figsize=(6, 2.6), dpi=80)
    ax.axvspan(-0.5, c - 0.5, color="0.9", label="context (observed)")
    ax.plot(steps, truth, color="k", lw=1.2, label="truth")
    ax.plot(steps[c:], f(result.mean[window, :, channel]), color="tab:blue", lw=1.2, label="predicted mean")
    ax.fill_between(
        steps[c:],
        f(result.lower[window, :, channel]),
        f(result.upper[window, :, channel]),
        color="tab:blue",
        alpha=0.25,
        label="90% band",
    )
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig
