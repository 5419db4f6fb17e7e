"""The verdicts of a check, decided in one place: `decide(evidence, levels) -> Decision`.

Owns every rule that turns evidence (evidence.py) into verdicts. Nothing else in wmcheck decides
a verdict: `run_check` calls this on the checked data, `power.power_table` on injected
real blocks (so "what a pass is worth" is what a check would conclude), and the report only
words the `Decision`. Each rule below has a row in tests/test_decision.py.

Levels (`Levels.for_check`, one check of n episodes at false-alarm budget alpha): half of alpha
for the divergence tests, half for the five gap tests (config.split_alpha); an episode's
divergence test runs at alpha / 2 / (2 * 3 scores * n), its competence tests at alpha / (2 n),
the pooled test at alpha / 2 / (2 * 3 scores).

Episodes
  E1  divergent     some score's p (competent blocks) is below the episode level;
  E2  unverifiable  not divergent, and a block lies outside competence or a competence p is
                    below the competence level (the model cannot judge it; never a pass);
  E3  consistent    otherwise.
Gap rows (latency, actuator, sensor_noise, dynamics, ending, visual)
  G1  not_checked   the test could not run (the reason is in the evidence);
  G2  tolerated     the test fires (evidence >= 1) and the gate's tolerance covers the estimate;
  G3  present       the test fires otherwise;
  G4  absent        it does not fire.
  G5  distribution  present when the visited states differ (two-sample test at alpha, or coverage
                    below the gate's `distribution.min_coverage`), absent otherwise.
Run
  R1  fail when any of these holds (the `failing` reasons):
        episodes     an episode is divergent (E1), except under R4c,
        pooled       the pooled test rejects for some score, except under R4c,
        <gap>        a gap row is present (G3), except rows confounded by the shift (R4) or the policy (R4b),
        coverage     coverage is below the gate's binding `distribution.min_coverage`,
        policy_gate  the closed-loop policy gate is not met.
  R2  tolerances: a tolerated gap (G2) does not fail the run by itself, and the divergence
      reasons (episodes, pooled) are judged on the tests re-run after the corrections of the gaps
      found (`CheckEvidence.corrected`): a tolerated 1-step latency whose shift removes the
      divergence passes; divergence that remains after the tolerated corrections fails. (Before:
      one tolerated gap made the run pass whatever the episodes and the pooled test said.)
  R3  a distribution gap alone does not fail: under another policy the visited states differ by
      design; the consistency verdict is about behaviour where the model can judge it. A team
      that needs coverage sets `distribution.min_coverage` in the gate (R1 coverage).
  R4  residual gaps (sensor_noise, dynamics) present while the visited states differ (G5) are
      confounded with the shift (residual levels depend on the states): they make the run
      unverifiable, not failed.
  R4b gap rows run through the model (latency, actuator, sensor_noise, dynamics) present while the
      checked commands follow another policy than the real logs' (policy_match.py: as the team
      declares it with --checked-policy; undeclared, where the policy-shift test rejects, or where
      the real commands depend on the states, a closed loop on which the test cannot tell) are confounded
      with the policy: the corrections' score tests compare with real blocks whose commands relate
      to the state in another way, and under a closed-loop controller the model's own small errors
      move those scores as a gap does (the closed-loop identification problem); the residual tests
      compare residual levels with real blocks of another excitation, and the model's one-step and
      open-loop errors depend on the commands it is given as well as on the states (commands that
      change more often are harder to predict after each change, whatever the simulator: a
      faithful HalfCheetah under hold:2 failed the sensor-noise row, docs/benchmarks.md). They
      make the run unverifiable, not failed. So does an ending finding that another controller
      gives too (`GapEvidence.policy_may_cause`, endings.py): episodes that fail sooner where the
      model expects reality to fail too, or less often without running on past expected ends (a
      faithful double pendulum under a stiffer LQR ended less often than reality's and failed on
      the ending row alone, docs/benchmarks.md, twenty-eighth session).
  R4c divergence (an E1 episode, the pooled test) while the checked commands follow another policy
      than the logs' is confounded with the policy: the real blocks that set the divergence
      thresholds were recorded under the logs' policy, and the model's open-loop error depends on
      the commands it is given as well as on the states (under a feedback controller near an
      unstable point it grows whatever the simulator; commands that change every 2 steps instead
      of every 5 are harder to predict after each change). It makes the run unverifiable, not
      failed. Until the twenty-second session R4c also asked for the visited states to differ
      (G5); a faithful HalfCheetah under hold:2 whose distribution row missed then failed on
      divergence alone, while its 11 siblings under hold:2 and the gait controller, whose
      distribution rows fired, were unverifiable with the same scores (docs/benchmarks.md). Under
      the logs' policy a state shift does not excuse divergence: that is what a gap does.
  R5  unverifiable when not failed and some episode is unverifiable (E2) or R4 / R4b / R4c applies;
      exit code 0 only when the gate allows unverifiable runs.
  R6  pass otherwise (exit 0), if R7 allows.
  R7  no pass without power: a pass claims every gap type, so when the power table (for a check of
      this many blocks) shows a required gap type undetectable at every tested size, or its
      control is unreliable, or power could not be measured at all (fewer than 2 held-out real
      episodes per half), the verdict is `inconclusive` (exit 3), listing the types it could not
      have seen (`Decision.missing_power`). The ending row is judged by its own best case in this
      check (endings.EndingPower: the count test had every judged checked episode terminated, or
      none; where it judges none, the run-on test, which then decides the row, had every one with
      an expected end run on beyond every held-out real one): a direction reality's counts allow
      that no outcome could have shown leaves
      "ending" missing. The gate's `require_power` narrows the required types (a partial pass the
      team accepts explicitly).
  R8  no checked block at all (every episode shorter than a block), or none the divergence tests
      judge (every block ends at a termination and is left to the ending test, divergence.py):
      the divergence tests through the model cannot speak, so a run that does not fail on what can
      be tested (the gap tests, the ending test) is `inconclusive`, never pass.
  R9  a model that is not competent (its quality card: open loop over the check's horizon it
      predicts held-out real episodes no better than a linear ARX model) cannot tell a simulator's
      error from its own: a run that would pass is `inconclusive` (`Decision.model_not_competent`).
      A fail stands: its thresholds come from real episodes scored by the same model.
Top gap
  T1  among the dynamics-family gaps that fire (present or tolerated), the one the bootstrap
      separates (largest evidence in >= 90 % of replicates; attribution.separate_top), else none
      with the ones it cannot separate listed. A row confounded with the shift (R4) is a candidate
      only in a run that fails on divergence (episodes, pooled), where it may explain what failed
      (a dynamics gap moves the states). A row confounded with the policy (R4b) never is: under
      another policy divergence does not fail the run (R4c). Otherwise a confounded row is why
      the run is unverifiable, not a finding: on the detection benchmark such
      rows named sensor_noise and actuator for faithful simulators. A row whose finding another gap
      type produces as well (`GapEvidence.confounded_with`: a fitted delay that rounds to zero steps
      is a filter of the commands, as a slower response is; gap_tests.sub_step) is not named: when
      a look-alike fires too (the dynamics row, tested with the delay corrected, so on what the
      delay does not explain), the top gap is chosen among the other rows; else it is none, with
      the row, the other rows of the same look-alike and the look-alikes listed as confounded.
      An actuator finding whose fitted gains move the response the way such a delay does (later
      and weaker, earlier and stronger: gap_tests.bandwidth_lookalike) is the other half of a
      plant with another bandwidth and is a look-alike of dynamics too. A row whose finding another
      gap type explains when its own row fires (`GapEvidence.explained_by`: a residual level off
      reality's, which latency, actuator and dynamics gaps give as well,
      gap_tests.SENSOR_LEVEL_EXPLAINED_BY) is not a candidate while that row fires, and is named
      when it fires alone;
  T2  then the visual gap if it fires, then the ending gap, unless its episodes end where the
      world model expects reality to end as well (endings.py, `EndingDetail.upstream`): they
      reach failing states sooner, which latency, actuator, sensor-noise and dynamics gaps do under a
      controller, so none is named and those are listed as confounded; the same where they end
      less often than reality's without going on past a state where the model expects reality to
      end (they never reach the failing states); where they do go on past such states (the run-on
      test, endings.py), the ending is named;
  T3  then the distribution gap, when the pooled test does not reject (a shifted distribution
      that the model judges consistent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wmcheck.checks.config import DYNAMICS_GAPS, ROW_GAPS, SCORES, split_alpha
from wmcheck.checks.evidence import CheckEvidence, DivergenceEvidence, EpisodeEvidence, GapEvidence

RESIDUAL_GAPS = ("sensor_noise", "dynamics")
"""Gap tests that compare residual levels with the real blocks' (they depend on the visited states)."""
CORRECTION_GAPS = ("latency", "actuator")
"""Gap tests whose null is the real blocks' corrections' scores."""
POLICY_DEPENDENT_GAPS = CORRECTION_GAPS + RESIDUAL_GAPS
"""Gap tests whose null is real blocks recorded under the logs' behaviour policy (rule R4b)."""
EXIT_CODES = {"pass": 0, "fail": 1, "unverifiable": 1, "inconclusive": 3}
"""0 pass, 1 fail or unverifiable (0 with allow_unverifiable), 3 inconclusive; 2 is bad input (the CLI)."""


