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

Where the checked episodes end, the world model's continue head says whether reality would have
ended there too (`end_probabilities`: having observed the whole episode, the probability that its
last step ends it). One cause the counts cannot tell from others: a simulator that terminates
where the model expects reality to end as well, as often as real terminations are expected,
reaches failing states sooner (or later), and has no other termination rule: under a controller a
latency, actuator, sensor-noise or dynamics difference does that (on the double pendulum every such simulator
fell within 11-43 steps, docs/benchmarks.md, twenty-sixth session). That finding is confounded with
those gaps (`GapEvidence.confounded_with`), and the decision lists them instead of naming the
ending (decision.top_gap, T2). A termination counts as expected when the head's probability is at
least one half; the share of expected checked terminations is compared with the held-out real
terminations' by Fisher's exact test at the ending test's level (calibration stores theirs).
The other way the head is no evidence: a termination it does not expect may follow other rules (a
trip threshold, a safety cut-off) or a fall faster than any the logs hold (double-pendulum falls
within 9-13 steps, by reality's own rule, got 0.01-0.3); the ending row is then named, with its
cause left open.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wmcheck.checks.evidence import GapEvidence
from wmcheck.checks.stats import fisher_exact_p

EXPECTED = 0.5  # a termination the continue head gives at least this probability is one it expects
UPSTREAM = ("latency", "actuator", "sensor_noise", "dynamics")  # what makes a controlled system fail sooner or later


def end_probabilities(model, episodes, norm) -> dict[int, float]:
    """{episode id: the model's probability that reality ends at the episode's last step}, given the
    whole episode observed from its start (1 - sigmoid of the continue head at the last posterior
    state). With cross-fitted models (folds.FoldModels), each episode by its assigned fold model."""
    import torch

    from wmcheck.checks.folds import FoldModels
    from wmcheck.datasets.windows import episode_batch

    out = {}
    with torch.inference_mode():
        for e in episodes:
            m = model.models[model.assignment[int(e.id)]] if isinstance(model, FoldModels) else model
            m.eval()
            seq = episode_batch(e, norm).to_torch()
            observed, _ = m.observe(seq, sample=False)
            logit = m.cont(observed.state.feat()[:, -1])  # (1,)
            p = float(1.0 - torch.sigmoid(logit.float())[0])
            if np.isfinite(p):  # a non-finite head output says nothing (and is not JSON)
                out[int(e.id)] = p
    return out


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
    checked_probed: int = 0  # checked terminations with an end probability
    checked_expected: int | None = None  # of them, those the model expects (end probability >= EXPECTED)
    real_expected: int | None = None  # held-out real terminations it expects
    real_probed: int = 0  # held-out real terminations with an end probability (calibration)
    expected_p: float | None = None  # Fisher's exact test of the two expected shares (None: no real share)
    expected_level: float = 0.0  # the level it is judged at (the ending test's)
    checked_end_probability: float | None = None  # median over the checked terminations
    real_end_probability: float | None = None  # median over the held-out real terminations

    @property
    def upstream(self) -> bool:
        """The checked episodes end where the model expects reality to end as well: at least half of
        their terminations, and (where calibration probed held-out real terminations) a share the
        real terminations' does not exceed at the test's level. They reach failing states sooner or
        later, rather than ending by other rules."""
        if not self.checked_probed or self.checked_expected is None:
            return False
        fewer = (
            self.expected_p is not None
            and self.expected_p < self.expected_level
            and self.checked_expected * max(self.real_probed, 1) < (self.real_expected or 0) * self.checked_probed
        )
        return 2 * self.checked_expected >= self.checked_probed and not fewer

    @property
    def checked_rate(self) -> float:
        return self.checked_terminated / max(self.checked_episodes, 1)

    @property
    def real_rate(self) -> float:
        return self.real_terminated / max(self.real_episodes, 1)


def terminates(episode) -> bool:
    """The episode's last step is a termination (the plant fell or tripped), not a time limit."""
    return bool(episode.num_steps) and bool(np.asarray(episode.termination_array())[-1])


def real_endings(episodes, held_out_end_probabilities: dict[int, float] | None = None) -> dict:
    """What calibration stores about how real episodes end: counts and the terminating lengths, and
    the model's end probability at each held-out real termination (`end_probabilities`)."""
    term = [e for e in episodes if terminates(e)]
    return {
        "episodes": len(episodes),
        "terminated": len(term),
        "terminated_steps_mean": float(np.mean([e.num_steps for e in term])) if term else None,
        "held_out_end_probabilities": sorted((held_out_end_probabilities or {}).values()),
    }


def ends_inside(episode, obs_range, tol: float = 0.02) -> bool:
    """The episode's last observation lies inside the real logs' range (per channel, +-tol of it)."""
    if obs_range is None:
        return True
    lo, hi = (np.asarray(x, float) for x in obs_range)
    pad = tol * np.maximum(hi - lo, 1e-12)
    last = np.asarray(episode.observations[-1], float)
    return bool(((last >= lo - pad) & (last <= hi + pad)).all())


def ending_evidence(
    checked, real: dict | None, level: float, obs_range=None, end_p: dict[int, float] | None = None
) -> GapEvidence:
    """The `ending` gap test at `level` (evidence = level / p: >= 1 fires); obs_range: the real
    logs' (min, max) per observation channel (episodes ending outside it are not judged); end_p:
    the model's end probability of the checked episodes that terminate (`end_probabilities`; None:
    not computed), which says whether a firing test is confounded with UPSTREAM."""
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
        expected_level=level,
    )
    ends = [end_p[int(e.id)] for e in judged if terminates(e) and end_p is not None and int(e.id) in end_p]
    if ends:
        real_ends = list(real.get("held_out_end_probabilities") or [])
        detail.checked_probed, detail.checked_expected = len(ends), sum(q >= EXPECTED for q in ends)
        detail.checked_end_probability = float(np.median(ends))
        if real_ends:
            detail.real_probed, detail.real_expected = len(real_ends), sum(q >= EXPECTED for q in real_ends)
            detail.real_end_probability = float(np.median(real_ends))
            detail.expected_p = fisher_exact_p(detail.checked_expected, len(ends), detail.real_expected, len(real_ends))
    evidence = level / max(p, 1e-300)
    upstream = evidence >= 1.0 and detail.checked_terminated > detail.real_rate * detail.checked_episodes
    return GapEvidence(
        "ending", evidence, detail=detail, confounded_with=UPSTREAM if upstream and detail.upstream else ()
    )
