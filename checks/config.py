"""Configuration of calibration and checks (`CheckConfig`) and the gate file a team commits.

Defaults follow practice, not our tests: alpha 0.05 false alarms per checked run; blocks of 16
context + 48 imagined steps; latency searched over +-4 steps; actuator gains from 0.5x to 2x.
A gate file (YAML/JSON, committed before the check) overrides alpha per score and sets
tolerances per gap; see `Gate`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.windows import fitted_geometry

SCORES = ("divergence", "nll", "kl")  # the tests behind `divergent`
COMPETENCE = ("support", "disagreement")  # the tests behind `unverifiable`
POLICY_GATE_DEFAULTS = {"min_episodes": 1000, "min_success_rate": 0.85}
"""Field practice before hardware time: >= 1,000 simulator episodes across the task distribution,
simulator success rate >= 85%."""
GAPS = ("visual", "latency", "actuator", "sensor_noise", "dynamics", "ending", "distribution")
POWER_GAPS = (
    "latency",
    "actuator",
    "sensor_noise",
    "sensor_bias",
    "obs_scale",
    "smoothing",
    "motion_larger",
    "motion_smaller",
)
"""The gap types the power table injects (power.POWER_SIZES), which a pass needs power on."""
POWERED_GAPS = POWER_GAPS + ("ending",)
"""What a pass needs power on: the power table's types, and the ending row's best case in the check
(endings.EndingPower); the names `require_power` accepts."""
DYNAMICS_GAPS = ("latency", "actuator", "sensor_noise", "dynamics")
"""The attribution's gap tests through the model; each one found present fails a check."""
GAP_TESTS = (*DYNAMICS_GAPS, "ending")
"""The gap tests that share half of alpha (the ending test compares how episodes end)."""
ROW_GAPS = (*GAP_TESTS, "visual")
"""Every gap row the decision reads from a `GapEvidence` (distribution has its own evidence)."""


def split_alpha(alpha: float) -> tuple[float, float]:
    """The false-alarm budget of a check, split: (level of the divergence tests, level of each gap
    test). Half goes to the divergence tests (per-episode and pooled), half to the five gap tests
    (GAP_TESTS, alpha / 10 each). Checks and the power table that predicts them both use this."""
    return alpha / 2, alpha / 2 / len(GAP_TESTS)