@dataclass(frozen=True)
class Levels:
    """The significance level of every test in one check (see the module docstring)."""

    alpha: float
    episode: float  # per-episode divergence test, per score
    competence: float  # per-episode competence tests
    pooled: float  # pooled divergence test, per score
    gap: float  # each gap test

    @classmethod
    def for_check(cls, alpha: float, n_episodes: int) -> Levels:
        a_div, a_gap = split_alpha(alpha)
        n = max(int(n_episodes), 1)
        return cls(alpha, a_div / (2 * len(SCORES) * n), alpha / (2 * n), a_div / (2 * len(SCORES)), a_gap)


@dataclass
class Decision:
    verdict: str  # pass / fail / unverifiable (the release verdict)
    exit_code: int
    episodes: dict[int, str]  # episode id -> consistent / divergent / unverifiable (as checked)
    gaps: dict[str, str]  # gap -> present / absent / tolerated / not_checked (distribution included)
    top_gap: str = "none"
    confounded: list[str] = field(default_factory=list)
    failing: tuple[str, ...] = ()  # R1 reasons, after tolerances
    failing_without_tolerance: tuple[str, ...] = ()  # the same reasons had the gate tolerated nothing
    shift_confounded: tuple[str, ...] = ()  # R4
    consistency_verdict: str = "pass"  # the verdict without the policy gate
    missing_power: tuple[str, ...] = ()  # R7: the required gap types this check could not have seen
    model_not_competent: bool = False  # R9: the pass was withheld because the model is not competent
    policy_confounded: tuple[str, ...] = ()  # R4b
    divergence_confounded: tuple[str, ...] = ()  # R4c: the divergence reasons (episodes, pooled) excused

    @property
    def tolerated_by_gate(self) -> bool:
        return bool(self.failing_without_tolerance) and not self.failing

    def count(self, verdict: str) -> int:
        return sum(v == verdict for v in self.episodes.values())


