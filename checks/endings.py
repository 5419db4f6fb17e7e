"""The ending test: do the checked episodes end (terminate) the way real episodes do?

Owns `ending_evidence(checked, real_endings, level)`. A simulator whose pole falls after 20 steps
where the real one never does, or that runs on where the real plant trips, differs in how its
episodes end. Episodes are the units: the share of checked episodes that terminate (the log's
`terminations`, not a truncation by a time limit) against the share of real episodes that do
(training and held-out logs, counted at calibration), by Fisher's exact test, two-sided. Episodes
too short for a block are counted too: this is the test that still speaks when no block can be
scored. An episode that ends outside the real logs' observation range (a policy that drives the
system where no real log went, e.g. to a goal the real logs never reached) is not judged: whether
reality would end there is unknown, which is the competence tests' finding, not an ending gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wmcheck.checks.evidence import GapEvidence
from wmcheck.checks.stats import fisher_exact_p


@dataclass
class EndingDetail:
    checked_episodes: int
    checked_terminated: int
    real_episodes: int
    real_terminated: int
    p_value: float
    checked_steps: float | None  # mean length of the checked episodes that terminate
    real_steps: float | None  # mean length of the real episodes that terminate
    checked_length: float  # mean length of all checked episodes
    not_judged: int = 0  # checked episodes that end outside the real logs' observation range

    @property
    def checked_rate(self) -> float:
        return self.checked_terminated / max(self.checked_episodes, 1)

    @property
    def real_rate(self) -> float:
        return self.real_terminated / max(self.real_episodes, 1)


def real_endings(episodes) -> dict:
    """What calibration stores about how real episodes end: counts and the terminating lengths."""
    term = [e for e in episodes if e.num_steps and bool(np.asarray(e.terminations)[-1])]
    return {
        "episodes": len(episodes),
        "terminated": len(term),
        "terminated_steps_mean": float(np.mean([e.num_steps for e in term])) if term else None,
    }


def ends_inside(episode, obs_range, tol: float = 0.02) -> bool:
    """The episode's last observation lies inside the real logs' range (per channel, +-tol of it)."""
    if obs_range is None:
        return True
    lo, hi = (np.asarray(x, float) for x in obs_range)
    pad = tol * np.maximum(hi - lo, 1e-12)
    last = np.asarray(episode.observations[-1], float)
    return bool(((last >= lo - pad) & (last <= hi + pad)).all())


def ending_evidence(checked, real: dict | None, level: float, obs_range=None) -> GapEvidence:
    """The `ending` gap test at `level` (evidence = level / p: >= 1 fires); obs_range: the real
    logs' (min, max) per observation channel (episodes ending outside it are not judged)."""
    if not real or not real.get("episodes"):
        return GapEvidence.not_checked("ending", "the calibration predates the ending test: re-run `wmcheck calibrate`")
    judged = [e for e in checked if ends_inside(e, obs_range)]
    if not judged:
        why = "no checked episode" if not checked else "every checked episode ends outside the real logs' range"
        return GapEvidence.not_checked("ending", why)
    mine = real_endings(judged)
    p = fisher_exact_p(mine["terminated"], mine["episodes"], int(real["terminated"]), int(real["episodes"]))
    detail = EndingDetail(
        mine["episodes"],
        mine["terminated"],
        int(real["episodes"]),
        int(real["terminated"]),
        p,
        mine["terminated_steps_mean"],
        real.get("terminated_steps_mean"),
        float(np.mean([e.num_steps for e in judged])),
        len(checked) - len(judged),
    )
    return GapEvidence("ending", level / max(p, 1e-300), detail=detail)