@dataclass
class CheckConfig:
    alpha: float = 0.05
    """False-alarm budget per checked run: half for the divergence tests (union bound over scores,
    episodes and the pooled test), half for the five gap tests (alpha / 10 each); see decision.py."""
    context: int = 16
    """Steps observed before imagining (the reference's report protocol)."""
    horizon: int = 48
    """Steps imagined per block; a block is context + horizon consecutive steps."""
    samples: int = 16
    """Open-loop latent samples per block (predictive bands and standardised errors)."""
    max_delay: int = 4
    """Latency search range in steps (both directions)."""
    gain_grid: tuple[float, ...] = (0.5, 0.63, 0.8, 0.9, 1.0, 1.12, 1.25, 1.6, 2.0)
    offset_grid: tuple[float, ...] = (-1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0)
    """Action offsets in units of each channel's training std."""
    deadband_grid: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5)
    """Deadbands in units of each channel's training std."""
    bootstrap: int = 400
    competence_alpha: float = 0.01
    """A block whose support/disagreement conformal p-value is below this is outside the model's
    competence: it is excluded from the divergence tests and counted as unverifiable."""
    support_refs: int = 2048
    """Training latents kept as the support reference."""
    power_target: float = 0.9
    seed: int = 0
    attribution: str = "fit"
    """How latency and actuator gaps are found: "fit" (checks/sysid.py: the corrections' score test
    and one joint differentiable fit, the default) or "grid" (the grid searches of attribution.py,
    kept for one release as a fallback; the gain, offset and deadband grids also bound the fit's box)."""

    def __post_init__(self) -> None:
        for name in ("gain_grid", "offset_grid", "deadband_grid"):
            setattr(self, name, tuple(float(v) for v in getattr(self, name)))
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.context < 1 or self.horizon < 2:
            raise ValueError("context must be >= 1 and horizon >= 2")
        if self.attribution not in ("fit", "grid"):
            raise ValueError(f"attribution must be 'fit' or 'grid', got {self.attribution!r}")
        if 1.0 not in self.gain_grid or 0.0 not in self.offset_grid or 0.0 not in self.deadband_grid:
            raise ValueError("the grids must contain the identity (gain 1, offset 0, deadband 0)")

    def fitted_to(self, steps: list[int]) -> tuple[CheckConfig, str | None]:
        """The geometry the held-out real episodes allow, and a note when it differs from this one.

        When the median held-out episode (`steps`: each episode's observations, actions + 1) is
        shorter than context + horizon, the horizon shrinks so that a block fits it, down to
        MIN_HORIZON, and then the context, down to MIN_CONTEXT (datasets.windows.fitted_geometry).
        Without this every block of such a log was skipped, and calibration ended with "held-out
        episodes too short": Pendulum cut at 50 steps, or a hopper that falls within 15 steps.
        Shorter held-out episodes than the block are still skipped, as are shorter checked ones
        (their endings are checked on their own)."""
        context, horizon = fitted_geometry(steps, self.context, self.horizon)
        if (context, horizon) == (self.context, self.horizon):
            return self, None
        fitted = dataclasses.replace(self, context=context, horizon=horizon)
        return fitted, (
            f"the held-out episodes' median length is {int(np.median(steps))} steps, shorter than a block of "
            f"{self.context} + {self.horizon}: checks imagine {horizon} steps after {context} observed"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CheckConfig:
        """Strict: an unknown key (a misspelt or a newer config) is an error, not a silent default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(
                f"check config has unknown keys {unknown}",
                f"accepted keys: {sorted(names)}; re-run `wmcheck calibrate`",
            )
        return cls(**d)


def _number(where: str, key: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise UserError(f"{where}: {key} must be a number >= {minimum:g}, got {value!r}", f"e.g. {key}: 1")
    return float(value)


class _Tolerance:
    """A gap's tolerance: every field optional (None = not tolerated on that aspect)."""

    @classmethod
    def from_dict(cls, data, where: str):
        known = [f.name for f in dataclasses.fields(cls)]
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"{where} must be a mapping", f"write e.g. {{{known[0]}: 1}}" if known else "write {}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UserError(
                f"{where} has unknown keys {unknown}",
                f"accepted keys: {known}" if known else "this gap has no tolerances; remove it",
            )
        return cls(**{k: _number(where, k, v) for k, v in data.items()})


@dataclass
class LatencyTolerance(_Tolerance):
    max_steps: float | None = None
    """Largest |estimated delay| in steps that still passes."""

    def covers(self, steps: float) -> bool:
        return self.max_steps is not None and abs(steps) <= self.max_steps


@dataclass
class ActuatorTolerance(_Tolerance):
    max_gain_error: float | None = None
    """Largest |gain - 1| of a gain correction that still passes."""
    max_offset: float | None = None
    """Largest |offset| (command units) of an offset correction that still passes."""

    def covers(self, kind: str, value: float) -> bool:
        if kind == "gain":
            return self.max_gain_error is not None and abs(value - 1) <= self.max_gain_error
        if kind == "offset":
            return self.max_offset is not None and abs(value) <= self.max_offset
        return False  # no deadband tolerance


@dataclass
class SensorNoiseTolerance(_Tolerance):
    max_ratio: float | None = None
    """Largest noise ratio (checked / real residual std, either way: 1/r for r < 1) that still passes."""
    max_bias: float | None = None
    """Largest |bias| of the one-step residuals, in the channel's units, that still passes."""

    def covers(self, ratio: float, bias: float) -> bool:
        """Every bound the gate gives holds on the worst channel (at least one must be given)."""
        bounds = []
        if self.max_ratio is not None:
            bounds.append(max(ratio, 1 / max(ratio, 1e-9)) <= self.max_ratio)
        if self.max_bias is not None:
            bounds.append(abs(bias) <= self.max_bias)
        return bool(bounds) and all(bounds)


@dataclass
class DynamicsTolerance(_Tolerance):
    """No tolerance: a dynamics gap is always red (its size has no one number to bound)."""


@dataclass
class DistributionTolerance(_Tolerance):
    min_coverage: float | None = None
    """Binding minimum share of checked steps inside the real logs' support: below it the run fails."""


@dataclass
class VisualTolerance(_Tolerance):
    max_distance_ratio: float | None = None
    """Largest checked/real embedding distance ratio that still passes."""
    max_clip_distance: float | None = None
    """Largest CLIP mean cosine distance that still passes (needs --clip-model)."""

    def covers(self, distance_ratio: float, clip_distance: float | None) -> bool:
        within = [distance_ratio <= self.max_distance_ratio] if self.max_distance_ratio is not None else []
        if self.max_clip_distance is not None:
            within.append(clip_distance is not None and clip_distance <= self.max_clip_distance)
        return bool(within) and all(within)