def episode_verdict(ep: EpisodeEvidence, levels: Levels) -> str:
    """E1-E3."""
    if any(p < levels.episode for p in ep.divergence_p.values() if not math.isnan(p)):
        return "divergent"
    if ep.outside_competence > 0 or any(p < levels.competence for p in ep.competence_p.values() if not math.isnan(p)):
        return "unverifiable"
    return "consistent"


def gap_verdict(g: GapEvidence) -> str:
    """G1-G4."""
    if not g.checked:
        return "not_checked"
    if g.fires:
        return "tolerated" if g.within_tolerance else "present"
    return "absent"


def pooled_rejects(div: DivergenceEvidence, levels: Levels) -> bool:
    return any(p < levels.pooled for p in div.pooled.p_values.values() if not math.isnan(p))


def _divergence_reasons(div: DivergenceEvidence, levels: Levels) -> list[str]:
    out = []
    if any(episode_verdict(e, levels) == "divergent" for e in div.episodes):
        out.append("episodes")
    if pooled_rejects(div, levels):
        out.append("pooled")
    return out


def strength(ev: CheckEvidence, levels: Levels) -> float | None:
    """How far the evidence is from a pass, one number per run: the largest of the tests' ratios
    to their thresholds, level / p for the divergence tests (each episode's and the pooled test,
    every score) and evidence (statistic / null quantile) for the gap rows; >= 1 means some test
    fired. It ranks runs (the detection benchmark's AUROC of the decision, next to the block
    score's) and decides nothing: the verdict is the rules above (confounding, tolerances, power).
    None when no test ran."""
    ratios = [
        level / max(p, 1e-300)
        for level, ps in [(levels.episode, e.divergence_p) for e in ev.divergence.episodes]
        + [(levels.pooled, ev.divergence.pooled.p_values)]
        for p in ps.values()
        if not math.isnan(p)
    ]
    ratios += [
        g.evidence for g in ev.gaps.values() if g.checked and g.evidence is not None and not math.isnan(g.evidence)
    ]
    return float(max(ratios)) if ratios else None


