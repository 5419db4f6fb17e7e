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
ended there too (the last row of `end_profiles`: having observed the whole episode, the
probability that its last step ends it). One cause the counts cannot tell from others: a simulator that terminates
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

The other half of the row: episodes that run on where reality ends (`run_on_steps`). An
engineering simulator often has no termination of its own (no fall detection, no trip): its
episodes go on through the states where the real plant stops, so the counts above may even agree.
The head says where: an observation inside the real logs' range at which the model gives
reality's end a probability of at least one half is an expected end, and the steps an episode goes
on after its first one are what it ran on (0 where it ends there). Real episodes mostly end at
their first expected end, and some a few steps later (the head expects a fall a few steps early).
Among the episodes with an expected end, the checked steps run on are compared with the held-out
real episodes' (calibration stores them) by a one-sided Mann-Whitney test, episodes as the units:
whether an episode reaches a failing state at all is what the counts judge, how long it goes on
after is what this judges, and the two do not depend on the number of checked episodes. The test applies where the real logs terminate
(the head has learned an end) and some held-out real episode has an expected end. It decides the
row only where the count test judges no episode (every checked episode ends outside the real
logs' range, e.g. a simulator that runs on past a fall into states no log holds); elsewhere it
says what a firing row means. Splitting the row's level between the two tests was tried and
reverted: the count test then missed 4 of 34 gapped double-pendulum simulators it had flagged
(docs/benchmarks.md, twenty-seventh session). A run that goes on past expected ends names the
ending (its simulator lacks reality's termination); a run that terminates less often than
reality's without going on past expected ends never reaches the failing states, which the four
UPSTREAM gaps do to a controlled system too: confounded with them.

What the row could have seen (`ending_power`, `EndingPower`; decision rule R7): its tests' p on
the most extreme outcomes of this check, per direction the real counts allow. Sooner: every judged
checked episode terminates. Later: none does; where the count test judges none, the run-on test
decides the row, and its best case counts instead (every checked episode with an expected end runs
on beyond every held-out real one). A direction whose best p misses the level leaves the ending
out of what a pass can claim: 8 episodes against the double pendulum's 52 falls in 120 real
episodes cannot show a simulator that never falls (p 0.021 at 0.005); 11 can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wmcheck.checks.evidence import GapEvidence
from wmcheck.checks.stats import fisher_exact_p, mann_whitney_greater

EXPECTED = 0.5  # a termination the continue head gives at least this probability is one it expects
UPSTREAM = ("latency", "actuator", "sensor_noise", "dynamics")  # what makes a controlled system fail sooner or later


def end_profiles(model, episodes, norm) -> dict[int, np.ndarray]:
    """{episode id: (N+1,) the model's probability that reality ends at each observation of the
    episode}, given the episode observed from its start (1 - sigmoid of the continue head at each
    posterior state; row N is the last observation). With cross-fitted models (folds.FoldModels),
    each episode by its assigned fold model."""
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
            logit = m.cont(observed.state.feat())[0]  # (N+1,)
            out[int(e.id)] = (1.0 - torch.sigmoid(logit.float())).numpy().astype(float)
    return out


def last_end_probabilities(profiles: dict[int, np.ndarray]) -> dict[int, float]:
    """{episode id: the last row of its end profile}, where it is finite (JSON has no NaN)."""
    return {i: float(p[-1]) for i, p in profiles.items() if len(p) and np.isfinite(p[-1])}


def run_on_steps(episode, profile: np.ndarray, obs_range=None) -> int | None:
    """The steps `episode` goes on after its first expected end: the first observation inside the
    real logs' range at which the end probability (`profile` (N+1,)) is at least EXPECTED (0: it
    ends there, at its last observation). None where the episode has no expected end."""
    p = np.asarray(profile, float)  # (N+1,)
    ok = inside_range(np.asarray(episode.observations, float), obs_range) & np.isfinite(p) & (p >= EXPECTED)
    first = np.flatnonzero(ok)
    return int(len(p) - 1 - first[0]) if len(first) else None


def run_on_of(episodes, profiles: dict[int, np.ndarray], obs_range=None) -> list[int]:
    """The steps run on (`run_on_steps`) of the episodes in `profiles` that have an expected end."""
    steps = (run_on_steps(e, profiles[int(e.id)], obs_range) for e in episodes if int(e.id) in profiles)
    return [s for s in steps if s is not None]


@dataclass
class RunOn:
    """The run-on test: steps run on after an expected end, checked against held-out real."""

    checked_probed: int  # checked episodes with an end profile
    checked: list[int]  # steps run on, of the checked episodes with an expected end
    real_probed: int  # held-out real episodes with an end profile (calibration)
    real: list[int]  # theirs
    p_value: float  # one-sided Mann-Whitney, checked longer (1.0 where no checked episode has an expected end)
    level: float  # its level (the row's)

    @property
    def fires(self) -> bool:
        return self.p_value < self.level

    @property
    def checked_median(self) -> float | None:
        return float(np.median(self.checked)) if self.checked else None

    @property
    def real_median(self) -> float | None:
        return float(np.median(self.real)) if self.real else None


@dataclass
class EndingPower:
    """What the ending row could have seen in this check at best (decision R7): its tests' p-values
    had the checked episodes ended as differently from reality's as they can. A pass claims both
    directions: episodes that end sooner (more of them terminate) and episodes that end later or
    never (fewer terminate, or they run on past expected ends)."""

    sooner_p: float | None  # the count test with every judged checked episode terminating (None: every real one does)
    later_p: float | None  # the count test with none terminating, or where it judges none, the run-on test's best
    # case (None: no real episode terminates)
    level: float  # the row's level
    judged: int  # checked episodes the count test judges (ending inside the real logs' range)
    episodes_needed: int | None  # judged episodes at which both count directions reach the level (None: none do)
    run_on_checked: int = 0  # where the run-on test decides: the checked episodes with an expected end

    @property
    def blind(self) -> tuple[str, ...]:
        """The directions no outcome of this check could have shown ("sooner", "later")."""
        sides = {"sooner": self.sooner_p, "later": self.later_p}
        return tuple(side for side, p in sides.items() if p is not None and p >= self.level)

    @property
    def detectable(self) -> bool:
        return not self.blind


@dataclass
class EndingDetail:
    checked_episodes: int
    checked_terminated: int
    real_episodes: int
    real_terminated: int
    p_value: float  # the row's: the count test's, or the run-on test's where no episode is judged by counts
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
    count_p: float | None = None  # the count test's p (None: no episode ends inside the real logs' range)
    run_on: RunOn | None = None  # the run-on test (None: it does not apply)
    power: EndingPower | None = None  # what the row could have seen in this check, at best (R7)

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
    def ends_more(self) -> bool:
        """More of the judged checked episodes terminate than the real share would give them."""
        return self.checked_terminated > self.real_rate * self.checked_episodes

    @property
    def checked_rate(self) -> float:
        return self.checked_terminated / max(self.checked_episodes, 1)

    @property
    def real_rate(self) -> float:
        return self.real_terminated / max(self.real_episodes, 1)


def terminates(episode) -> bool:
    """The episode's last step is a termination (the plant fell or tripped), not a time limit."""
    return bool(episode.num_steps) and bool(np.asarray(episode.termination_array())[-1])


def real_endings(episodes, held_out=(), profiles: dict[int, np.ndarray] | None = None, obs_range=None) -> dict:
    """What calibration stores about how real episodes end: counts and the terminating lengths; of
    the held-out episodes (`held_out`, with their end profiles `profiles`, `end_profiles`), the
    model's end probability at each termination and the steps run on after an expected end
    (`run_on_of`), and how many were probed."""
    term = [e for e in episodes if terminates(e)]
    profiles = profiles or {}
    probed = [e for e in held_out if int(e.id) in profiles]
    last = last_end_probabilities({int(e.id): profiles[int(e.id)] for e in probed if terminates(e)})
    return {
        "episodes": len(episodes),
        "terminated": len(term),
        "terminated_steps_mean": float(np.mean([e.num_steps for e in term])) if term else None,
        "held_out_end_probabilities": sorted(last.values()),
        "held_out_probed": len(probed),
        "held_out_run_on": sorted(run_on_of(probed, profiles, obs_range)),
    }


def inside_range(obs: np.ndarray, obs_range, tol: float = 0.02) -> np.ndarray:
    """(T,) which observations (T, D) lie inside the real logs' range (per channel, +-tol of it)."""
    obs = np.asarray(obs, float).reshape(len(obs), -1)
    if obs_range is None:
        return np.ones(len(obs), bool)
    lo, hi = (np.asarray(x, float).ravel() for x in obs_range)
    pad = tol * np.maximum(hi - lo, 1e-12)
    return ((obs >= lo - pad) & (obs <= hi + pad)).all(1)


def ends_inside(episode, obs_range) -> bool:
    """The episode's last observation lies inside the real logs' range (`inside_range`)."""
    return bool(inside_range(np.asarray(episode.observations[-1:], float), obs_range)[0])


def run_on_applies(real: dict | None) -> bool:
    """The run-on test can speak: the real logs terminate (the head has learned an end) and some
    held-out real episode has an expected end (the test's null)."""
    return bool(real and real.get("terminated") and real.get("held_out_run_on"))


def _run_on(checked, real: dict, level: float, obs_range, profiles: dict[int, np.ndarray]) -> RunOn:
    probed = [e for e in checked if int(e.id) in profiles]
    mine = run_on_of(probed, profiles, obs_range)
    theirs = [int(x) for x in real["held_out_run_on"]]
    p = mann_whitney_greater(np.array(mine, float), np.array(theirs, float)) if mine else 1.0
    return RunOn(len(probed), sorted(mine), int(real.get("held_out_probed") or 0), sorted(theirs), float(p), level)


def ending_evidence(
    checked, real: dict | None, level: float, obs_range=None, profiles: dict[int, np.ndarray] | None = None
) -> GapEvidence:
    """The `ending` gap test at `level` (evidence = level / p: >= 1 fires); obs_range: the real
    logs' (min, max) per observation channel (episodes ending outside it are not judged by the
    count test); profiles: the end profiles of probed checked episodes (`end_profiles`; None: not
    computed), for the run-on test and for whether a firing test is confounded with UPSTREAM."""
    if not real or not real.get("episodes"):
        return GapEvidence.not_checked("ending", "the calibration predates the ending test: re-run `wmcheck calibrate`")
    run = _run_on(checked, real, level, obs_range, profiles) if profiles and run_on_applies(real) else None
    judged = [e for e in checked if ends_inside(e, obs_range)]
    if not judged and run is None:
        why = "no checked episode" if not checked else "every checked episode ends outside the real logs' range"
        return GapEvidence.not_checked("ending", why)
    mine = real_endings(judged)
    count_p = (
        fisher_exact_p(mine["terminated"], mine["episodes"], int(real["terminated"]), int(real["episodes"]))
        if judged
        else None
    )
    p = count_p if count_p is not None else run.p_value  # the run-on test decides only where no count is judged
    detail = EndingDetail(
        mine["episodes"],
        mine["terminated"],
        int(real["episodes"]),
        int(real["terminated"]),
        p,
        mine["terminated_steps_mean"],
        real.get("terminated_steps_mean"),
        float(np.mean([e.num_steps for e in judged])) if judged else 0.0,
        len(checked) - len(judged),
        expected_level=level,
        count_p=count_p,
        run_on=run,
        power=ending_power(len(judged), real, level, run),
    )
    end_p = last_end_probabilities(profiles or {})
    ends = [end_p[int(e.id)] for e in judged if terminates(e) and int(e.id) in end_p]
    if ends:
        real_ends = list(real.get("held_out_end_probabilities") or [])
        detail.checked_probed, detail.checked_expected = len(ends), sum(q >= EXPECTED for q in ends)
        detail.checked_end_probability = float(np.median(ends))
        if real_ends:
            detail.real_probed, detail.real_expected = len(real_ends), sum(q >= EXPECTED for q in real_ends)
            detail.real_end_probability = float(np.median(real_ends))
            detail.expected_p = fisher_exact_p(detail.checked_expected, len(ends), detail.real_expected, len(real_ends))
    evidence = level / max(p, 1e-300)
    confounded = _confounded(detail, evidence >= 1.0)
    return GapEvidence(
        "ending", evidence, detail=detail, confounded_with=confounded, policy_may_cause=_policy_may_cause(detail)
    )


def _policy_may_cause(d: EndingDetail) -> bool:
    """Whether another controller gives the row's finding too (decision R4b): episodes that end more
    often where the model expects reality to end too (`EndingDetail.upstream`: a worse controller
    lets the plant fail sooner), or less often without running on past expected ends (a better one
    keeps it away from failing states). Not a run that goes on past expected ends, nor terminations
    where the model does not expect reality to end: the plant's termination rule does not depend on
    who controls it. On the double pendulum a faithful simulator under a stiffer LQR ended less
    often than reality and failed on this row alone (docs/benchmarks.md, twenty-eighth session)."""
    if not d.checked_episodes or (d.run_on is not None and d.run_on.fires):
        return False
    if d.ends_more:
        return d.upstream
    return True


MAX_EPISODES_NEEDED = 1 << 14  # beyond this many checked episodes the fix is more real ones


def ending_power(judged: int, real: dict, level: float, run: RunOn | None) -> EndingPower:
    """The ending row's best case (`EndingPower`) for `judged` checked episodes the count test judges,
    against the real counts calibration stores. Where the count test judges none, the run-on test
    decides the row (`ending_evidence`), and its best case counts for the later direction: every
    checked episode with an expected end runs on longer than every held-out real one; elsewhere
    it does not decide, so it gives the row no power."""
    t, n_real = int(real["terminated"]), int(real["episodes"])
    sooner = fisher_exact_p(judged, judged, t, n_real) if t < n_real else None  # 1.0 where none is judged
    later, k = None, 0
    if t > 0:
        later = fisher_exact_p(0, judged, t, n_real)
        if not judged and run is not None and run.checked:
            k, theirs = len(run.checked), np.asarray(run.real, float)
            longest = theirs.max() + 1 + np.arange(k, dtype=float)  # (k,) every one beyond every real episode
            later = mann_whitney_greater(longest, theirs)
    return EndingPower(sooner, later, level, judged, _episodes_needed(t, n_real, level), k)


def _episodes_needed(t: int, n_real: int, level: float) -> int | None:
    """The fewest judged checked episodes at which the count test could show both directions
    that these real counts allow (t of n_real terminate); None where no number up to
    MAX_EPISODES_NEEDED does."""

    def enough(n: int) -> bool:
        sooner = t == n_real or fisher_exact_p(n, n, t, n_real) < level
        return sooner and (t == 0 or fisher_exact_p(0, n, t, n_real) < level)

    hi = 1
    while not enough(hi):
        hi *= 2
        if hi > MAX_EPISODES_NEEDED:
            return None
    lo = hi // 2  # enough(hi); not enough(lo) unless lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def _confounded(d: EndingDetail, fires: bool) -> tuple[str, ...]:
    """The gaps a firing ending row cannot be told from (module docstring): none where the run goes
    on past expected ends (the simulator lacks reality's termination); UPSTREAM where it ends more
    often where the model expects reality to end too (`EndingDetail.upstream`), or less often
    without going on past an expected end (it does not reach the failing states)."""
    if not fires or (d.run_on is not None and d.run_on.fires) or not d.checked_episodes:
        return ()
    if d.ends_more:
        return UPSTREAM if d.upstream else ()
    return UPSTREAM if d.run_on is not None else ()
