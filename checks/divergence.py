"""The divergence tests as evidence: competence per block, one test per episode, one pooled test.

Owns the array-level builders of `DivergenceEvidence` (evidence.py) from block scores, so that
`run_check` and `power.power_table` run exactly the same tests:
  - competence: a block is inside the model's competence when the median of its steps' latent
    distances to the training support is within the (1 - competence_alpha) quantile of held-out
    real steps', and (ensembles) its disagreement's conformal p is at least competence_alpha;
  - per episode: the random-effects prediction test (stats.episode_outlier_p) of its competent
    blocks' scores against a new real episode, for each score (log scale except the NLL), and of
    all its blocks' competence scores;
  - pooled: Student's t (pooled variance) of the checked vs real episodes' mean (log) scores over all competent blocks
    (stats.episode_t_greater); paired instead (each checked block against the held-out real block
    whose logged exogenous inputs it replays, stats.paired_episode_t_greater) when at least half of
    the competent blocks have such a twin in at least two episodes.
Scores are passed as {name: (n,) array}, from `BlockScores` or from the power table's stored arrays.

Blocks that end at a termination (`Blocks.ending`: the steps that led to a fall or a trip) are left
out of the per-episode tests (divergence and competence) and of the pooled test, on the checked and
on the real side, and judged by the ending test (endings.py: whether episodes end as real ones do),
where the real logs terminate too (check._left_to_ending: where no real episode ends, a checked
ending, at a goal no real log reached, stays in these tests) and such blocks are a minority of the
real ones (`endings_left_out`: where most real episodes fall within a block or two, the real
blocks that end at a fall are the null itself).
Where falls are rare, a few dozen held-out episodes hold a handful of such blocks or none, and a
faithful episode that falls is scored against a null that has hardly seen a fall. On the double
pendulum (docs/benchmarks.md, twenty-sixth session) 21 % of 8-episode checks of a faithful
simulator failed the divergence tests for that reason; with only the divergence tests leaving them
out, 4 of 75 episodes that fell were unverifiable on the support test. The distribution test still
sees their states.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wmcheck.checks.config import COMPETENCE, SCORES
from wmcheck.checks.evidence import DivergenceEvidence, EpisodeEvidence, PooledEvidence
from wmcheck.checks.stats import conformal_p, episode_outlier_p, episode_t_greater, log_pair, paired_episode_t_greater

Scores = Mapping[str, np.ndarray]


def score_arrays(sc, names=SCORES + COMPETENCE) -> dict[str, np.ndarray]:
    """{score: (n,)} of a `BlockScores`."""
    return {s: getattr(sc, s) for s in names}


def competent_blocks(
    support_steps: np.ndarray,
    disagreement: np.ndarray,
    support_bound: float,
    real_disagreement: np.ndarray,
    disagreement_alpha: float,
) -> np.ndarray:
    """(n,) bool: blocks inside the model's competence: their median step stays within
    `support_bound` of the training latents (Calibration.support_bound) and their ensemble
    disagreement is not beyond the real blocks' at `disagreement_alpha`.
    support_steps (n, L - C) latent distances of every step; disagreement (n,) ensemble means."""
    p_dis = conformal_p(disagreement, real_disagreement) if real_disagreement.max() > 0 else np.ones(len(disagreement))
    return (np.median(support_steps, 1) <= support_bound) & (p_dis >= disagreement_alpha)


def _uses_log(score: str) -> bool:
    return score != "nll"  # divergence z^2, KL and latent distances are positive and right-skewed


def episode_p_values(
    checked: Scores,
    real: Scores,
    real_episode: np.ndarray,
    idx: np.ndarray,
    competent: np.ndarray,
    ending: np.ndarray | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """(divergence p per score on the competent blocks of idx, competence p per competence score on
    all of idx) for one episode whose blocks are idx, against the real blocks given. Blocks that
    `ending` marks are left out of both (module docstring)."""
    if ending is not None:
        idx = idx[~ending[idx]]
    cidx = idx[competent[idx]]

    def p(s: str, blocks: np.ndarray, log: bool) -> float:
        return episode_outlier_p(checked[s][blocks], real[s], real_episode, log=log) if len(blocks) else float("nan")

    div = {s: p(s, cidx, _uses_log(s)) for s in SCORES}
    comp = {
        s: p(s, idx, True) for s in COMPETENCE if s in checked and s in real and (real[s].max() > 0 or s == "support")
    }
    return div, comp


def episode_evidence(
    checked: Scores,
    real: Scores,
    real_episode: np.ndarray,
    block_episode: np.ndarray,
    competent: np.ndarray,
    ending: np.ndarray | None = None,
) -> list[EpisodeEvidence]:
    """One `EpisodeEvidence` per checked episode (in order of first appearance), p-values only;
    `ending` (n,) the checked blocks left out (module docstring)."""
    out = []
    judged = np.ones(len(block_episode), bool) if ending is None else ~ending
    for e in dict.fromkeys(block_episode.tolist()):
        idx = np.flatnonzero(block_episode == e)
        div, comp = episode_p_values(checked, real, real_episode, idx, competent, ending)
        outside = int((~competent[idx] & judged[idx]).sum())
        out.append(EpisodeEvidence(int(e), div, comp, outside, int(len(idx))))
    return out


def pooled_evidence(
    checked: Scores,
    real: Scores,
    real_episode: np.ndarray,
    block_episode: np.ndarray,
    competent: np.ndarray,
    twin: np.ndarray | None = None,
) -> PooledEvidence:
    """The pooled test over the blocks `competent` marks (the judged ones, see divergence_evidence);
    twin (n,): each checked block's real twin (an index into `real`) or -1."""
    comp_idx = np.flatnonzero(competent)
    paired_idx = comp_idx if twin is None else comp_idx[twin[comp_idx] >= 0]
    paired = (
        twin is not None
        and len(comp_idx) > 0
        and len(paired_idx) >= 0.5 * len(comp_idx)
        and len(np.unique(block_episode[paired_idx])) >= 2
    )

    def p(s: str) -> float:
        if not len(comp_idx):
            return float("nan")
        if paired:
            x, y = checked[s][paired_idx], real[s][twin[paired_idx]]
            if _uses_log(s):
                x, y = log_pair(x, y)
            return paired_episode_t_greater(x - y, block_episode[paired_idx])
        return episode_t_greater(checked[s][comp_idx], block_episode[comp_idx], real[s], real_episode, log=_uses_log(s))

    return PooledEvidence(
        {s: p(s) for s in SCORES}, bool(paired), int(len(paired_idx) if paired else 0), int(len(comp_idx))
    )