TOLERANCE_TYPES = {
    "latency": LatencyTolerance,
    "actuator": ActuatorTolerance,
    "sensor_noise": SensorNoiseTolerance,
    "dynamics": DynamicsTolerance,
    "distribution": DistributionTolerance,
    "visual": VisualTolerance,
}


@dataclass
class Tolerances:
    """The gate's `tolerances:` per gap (see each type for its keys)."""

    latency: LatencyTolerance = field(default_factory=LatencyTolerance)
    actuator: ActuatorTolerance = field(default_factory=ActuatorTolerance)
    sensor_noise: SensorNoiseTolerance = field(default_factory=SensorNoiseTolerance)
    dynamics: DynamicsTolerance = field(default_factory=DynamicsTolerance)
    distribution: DistributionTolerance = field(default_factory=DistributionTolerance)
    visual: VisualTolerance = field(default_factory=VisualTolerance)

    @classmethod
    def from_dict(cls, data, where: str = "gate tolerances") -> Tolerances:
        if isinstance(data, Tolerances):
            return data
        if not isinstance(data, dict):
            raise UserError(f"{where} must be a mapping of gap -> tolerance", f"gaps are {list(TOLERANCE_TYPES)}")
        unknown = sorted(set(data) - set(TOLERANCE_TYPES))
        if unknown:
            raise UserError(f"{where} has unknown gaps {unknown}", f"gaps are {list(TOLERANCE_TYPES)}")
        return cls(**{g: TOLERANCE_TYPES[g].from_dict(v, f"{where}.{g}") for g, v in data.items()})


@dataclass
class Gate:
    """A team's release gate. Every field is optional; absent fields use the calibration.

    alpha:              overrides the false-alarm budget
    score_alpha:        {score: alpha} per score (divergence, nll, kl, support, disagreement)
    tolerances:         per gap, how big a gap may be and still pass (amber, not red):
                        latency: {max_steps}, actuator: {max_gain_error, max_offset}, sensor_noise:
                        {max_ratio, max_bias}, distribution: {min_coverage} (binding: below it the run
                        fails), visual: {max_distance_ratio, max_clip_distance}
    allow_unverifiable: let unverifiable episodes pass (exit 0) — the report still says so
    require_power:      the gap types a pass needs power on (default: every type of the power table
                        that applies: latency (with command or input channels), actuator (with
                        command channels), sensor_noise, sensor_bias, obs_scale, smoothing,
                        motion_larger and motion_smaller (the dynamics row's), and ending (its
                        best case in this check, endings.EndingPower)); a run that
                        finds nothing but could not have seen a required type is `inconclusive`
                        (exit 3). Listing fewer accepts a partial pass.
    policy:             {min_episodes, min_success_rate} for closed-loop policy checks (`--policy`).
                        Keys set here are binding: fewer simulator episodes, or a lower (or unknown)
                        success rate, fail. Keys left out take the defaults 1000 / 0.85: a lower
                        success rate fails where success is defined (else "not evaluated"), too few
                        episodes is a warning with the power they buy (`policy_check.policy_gate`)
    Unknown or misspelt keys, and values of the wrong type, are errors (exit 2): a silently ignored
    key would change pass / fail in CI.
    """

    alpha: float | None = None
    score_alpha: dict[str, float] = field(default_factory=dict)
    tolerances: Tolerances = field(default_factory=Tolerances)
    allow_unverifiable: bool = False
    require_power: list[str] | None = None
    policy: dict[str, float] = field(default_factory=dict)  # the keys the gate file sets (binding)
    source: str = "defaults"

    def __post_init__(self) -> None:
        where = "gate" if self.source == "defaults" else f"gate file {self.source}"
        self.tolerances = Tolerances.from_dict(self.tolerances, f"{where}: tolerances")
        if not isinstance(self.allow_unverifiable, bool):
            raise UserError(
                f"{where}: allow_unverifiable must be true or false, got {self.allow_unverifiable!r}",
                "write allow_unverifiable: false",
            )
        if not isinstance(self.score_alpha, dict):
            raise UserError(f"{where}: score_alpha must be a mapping", "write score_alpha: {divergence: 0.01}")
        bad_scores = sorted(set(self.score_alpha) - set(SCORES + COMPETENCE))
        if bad_scores:
            raise UserError(
                f"{where}: unknown scores {bad_scores} in score_alpha", f"scores are {list(SCORES + COMPETENCE)}"
            )
        for name, a in [("alpha", self.alpha), *self.score_alpha.items()]:
            if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < float(a) < 1):
                raise UserError(f"{where}: {name} must be in (0, 1), got {a!r}", "use a probability such as 0.05")
        self.policy = validate_gate_policy(self.policy, where)
        if self.require_power is not None:
            rp = self.require_power
            if not isinstance(rp, list) or not all(isinstance(g, str) for g in rp) or set(rp) - set(POWERED_GAPS):
                raise UserError(
                    f"{where}: require_power must be a list of gap types from {list(POWERED_GAPS)}, got {rp!r}",
                    "e.g. require_power: [sensor_noise, sensor_bias]",
                )

    def policy_requirement(self, key: str) -> float:
        """policy.<key> as the gate file sets it, else its default."""
        return {**POLICY_GATE_DEFAULTS, **self.policy}[key]

    @classmethod
    def load(cls, path: str | Path) -> Gate:
        path = Path(path)
        if not path.is_file():
            raise UserError(
                f"gate file {path} does not exist", "commit a gate file (see `wmcheck check --help`) or drop --gate"
            )
        try:
            data = _read_mapping_file(path)
        except Exception as exc:
            raise UserError(f"cannot parse gate file {path}: {exc}", "fix its YAML/JSON syntax") from None
        if not isinstance(data, dict):
            raise UserError(
                f"gate file {path} must hold a mapping", "write keys such as alpha:, tolerances:, allow_unverifiable:"
            )
        return cls.from_mapping(data, str(path))

    @classmethod
    def from_mapping(cls, data: dict, source: str) -> Gate:
        """A gate from its keys (a parsed gate file, or a dict from Python); unknown keys are errors."""
        known = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UserError(f"gate file {source} has unknown keys {unknown}", f"accepted keys: {known}")
        return cls(**data, source=source)


