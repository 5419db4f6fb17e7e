"""Episode-level train/validation split, deterministic and stable when episodes are added.

Each episode gets a pseudo-random number u(seed, id) in [0, 1) from a SHA-256 hash; it goes to
validation when u < val_fraction. Because the decision for one episode depends only on its own id
(not on how many episodes there are), adding episodes to a log never moves an existing episode
between train and validation — a validation episode never leaks into training later. The price is
that the validation share is val_fraction in expectation, not exactly. Two guards:
- val_fraction > 0 and >= 2 episodes: at least one validation episode (the lowest u);
- at least one training episode always (the highest-u validation episode moves back).
The guards only act on tiny logs; val_fraction == 0 gives no validation episodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def _u(seed: int, episode_id: int) -> float:
    digest = hashlib.sha256(f"wmcheck-split:{seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_episodes(episode_ids: Iterable[int], val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """(train_ids, val_ids), each sorted."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    ids = sorted({int(i) for i in episode_ids})
    if val_fraction == 0.0 or len(ids) < 2:
        return ids, []
    u = {i: _u(seed, i) for i in ids}
    val = {i for i in ids if u[i] < val_fraction}
    if not val:
        val = {min(ids, key=u.get)}
    if len(val) == len(ids):
        val.discard(max(ids, key=u.get))
    return [i for i in ids if i not in val], sorted(val)


def fold_of(episode_ids: Iterable[int], folds: int, seed: int = 0) -> dict[int, int]:
    """Cross-fitting folds: episode id -> fold in [0, folds). Episodes are ordered by u(seed, id)
    and dealt round-robin, so fold sizes differ by at most one (a hash threshold, as the
    validation split uses, can leave a fold empty on a log of 20 episodes). Adding episodes may
    move others between folds; a cross-fitted run is retrained as a whole (its folds are in its
    config, and a resume on another log is refused)."""
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    ids = sorted({int(i) for i in episode_ids})
    if len(ids) < folds:
        raise ValueError(f"{folds} folds need at least {folds} episodes, the log has {len(ids)}")
    ranked = sorted(ids, key=lambda i: _u(seed, i))
    return {i: r % folds for r, i in enumerate(ranked)}


def training_split(episode_ids: Iterable[int], val_fraction: float, seed: int = 0, folds: int = 0, fold: int = 0):
    """(train_ids, val_ids) of a run: the validation split, or with `folds` >= 2 the episodes of
    fold `fold` held out (cross-fitting). The one place a run's held-out episodes are decided."""
    if not folds:
        return split_episodes(episode_ids, val_fraction, seed)
    of = fold_of(episode_ids, folds, seed)
    return sorted(i for i, f in of.items() if f != fold), sorted(i for i, f in of.items() if f == fold)