def decide(ev: CheckEvidence, levels: Levels, allow_unverifiable: bool = False) -> Decision:
    """The verdicts of one check (rules E, G, R, T of the module docstring)."""
    episodes = {e.id: episode_verdict(e, levels) for e in ev.divergence.episodes}
    gaps = {g: gap_verdict(ev.gaps[g]) for g in ROW_GAPS}
    dist = ev.distribution
    gaps["distribution"] = "not_checked" if dist is None else ("present" if dist.shifted else "absent")
    shifted = dist is not None and dist.shifted
    policy_shifted = ev.policy_shift is not None and ev.policy_shift.shifted
    fired = {g for g in ROW_GAPS if gaps[g] in ("present", "tolerated")}
    shift_confounded = tuple(g for g in RESIDUAL_GAPS if shifted and g in fired)  # R4
    policy_confounded = tuple(  # R4b
        g
        for g in ROW_GAPS
        if policy_shifted and g in fired and (g in POLICY_DEPENDENT_GAPS or ev.gaps[g].policy_may_cause)
    )
    confounded_rows = shift_confounded + policy_confounded
    divergence_excused = policy_shifted  # R4c

    def divergence(tolerate: bool) -> list[str]:
        tolerated = [g for g, v in gaps.items() if v == "tolerated"] if tolerate else []
        div = ev.corrected if (tolerated and ev.corrected is not None) else ev.divergence  # R2
        return _divergence_reasons(div, levels)

    def reasons(tolerate: bool) -> tuple[str, ...]:
        out = [] if divergence_excused else divergence(tolerate)
        for g in ROW_GAPS:
            red = gaps[g] == "present" or (not tolerate and gaps[g] == "tolerated")
            if red and g not in confounded_rows:  # R4, R4b
                out.append(g)
        if dist is not None and dist.below_min_coverage:
            out.append("coverage")
        return tuple(out)

    failing, raw = reasons(True), reasons(False)
    divergence_confounded = tuple(divergence(True)) if divergence_excused else ()
    if failing:
        consistency = "fail"
    elif any(v == "unverifiable" for v in episodes.values()) or confounded_rows or divergence_confounded:
        consistency = "unverifiable"  # R5
    else:
        consistency = "pass"
    missing = ev.power.missing if ev.power is not None else ()
    judged = any(not math.isnan(p) for e in ev.divergence.episodes for p in e.divergence_p.values())
    if consistency == "pass" and not judged:  # R8: no episode has a block the divergence tests judge
        consistency = "inconclusive"
        missing = missing or (ev.power.required if ev.power is not None else ("every gap type",))
    if consistency == "pass" and missing:
        consistency = "inconclusive"  # R7
    not_competent = ev.model_quality is not None and not ev.model_quality.competent
    if consistency == "pass" and not_competent:
        consistency = "inconclusive"  # R9
    verdict = consistency
    if ev.policy_gate_passed is False:
        failing, raw, verdict = failing + ("policy_gate",), raw + ("policy_gate",), "fail"
    exit_code = 0 if verdict == "pass" or (verdict == "unverifiable" and allow_unverifiable) else EXIT_CODES[verdict]
    # T1: a confounded row (R4, R4b) is a candidate cause only in a run that fails on divergence
    not_causes = () if {"episodes", "pooled"} & set(failing) else shift_confounded + policy_confounded
    top, confounded = top_gap(ev, gaps, pooled_rejects(ev.divergence, levels), not_causes)
    return Decision(
        verdict,
        exit_code,
        episodes,
        gaps,
        top,
        confounded,
        failing,
        raw,
        shift_confounded,
        consistency,
        missing if consistency == "inconclusive" else (),
        consistency == "inconclusive" and not_competent,
        policy_confounded,
        divergence_confounded,
    )


