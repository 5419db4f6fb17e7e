"""Cross-fitted models in the check: every block is scored by the fold model that never trained on
its episode.

Owns `FoldModels` (the K models of a `train --folds K` run and which fold each episode of the data at
hand belongs to) and `per_fold`, the one routing rule: a function of (model, blocks) whose outputs
have one row per block is run once per fold on that fold's blocks, and the rows are put back in
block order. scoring.score_blocks / latent_features and sysid.evaluate_many / objective_many route
through it, so every statistic built on them (calibration's nulls and power set, the check's scores
and corrections' fit) is out of fold without knowing about folds.

Which fold an episode belongs to:
  - a real episode of the training log: its fold (datasets.split.fold_of), so its scores come from
    the one model that held it out; injected copies of it (the power set) keep its id and its fold;
  - an episode no model trained on (a checked simulator episode, an extra real log, a monitored
    new real log): dealt
    round-robin over the folds in id order (`deal`), so each fold model scores an equal share and
    the checked scores are distributed as the pooled out-of-fold real ones under the null.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class FoldModels:
    """The K models of a cross-fitted run and the fold of every episode of the data at hand; stands
    where a single model goes in the functions that route through `per_fold`."""

    models: list  # K world models (the same config, one normaliser)
    assignment: dict[int, int] = field(default_factory=dict)  # episode id -> fold of the data at hand

    @property
    def cfg(self):
        return self.models[0].cfg

    def __len__(self) -> int:
        return len(self.models)

    def assigned(self, assignment: dict[int, int]) -> FoldModels:
        """The same models routing another data set's episodes."""
        return FoldModels(self.models, {int(k): int(v) for k, v in assignment.items()})

    def groups(self, episode: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(fold, block indices) for every fold that has blocks; a KeyError names an unassigned episode."""
        try:
            fold = np.array([self.assignment[int(e)] for e in episode], dtype=np.int64)
        except KeyError as exc:
            raise KeyError(f"episode {exc.args[0]} has no fold (FoldModels.assigned first)") from None
        return [(k, np.flatnonzero(fold == k)) for k in range(len(self.models)) if np.any(fold == k)]


def deal(episode_ids, folds: int) -> dict[int, int]:
    """Episodes no fold model trained on, dealt round-robin over the folds in id order."""
    return {int(e): r % folds for r, e in enumerate(sorted({int(i) for i in episode_ids}))}


def per_fold(model, rows, fn: Callable, merge: Callable):
    """fn(model, rows, None) with a single model; with FoldModels, fn(model_k, rows.subset(idx_k), k) per
    fold and merge(parts, order) puts the parts' rows back (order: the block index of every
    concatenated row). `rows` has `.subset(idx)` and block episodes (`.episode` or `.blocks.episode`)."""
    if not isinstance(model, FoldModels):
        return fn(model, rows, None)
    episode = rows.episode if hasattr(rows, "episode") else rows.blocks.episode
    groups = model.groups(episode)
    parts = [fn(model.models[k], rows.subset(idx), k) for k, idx in groups]
    return merge(parts, np.concatenate([idx for _, idx in groups]))


def restore_order(order: np.ndarray) -> np.ndarray:
    """The permutation that takes concatenated fold rows back to block order."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return inverse


def merge_arrays(parts: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    return np.concatenate(parts)[restore_order(order)]


def load_fold_models(run_dir, info: dict):
    """The fold models of a cross-fitted RUN (training/crossfit.py) as one ModelBundle whose model
    is a FoldModels routing the training log's episodes to the fold that held them out. Its
    file_hash covers every fold's model.pt, so a calibration belongs to exactly these K models."""
    import hashlib
    from pathlib import Path

    from wmcheck.datasets.errors import UserError
    from wmcheck.training.checkpoint import load_model

    run_dir = Path(run_dir)
    bundles = [load_model(run_dir / name) for name in info["fold_dirs"]]
    first = bundles[0]
    for b, name in zip(bundles[1:], info["fold_dirs"][1:]):
        if b.normalizer != first.normalizer or b.channels != first.channels or b.data_hash != first.data_hash:
            raise UserError(
                f"{run_dir / name} was not trained with the other folds (another log or normaliser)",
                f"train the run again: `wmcheck train LOG --out {run_dir} --folds {info['folds']}`",
            )
    combined = hashlib.sha256("".join(b.file_hash for b in bundles).encode()).hexdigest()
    assignment = {int(e): int(f) for e, f in info["fold_of"].items()}
    first.model, first.file_hash = FoldModels([b.model for b in bundles], assignment), combined
    return first
