"""The model-quality card: how well a trained world model predicts real episodes it never saw.

Owns RUNDIR/quality.json, written at the end of `wmcheck train` (also printed and logged to
TensorBoard under `quality/*`), and the competence rule `check` applies to it. On held-out real
windows (the validation episodes of the training split: observe `context` steps, imagine the rest
under the logged controls) the card holds, per imagined step h = 1..H:
  - open-loop NRMSE (RMSE / training std, mean over channels) of the world model, of persistence
    and of a linear ARX model fitted on the training episodes (orders chosen on an inner split of
    them, `openloop_baselines.select_arx`), the system-identification engineer's first model;
  - the coverage of the model's nominal 90 % interval (mean +- 1.645 std of its rollouts) and of
    the conformally scaled one (conformal.py), the latter measured on windows the scale was not
    fitted on (cross-fitted by held-out episode);
and the number of training / held-out episodes and windows.

Competence rule (`QualityCard.competence(H)`): a check that imagines H steps needs a model that
predicts better than ARX over those steps, i.e. mean NRMSE over h = 1..H below ARX's. A model that
does not cannot tell a simulator's error from its own, so a check on it is `inconclusive`, never a
pass (decision.py, R9).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmcheck.datasets.json_safe import json_safe
from wmcheck.training.conformal import cross_fitted_coverage, interval_covered
from wmcheck.training.openloop import horizon_metrics

QUALITY_FILE = "quality.json"
QUALITY_VERSION = 1
REPORT_HORIZONS = (1, 4, 16, 48, 64)
"""The steps the printed card shows (the JSON has every step)."""


@dataclass
class Competence:
    competent: bool
    horizon: int  # the steps compared (the check's horizon, capped at the card's)
    world_model: float  # mean NRMSE over steps 1..horizon
    arx: float

    def sentence(self) -> str:
        rel = "better" if self.competent else "no better"
        return (
            f"the world model predicts held-out real episodes {rel} than a linear ARX model over "
            f"{self.horizon} imagined steps (mean NRMSE {self.world_model:.3f} vs {self.arx:.3f})"
        )


@dataclass
class QualityCard:
    context: int
    train_episodes: int
    heldout_episodes: int
    windows: int
    nrmse: dict[str, list[float]]  # method -> (H,) mean over channels per imagined step
    nrmse_channel: dict[str, list[list[float]]]  # method -> (H, D) per step and channel
    coverage_raw: list[float]  # (H,) nominal 90 % interval
    coverage_calibrated: list[float]  # (H,) conformal interval, cross-fitted (NaN: < 2 held-out episodes)
    arx_orders: tuple[int, int]
    observation_names: list[str]
    training: dict = field(default_factory=dict)  # training.json's summary
    version: int = QUALITY_VERSION

    @property
    def horizon(self) -> int:
        return len(self.coverage_raw)

    def competence(self, horizon: int) -> Competence:
        h = max(1, min(int(horizon), self.horizon))
        wm = float(np.nanmean(self.nrmse["world_model"][:h]))
        arx = float(np.nanmean(self.nrmse["arx"][:h]))
        ok = bool(np.isfinite(wm) and (not np.isfinite(arx) or wm < arx))
        return Competence(ok, h, wm, arx)

    def to_dict(self) -> dict:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> QualityCard:
        d = dict(d)
        if int(d.get("version", 0)) != QUALITY_VERSION:
            raise ValueError(f"quality card version {d.get('version')} (this wmcheck reads {QUALITY_VERSION})")
        d["arx_orders"] = tuple(d["arx_orders"])
        for k in ("coverage_raw", "coverage_calibrated"):
            d[k] = [np.nan if v is None else v for v in d[k]]
        for k in ("nrmse",):
            d[k] = {m: [np.nan if v is None else v for v in vals] for m, vals in d[k].items()}
        return cls(**d)

    def lines(self, check_horizon: int | None = None) -> list[str]:
        """The printed card."""
        steps = [h for h in REPORT_HORIZONS if h <= self.horizon]
        head = "| imagined step | " + " | ".join(str(h) for h in steps) + " |"
        rows = [
            f"model quality on {self.heldout_episodes} held-out real episodes ({self.windows} windows, "
            f"context {self.context}; {self.train_episodes} training episodes):",
            head,
            "|" + "---|" * (len(steps) + 1),
        ]

        def row(label, values, fmt="{:.3f}"):
            cells = ["–" if not np.isfinite(values[h - 1]) else fmt.format(values[h - 1]) for h in steps]
            return f"| {label} | " + " | ".join(cells) + " |"

        rows.append(row("NRMSE world model", self.nrmse["world_model"]))
        rows.append(row(f"NRMSE ARX({self.arx_orders[0]},{self.arx_orders[1]})", self.nrmse["arx"]))
        rows.append(row("NRMSE persistence", self.nrmse["persistence"]))
        rows.append(row("90% coverage, raw", self.coverage_raw, "{:.2f}"))
        rows.append(row("90% coverage, calibrated", self.coverage_calibrated, "{:.2f}"))
        if check_horizon:
            c = self.competence(check_horizon)
            rows.append(("" if c.competent else "WARNING: ") + c.sentence() + ".")
            if not c.competent:
                rows.append(
                    "  Checks on this model will be inconclusive: train longer (--max-steps, --patience, --min-improvement 0), "
                    "a larger --preset, or on more real data."
                )
        return rows


@torch.no_grad()
def compute_card(model, dm, context: int, horizon: int, windows: int = 128, samples: int = 16, seed: int = 0):
    """The card of `model` on the held-out episodes of the data module `dm` (prepared), or None
    when no held-out episode is longer than the context."""
    from wmcheck.datasets.split import split_episodes
    from wmcheck.datasets.windows import WindowSampler
    from wmcheck.training.openloop_baselines import ARX, persistence, select_arx, step_seqs_from_batches

    seq, groups = dm.openloop_sequence(windows=windows, length=context + horizon, with_episodes=True)
    if seq is None:
        return None
    T = seq.obs.shape[1]
    H = T - context
    obs = seq.obs.numpy().astype(np.float64)  # (B, T, D)
    ctrl = np.concatenate([seq.prev_action.numpy(), seq.prev_input.numpy()], -1).astype(np.float64)  # (B, T, U)
    truth = obs[:, context:]  # (B, H, D)

    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.openloop(seq, context, samples=samples)
    model.train(was_training)
    draws = out["samples"].float().cpu().numpy()  # (S, B, H, D)
    mean = out["mean"].float().cpu().numpy()  # (B, H, D)
    r = np.abs(truth - mean) / np.maximum(draws.std(0), 1e-3)  # (B, H, D)

    sampler = WindowSampler(dm.log_path, dm.train_ids, dm.normalizer, 1)
    train_seqs = step_seqs_from_batches(sampler.episodes())
    inner_train, inner_val = split_episodes(list(range(len(train_seqs))), 0.2, seed=1)
    if inner_val:
        sel = select_arx(
            [train_seqs[i] for i in inner_train], [train_seqs[i] for i in inner_val], context=context, horizon=H
        )
        orders = (sel.p, sel.q)
    else:
        orders = (2, 2)
    arx = ARX(*orders).fit(train_seqs)
    preds = {"world_model": mean, "arx": arx.openloop(obs, ctrl, context), "persistence": persistence(obs, context)}
    steps = range(1, H + 1)
    nrmse_channel = {k: horizon_metrics(p, truth, steps)[0] for k, p in preds.items()}  # (H, D) each
    return QualityCard(
        context=context,
        train_episodes=len(dm.train_ids),
        heldout_episodes=len(np.unique(groups)),
        windows=int(seq.obs.shape[0]),
        nrmse={k: v.mean(1).tolist() for k, v in nrmse_channel.items()},
        nrmse_channel={k: v.tolist() for k, v in nrmse_channel.items()},
        coverage_raw=interval_covered(r).mean((0, 2)).tolist(),
        coverage_calibrated=cross_fitted_coverage(r, groups).tolist(),
        arx_orders=orders,
        observation_names=list(dm.channels.get("observation_names", [])),
    )


def write_card(run_dir: Path, card: QualityCard) -> Path:
    from wmcheck.datasets.atomic import write_text_atomic

    path = Path(run_dir) / QUALITY_FILE
    write_text_atomic(path, json.dumps(card.to_dict(), indent=2))
    return path


def read_card(run_dir: Path) -> QualityCard | None:
    """RUNDIR/quality.json, or None when the run has none (trained by an older wmcheck)."""
    from wmcheck.datasets.errors import UserError

    path = Path(run_dir) / QUALITY_FILE
    if not path.exists():
        return None
    try:
        return QualityCard.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is not a valid quality card: {exc}", "re-run `wmcheck train` on this RUNDIR") from None


def log_card(writer, card: QualityCard, step: int) -> None:
    """TensorBoard: `quality/nrmse/<method>` and `quality/coverage90/*` with the imagined step as x."""
    for h in range(card.horizon):
        for method, values in card.nrmse.items():
            if np.isfinite(values[h]):
                writer.add_scalar(f"quality/nrmse/{method}", values[h], h + 1)
        for k in ("raw", "calibrated"):
            v = getattr(card, f"coverage_{k}")[h]
            if np.isfinite(v):
                writer.add_scalar(f"quality/coverage90/{k}", v, h + 1)
    writer.add_text("quality", "\n".join(card.lines()), step)