def look_alikes(g: GapEvidence) -> set[str]:
    """The gap types whose firing row T1 names before this one (both kinds of look-alike)."""
    return set(g.confounded_with) | set(g.explained_by)


def top_gap(
    ev: CheckEvidence, gaps: dict[str, str], pooled_reject: bool, not_causes: tuple[str, ...] = ()
) -> tuple[str, list[str]]:
    """T1-T3: the gap the evidence names, or 'none' and the gaps it cannot separate; `not_causes`
    are firing rows T1 leaves out (confounded)."""
    from wmcheck.checks.attribution import separate_top

    firing = [g for g in DYNAMICS_GAPS if gaps[g] in ("present", "tolerated") and g not in not_causes]
    # T1: a row whose look-alike fires as well, on data with the row's correction applied, is not a
    # candidate: the look-alike produces the row's finding, and it has evidence the row's does not explain
    candidates = [g for g in firing if not look_alikes(ev.gaps[g]) & set(firing)] or firing
    top, confounded = separate_top({g: ev.gaps[g].boot for g in candidates}, candidates)
    alike = ev.gaps[top].confounded_with if top in ev.gaps else ()
    if alike:  # T1: a finding another gap type produces as well is listed with it, not named alone
        kin = [g for g in candidates if g != top and set(ev.gaps[g].confounded_with) & set(alike)]  # same look-alike
        top, confounded = "none", list(dict.fromkeys([top, *kin, *alike]))
    elif confounded:  # rows the bootstrap cannot separate: listed with their look-alikes too
        confounded = list(dict.fromkeys([*confounded, *(a for g in confounded for a in ev.gaps[g].confounded_with)]))
    if top == "none" and not confounded:
        if gaps["visual"] in ("present", "tolerated"):
            top = "visual"
        elif gaps["ending"] in ("present", "tolerated") and "ending" not in not_causes:
            upstream = ev.gaps["ending"].confounded_with  # endings where the model expects them too
            top, confounded = ("none", ["ending", *upstream]) if upstream else ("ending", [])
        elif gaps["distribution"] == "present" and not pooled_reject:
            top = "distribution"
    return top, confounded
