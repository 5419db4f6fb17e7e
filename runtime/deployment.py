"""The guard's deployment test: the open-loop and corrections' evidence pooled over the last
finished episodes.

Owns `DeploymentTest`, which the runtime guard (runtime/guard.py) feeds after every finished
episode, `pooled_p`, the p-value of one look, and `look_level`, the level it is tested at.

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
The guard looks after every episode for as long as it runs, so a fixed level per look would make a
false deployment rollback certain in the end (at 0.01 per look, a faithful Pendulum plant was
rolled back after episode 73 of 100). The levels are spent instead (`look_level`): look k tests
each of its statistics at alpha / (statistics k (k + 1)). These sum to alpha over every look the
guard will ever make, so the chance of any false flagged look in the guard's life is at most alpha
(the guard's `deployment_alpha`), however the looks depend on each other: a union bound. The
early looks get most of it (0.0125 and 0.0042 per statistic for the first two at alpha 0.05), which
suits a gap present from the release on; a gap that appears after many episodes needs a far
smaller p, and is the monitor's job (`wmcheck monitor`, which starts its plan again every
`looks`). `consecutive` flagged looks in a row raise the rollback: consecutive looks share all
episodes but one, so this adds about one episode of delay. The pooled t assumes the episode means have one variance; an
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


def look_level(alpha: float, look: int, statistics: int) -> float:
    """The level of each of `statistics` statistics at look number `look` (1, 2, ...):
    alpha / (statistics * look * (look + 1)), which sums to alpha over all looks and statistics."""
    if look < 1 or statistics < 1:
        raise ValueError(f"look and statistics start at 1 (got look {look}, statistics {statistics})")
    return alpha / (statistics * look * (look + 1))


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
    looks: int = field(init=False, default=0)  # looks made so far (the last look's number)

    def __post_init__(self):
        if self.episodes < 2:
            raise ValueError(f"the deployment test pools at least 2 episodes (got {self.episodes})")
        self.recent = deque(maxlen=self.episodes)

    @property
    def statistics(self) -> int:
        return (self.real_div is not None) + (self.real_scores is not None)

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
        self.looks += 1
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
