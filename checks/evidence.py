"""What a check measured, as typed data: the input of the decision (decision.py) and the report.

Owns the evidence dataclasses and nothing else: no verdicts, no prose, no dicts keyed by packed
strings. Every test a check runs leaves one of these:

  EpisodeEvidence      one checked episode: its divergence p-values (prediction test against a
                       new real episode, competent blocks only), its competence p-values, the
                       share of its blocks outside competence, the step where divergence starts
  PooledEvidence       the pooled divergence test over all competent blocks (paired or unpaired)
  DivergenceEvidence   the episodes plus the pooled test (as checked, or after the corrections of
                       the gaps found: `CheckEvidence.corrected`)
  GapEvidence          one gap test (latency, actuator, sensor_noise, dynamics, visual): its
                       statistic on the evidence scale (statistic / null (1 - level) quantile,
                       >= 1 fires), whether the gate's tolerance covers its estimate, its
                       bootstrap replicates (to separate the top gap), and a typed `detail` that the
                       report turns into an estimate and an explanation
  DistributionEvidence the two-sample test of the visited states and the coverage of the support
  PowerEvidence        which gap types a check of this size could have detected (a pass needs it)
  PolicyShift          whether the checked commands follow the real logs' policy (policy_match.py;
                       the corrections' score tests have a valid null only when they do)
  CheckEvidence        all of the above for one check, plus the policy gate's outcome
The power table (power.power_table) builds the same dataclasses on injected real blocks, so
the decision it replays is the check's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wmcheck.checks.config import ROW_GAPS
from wmcheck.checks.policy_match import PolicyShift
from wmcheck.training.quality import Competence


@dataclass
class EpisodeEvidence:
    id: int
    divergence_p: dict[str, float]  # score -> one-sided p on the competent blocks (nan: no competent block)
    competence_p: dict[str, float]  # support / disagreement -> one-sided p on all blocks
    outside_competence: int  # blocks of the episode outside the model's competence
    blocks: int
    name: str | None = None
    steps: int = 0
    onset_step: int | None = None  # step of the first flagged competent block's divergence
    score: float = 0.5  # largest two-sided rank AUC (stats.separation) over scores of its blocks vs real blocks
    mean_scores: dict[str, float] = field(default_factory=dict)

    @property
    def outside_competence_fraction(self) -> float:
        return self.outside_competence / max(self.blocks, 1)


@dataclass
class PooledEvidence:
    p_values: dict[str, float]  # score -> one-sided p (nan: no competent block)
    paired: bool = False  # each checked block against the real block whose logged inputs it replays
    paired_blocks: int = 0
    competent_blocks: int = 0


@dataclass
class DivergenceEvidence:
    episodes: list[EpisodeEvidence]
    pooled: PooledEvidence


@dataclass
class GapEvidence:
    """One gap test. `evidence` is the statistic over its null (1 - level) quantile: >= 1 fires."""

    gap: str
    evidence: float | None = None
    checked: bool = True  # False: the test could not run; `reason` says why
    within_tolerance: bool = False  # the gate's tolerance for this gap covers the estimate
    boot: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (reps,) bootstrap evidence
    detail: Any = None  # the gap's typed estimate (attribution_run.LatencyDetail, ...), for the report
    reason: str = ""
    confounded_with: tuple[str, ...] = ()  # gap types this finding cannot be told apart from (never named alone)
    explained_by: tuple[str, ...] = ()  # gap types that give this finding too: named instead when they fire (T1)
    policy_may_cause: bool = False  # another policy gives this finding too (R4b beyond the model-run rows: endings)

    @property
    def fires(self) -> bool:
        """The test is significant at its level (tolerated or not)."""
        return self.checked and self.evidence is not None and not math.isnan(self.evidence) and self.evidence >= 1.0

    @classmethod
    def not_checked(cls, gap: str, reason: str) -> GapEvidence:
        return cls(gap, None, checked=False, reason=reason)


@dataclass
class DistributionEvidence:
    p_value: float  # MMD two-sample test of visited states, whole episodes permuted
    mmd2: float = 0.0
    coverage: float = 1.0  # share of checked steps inside the real data's support
    outside_competence_fraction: float = 0.0
    min_coverage: float | None = None  # the gate's binding minimum coverage, if any
    alpha: float = 0.05  # level of the two-sample test

    @property
    def shifted(self) -> bool:
        """The visited states differ from the real logs' (two-sample test or the gate's coverage)."""
        return self.p_value < self.alpha or self.below_min_coverage

    @property
    def below_min_coverage(self) -> bool:
        return self.min_coverage is not None and self.coverage < self.min_coverage


@dataclass
class PowerEvidence:
    """What the power table says a check of this size could have detected (power.power_table)."""

    detectable: dict[str, bool]  # power gap type -> detected at some tested size with probability >= target
    reliable: bool = True  # False: the uninjected control already reaches the target (held-out episodes differ)
    held_out_episodes: int = 0  # real episodes the thresholds and the power rest on
    required: tuple[str, ...] = ()  # the types a pass needs power on (gate `require_power`, default all that apply)
    ending: bool = False  # the ending row's best case reaches its level (endings.EndingPower; False: not judged)

    @property
    def measured(self) -> bool:
        """The power table was measured (the ending row's power is this check's own, not the table's)."""
        return bool(self.detectable)

    @property
    def missing(self) -> tuple[str, ...]:
        """Required types the check could not have seen: of the power table's, all of them when it
        was not measured or its control is unreliable, else those detected at no tested size; the
        ending where its best case does not reach its level."""
        return tuple(g for g in self.required if not self._seen(g))

    def _seen(self, g: str) -> bool:
        if g == "ending":
            return self.ending
        return self.measured and self.reliable and self.detectable.get(g, False)


@dataclass
class CheckEvidence:
    divergence: DivergenceEvidence  # the checked data as they are
    gaps: dict[str, GapEvidence]  # config.ROW_GAPS: the dynamics-family tests, "ending" and "visual"
    distribution: DistributionEvidence | None = None
    corrected: DivergenceEvidence | None = None  # the same tests after the corrections of the gaps that fired
    policy_gate_passed: bool | None = None  # None: no policy was run
    power: PowerEvidence | None = None  # None: not evaluated (the power table's own replicates)
    model_quality: Competence | None = None  # the quality card's competence rule; None: no card (older run)
    policy_shift: PolicyShift | None = None  # None: not tested (no commands, or the power table's replicates)

    def __post_init__(self) -> None:
        missing = [g for g in ROW_GAPS if g not in self.gaps]
        assert not missing, f"CheckEvidence needs every gap test, missing {missing}"
