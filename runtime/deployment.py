"""The guard's deployment test: the open-loop and corrections' evidence pooled over the last
finished episodes.

Owns `DeploymentTest`, which the runtime guard (runtime/guard.py) feeds after every finished
episode, and `pooled_p`, the p-value of one look.

Why: some gaps do not show within one episode but do in a few. On the tests' Pendulum recipe the
check's own power table gives an actuator gain up to 2x a detection probability of 0 in the 3
blocks of one 200-step episode (at the guard's level, 0.01), and 1.0 at 1.5x in 12 blocks (4
episodes, level 0.05). The guard's in-episode tests can only roll back what one episode shows.

A look, after each finished episode with at least one scored block, pools the blocks of the last
`episodes` such episodes (at least 2: a single episode is the in-episode tests' job) and tests
them against the held-out real episodes with the check's pooled two-sample t (`stats.episode_t`,
episodes as the units):
  - open loop: the blocks' divergence, log scale, one-sided (worse than reality);
  - corrections: per parameter the blocks' score (checks/sysid.py), two-sided (a gain can be too
    weak or too strong), Bonferroni over the parameters.
Each statistic is tested at the guard's `rollback_alpha`. Consecutive looks share all episodes
but one, so under no gap a flagged look is followed by another far more often than alpha: the
false-alarm rate is per look, and `consecutive` flagged looks in a row add about one episode of
delay rather than a factor alpha. The pooled t assumes the episode means have one variance; an
episode with fewer blocks (an early end) has a noisier mean, which the test does not model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.stats import episode_t, t_sf


def pooled_p(episodes: list[np.ndarray], real: np.ndarray, groups: np.ndarray, log: bool, two_sided: bool) -> float:
    """p of the pooled t of checked episodes (a list of their block values, (n_i,) each) against the
    real blocks (m,) labelled by their episode (groups (m,)); one-sided: checked higher. NaN when
    the t is undefined (no checked blocks, fewer than 2 real episodes)."""
    x = np.concatenate(episodes)
    gx = np.concatenate([np.full(len(e), i) for i, e in enumerate(episodes)])
    t, df = episode_t(x, gx, real, groups, log=log)
    if not np.isfinite(df):
        return float("nan")
    upper = t_sf(t, df)
    return 2 * min(upper, 1 - upper) if two_sided else upper


def bonferroni(ps: list[float]) -> float:
    """The smallest of per-parameter p-values times their number, capped at 1; NaN if all are NaN."""
    ps = np.asarray(ps, float)
    return float(min(1.0, len(ps) * np.nanmin(ps))) if np.isfinite(ps).any() else float("nan")


@dataclass
class DeploymentTest:
    """The last `episodes` finished episodes' block statistics and their looks against reality.

    real_div (m,) are the held-out real blocks' open-loop divergences, real_scores (m, p) their
    corrections' scores (None: no score test), groups (m,) their real episode."""

    episodes: int
    real_div: np.ndarray | None
    real_scores: np.ndarray | None
    groups: np.ndarray
    recent: deque = field(init=False)

    def __post_init__(self):
        if self.episodes < 2:
            raise ValueError(f"the deployment test pools at least 2 episodes (got {self.episodes})")
        self.recent = deque(maxlen=self.episodes)

    def add(self, divergence: list[float], scores: list[np.ndarray]) -> tuple[float | None, float | None]:
        """Record a finished episode's blocks (divergences (n,) and scores, n arrays (p,)) and look:
        (open-loop p, corrections' p), None for a statistic that is off or has fewer than 2
        episodes to pool. An episode without a block is not recorded and gives (None, None)."""
        if not len(divergence) and not len(scores):
            return None, None
        p = 0 if self.real_scores is None else self.real_scores.shape[1]
        self.recent.append((np.asarray(divergence, float), np.asarray(scores, float).reshape(len(scores), p)))
        if len(self.recent) < 2:
            return None, None
        block_p = score_p = None
        if self.real_div is not None:
            block_p = pooled_p([d for d, _ in self.recent], self.real_div, self.groups, log=True, two_sided=False)
        if self.real_scores is not None:
            x = [s for _, s in self.recent]
            score_p = bonferroni(
                [
                    pooled_p([e[:, j] for e in x], self.real_scores[:, j], self.groups, log=False, two_sided=True)
                    for j in range(self.real_scores.shape[1])
                ]
            )
        return block_p, score_p
