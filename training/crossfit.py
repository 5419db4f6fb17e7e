"""Cross-fitted runs: `wmcheck train LOG --out RUN --folds K` trains K world models, each with one
fold of the real episodes held out, so that every real episode is held out once and a check's
thresholds rest on all of them instead of a validation split (on a log of 20 segments, 2 episodes).

Owns the run layout and training all folds:
  RUN/crossfit.json   {"folds": K, "seed", "log", "log_sha256", "fold_dirs": ["fold-1", ...],
                      "fold_of": {episode id: fold}}
  RUN/fold-k/         an ordinary run directory (config.json with train.folds K, train.fold k - 1,
                      checkpoints, tb/, model.pt, quality.json) that holds fold k - 1 out
  RUN/quality.json    the pooled quality card: each fold's card on the fold it held out, weighted
                      by its held-out episodes (`pooled_card`)
  RUN/calibration.*   one calibration over every episode of the log, each scored by the fold model
                      that held it out (checks/calibration.py, checks/folds.py)
Folds come from datasets.split.fold_of (balanced, seeded); every fold model shares one normaliser
(training.datamodule) so that their scores pool. A kill leaves the finished folds in place: the
same command resumes the fold it stopped in and skips none.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from wmcheck.datasets.atomic import write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.training.quality import QualityCard, write_card

CROSSFIT_FILE = "crossfit.json"


def fold_dir(run_dir: Path, fold: int) -> Path:
    return Path(run_dir) / f"fold-{fold + 1}"


def read_crossfit(run_dir: str | Path) -> dict | None:
    """RUN/crossfit.json, or None for a single-model run."""
    path = Path(run_dir) / CROSSFIT_FILE
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text())
        int(info["folds"]), list(info["fold_dirs"]), dict(info["fold_of"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is damaged ({exc})", f"train the run again: `wmcheck train LOG --out {run_dir} --folds K`"
        ) from None
    for name in info["fold_dirs"]:  # a file handed to us never makes us read outside the run
        if Path(name).name != name or name in ("", ".", ".."):
            raise UserError(f"{path} names a fold folder outside the run ({name!r})", "train the run again")
    return info


def single_model_run(run_dir: str | Path, what: str) -> None:
    """A UserError for a cross-fitted RUN where a command needs one model (shadow, the guard)."""
    info = read_crossfit(run_dir)
    if info is not None:
        raise UserError(
            f"{run_dir} is a cross-fitted run ({info['folds']} fold models); {what} needs one model",
            "train one model for it (`wmcheck train LOG --out RUN2` without --folds; add real episodes it "
            "never saw with `wmcheck calibrate RUN2 --real EXTRA.h5`) and pass that run",
        )


def train_folds(log_path, out: Path, run_config, resume: bool = True, on_fold=None):
    """Train the K fold models of `run_config.train.folds` into RUN/fold-k. Returns a TrainResult
    for RUN (steps summed, the pooled card, `folds`: every fold's TrainResult), or the first
    result of another process of a multi-device run. `on_fold(result)` runs after each fold (the
    CLI prints its summary)."""
    from wmcheck.training.run import train as train_one

    t = run_config.train
    out = Path(out)
    if (out / "model.pt").exists() and read_crossfit(out) is None:
        raise UserError(f"{out} holds a single-model run", "use a new --out folder for a cross-fitted run")
    old = read_crossfit(out)
    if old is not None and (old["folds"] != t.folds or old.get("seed") != t.seed):
        raise UserError(
            f"{out} holds a cross-fitted run with {old['folds']} folds and seed {old.get('seed')}",
            "use a new --out folder, or the run's own --folds / --seed to resume it",
        )
    from wmcheck.datasets.logformat import open_log
    from wmcheck.datasets.split import fold_of
    from wmcheck.training.checkpoint import file_sha256
    from wmcheck.training.datamodule import openloop_geometry

    with open_log(log_path) as log:
        try:
            folds_of = fold_of(log.episode_ids, t.folds, t.seed)  # what every fold's datamodule uses
        except ValueError as exc:
            raise UserError(f"{log_path}: {exc}", "pass a smaller --folds (2 at least) or log more episodes") from None
        lengths = [log.num_steps(i) + 1 for i in log.episode_ids]
    # every episode is held out once: one open-loop context for all folds, fitted to them all, so
    # that the pooled card's folds observe the same steps (a fold's data module keeps it:
    # LogDataModule.prepare, so finished folds are recognised on resume)
    t = dataclasses.replace(t, openloop_context=openloop_geometry(t, lengths)[0])
    run_config = dataclasses.replace(run_config, train=t)
    results = []
    for k in range(t.folds):
        rc = dataclasses.replace(run_config, train=dataclasses.replace(t, fold=k))
        result = finished_fold(fold_dir(out, k), rc, log_path) if resume else None
        if result is None:
            result = train_one(log_path, fold_dir(out, k), rc, resume=resume)
        if not result.global_zero:
            return result
        results.append(result)
        if on_fold is not None:
            on_fold(result)
    write_text_atomic(
        out / CROSSFIT_FILE,
        json.dumps(
            {
                "folds": t.folds,
                "seed": t.seed,
                "log": str(Path(log_path).resolve()),
                "log_sha256": file_sha256(log_path),
                "fold_dirs": [fold_dir(out, k).name for k in range(t.folds)],
                "fold_of": {str(e): f for e, f in sorted(folds_of.items())},
            },
            indent=2,
        ),
    )
    write_text_atomic(out / "data.json", (fold_dir(out, 0) / "data.json").read_text())
    cards = [r.quality for r in results]
    card = pooled_card(cards) if all(c is not None for c in cards) else None
    if card is not None:
        write_card(out, card)
    return dataclasses.replace(
        results[-1],
        run_dir=out,
        model_path=out / CROSSFIT_FILE,
        steps=sum(r.steps for r in results),
        quality=card,
        folds=results,
    )


def finished_fold(path: Path, run_config, log_path):
    """The TrainResult of a fold that finished with these training options on this log (its
    training.json is written after model.pt), read back instead of training it again; else None."""
    from wmcheck.training.checkpoint import file_sha256
    from wmcheck.training.quality import read_card
    from wmcheck.training.run import TrainResult

    try:
        summary = json.loads((path / "training.json").read_text())
        old = json.loads((path / "config.json").read_text())["train"]
        data = json.loads((path / "data.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (
        not (path / "model.pt").exists()
        or old != json.loads(json.dumps(dataclasses.asdict(run_config.train)))
        or data != file_sha256(log_path)
    ):
        return None
    return TrainResult(
        path,
        path / "model.pt",
        int(summary["steps"]),
        {},
        int(summary["exported_step"]),
        summary["stop_reason"],
        read_card(path),
        monitor=summary["monitor"],
    )


def pooled_card(cards: list[QualityCard]) -> QualityCard:
    """One card for K fold models: every per-step figure the mean of the folds' cards weighted by
    their held-out episodes (each episode counted once, by the model that held it out)."""
    w = np.array([c.heldout_episodes for c in cards], float)
    H = min(c.horizon for c in cards)  # a fold whose held-out episodes are shorter has fewer steps

    def mean(values: list) -> list:
        a = np.array([np.asarray(v, float)[:H] for v in values])  # (K, H, ...)
        ok = np.isfinite(a)
        ww = w.reshape((-1,) + (1,) * (a.ndim - 1)) * ok
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(ww.sum(0) > 0, (np.where(ok, a, 0) * ww).sum(0) / ww.sum(0), np.nan)
        return out.tolist()

    first = cards[0]
    return QualityCard(
        context=first.context,  # the same in every fold (train_folds fits it once)
        train_episodes=int(round(float(np.mean([c.train_episodes for c in cards])))),
        heldout_episodes=int(w.sum()),
        windows=int(sum(c.windows for c in cards)),
        nrmse={m: mean([c.nrmse[m] for c in cards]) for m in first.nrmse},
        nrmse_channel={m: mean([c.nrmse_channel[m] for c in cards]) for m in first.nrmse_channel},
        coverage_raw=mean([c.coverage_raw for c in cards]),
        coverage_calibrated=mean([c.coverage_calibrated for c in cards]),
        arx_orders=first.arx_orders,
        observation_names=first.observation_names,
        training={"folds": [c.training for c in cards]},
    )