ENDINGS_RARE = 0.5  # below this share of the real blocks, the blocks that end at a termination are left out


def endings_left_out(real_ending: np.ndarray | None) -> bool:
    """Whether the blocks that end at a termination are left to the ending test: where they are a
    minority of the real blocks (None: no real block is marked, e.g. no held-out episode ends). Where
    most real blocks end at a termination (every episode falls within a block or two, as Hopper's
    under random commands: 25 of 28), they are the null itself and are judged like any block; left
    out, they emptied the pooled test of 4 of 5 Hopper checks (docs/benchmarks.md)."""
    return real_ending is None or not len(real_ending) or float(np.mean(real_ending)) < ENDINGS_RARE


def divergence_evidence(
    checked: Scores,
    real: Scores,
    real_episode: np.ndarray,
    block_episode: np.ndarray,
    competent: np.ndarray | None = None,
    twin: np.ndarray | None = None,
    ending: np.ndarray | None = None,
    real_ending: np.ndarray | None = None,
    leave_out: bool | None = None,
) -> DivergenceEvidence:
    """Episodes and pooled test of blocks labelled by block_episode (n,); every block competent
    when `competent` is None (the power table's injected real blocks). ending (n,) / real_ending
    (n_real,): the checked / real blocks that end at a termination, left out of both tests where
    they are rare among the real blocks (`leave_out`; None: `endings_left_out(real_ending)`; the
    power table decides on all the real blocks, as the check does; module docstring)."""
    competent = np.ones(len(block_episode), bool) if competent is None else competent
    leave_out = endings_left_out(real_ending) if leave_out is None else leave_out
    if ending is None or not leave_out:
        ending = real_ending = None
    judged = competent if ending is None else competent & ~ending
    if real_ending is not None and real_ending.any():  # the real blocks kept; a twin that ends is no twin
        kept = ~real_ending
        if twin is not None:
            twin = np.where((twin >= 0) & kept[np.maximum(twin, 0)], np.cumsum(kept)[np.maximum(twin, 0)] - 1, -1)
        real, real_episode = {s: v[kept] for s, v in real.items()}, real_episode[kept]
    return DivergenceEvidence(
        episode_evidence(checked, real, real_episode, block_episode, competent, ending),
        pooled_evidence(checked, real, real_episode, block_episode, judged, twin),
    )