def _read_mapping_file(path: Path):
    """YAML or JSON (by suffix) with every mapping's keys unique and no structure that contains itself
    (a recursive YAML alias): a gate file is a committed decision, so a key given twice is an error,
    not "the last one wins"."""
    text = path.read_text()

    def unique(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"key {k!r} is given twice")
            out[k] = v
        return out

    if path.suffix.lower() == ".json":
        return json.loads(text, object_pairs_hook=unique)
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node):
        loader.flatten_mapping(node)  # merge keys (<<) first, as SafeLoader does
        return unique(
            (loader.construct_object(k, deep=True), loader.construct_object(v, deep=True)) for k, v in node.value
        )

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    data = yaml.load(text, Loader=Loader) or {}  # noqa: S506 (a SafeLoader subclass)

    def acyclic(x, seen=()):
        if isinstance(x, (list, dict)):
            if id(x) in seen:
                raise ValueError("a YAML alias refers to itself (a recursive structure)")
            for v in x.values() if isinstance(x, dict) else x:
                acyclic(v, (*seen, id(x)))

    acyclic(data)
    return data


def validate_gate_policy(policy, where: str) -> dict:
    """The gate file's `policy:` mapping, checked: {min_episodes: int >= 1, min_success_rate: [0, 1]}.
    Only the keys it sets are returned (they bind); absent keys default in `Gate.policy_requirement`."""
    if policy is None:
        policy = {}
    if not isinstance(policy, dict):
        raise UserError(
            f"{where}: policy must be a mapping", "write policy: {min_episodes: 1000, min_success_rate: 0.85}"
        )
    unknown = set(policy) - set(POLICY_GATE_DEFAULTS)
    if unknown:
        raise UserError(f"{where}: unknown policy keys {sorted(unknown)}", f"use {sorted(POLICY_GATE_DEFAULTS)}")
    out = {**POLICY_GATE_DEFAULTS, **policy}
    m, r = out["min_episodes"], out["min_success_rate"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or m < 1 or int(m) != m:
        raise UserError(
            f"{where}: policy.min_episodes must be a whole number >= 1, got {m!r}", "e.g. min_episodes: 1000"
        )
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
        raise UserError(f"{where}: policy.min_success_rate must be in [0, 1], got {r!r}", "e.g. min_success_rate: 0.85")
    return {k: int(m) if k == "min_episodes" else float(r) for k in policy}
