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

from wmcheck.scripts.errors import UserError

SCORES = ("divergence", "nll", "kl")  # the tests behind `divergent`
COMPETENCE = ("support", "disagreement")  # the tests behind `unverifiable`
POLICY_GATE_DEFAULTS = {"min_episodes": 1000, "min_success_rate": 0.85}
"""Field practice before hardware time: >= 1,000 simulator episodes across the task distribution,
simulator success rate >= 85%."""
GAPS = ("visual", "latency", "actuator", "sensor_noise", "dynamics", "distribution")
DYNAMICS_GAPS = ("latency", "actuator", "sensor_noise", "dynamics")
"""The attribution's gap tests; each one found present fails a check."""


def split_alpha(alpha: float) -> tuple[float, float]:
    """The false-alarm budget of a check, split: (level of the divergence tests, level of each gap
    test). Half goes to the divergence tests (per-episode and pooled), half to the four gap tests
    (alpha / 8 each). Checks and the power table that predicts them both use this."""
    return alpha / 2, alpha / 2 / len(DYNAMICS_GAPS)


@dataclass
class CheckConfig:
    alpha: float = 0.05
    """False-alarm budget per checked run: half for the divergence tests (union bound over scores,
    episodes and the pooled test), half for the four gap tests (alpha / 8 each); see check.py."""
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

    def __post_init__(self) -> None:
        for name in ("gain_grid", "offset_grid", "deadband_grid"):
            setattr(self, name, tuple(float(v) for v in getattr(self, name)))
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.context < 1 or self.horizon < 2:
            raise ValueError("context must be >= 1 and horizon >= 2")
        if 1.0 not in self.gain_grid or 0.0 not in self.offset_grid or 0.0 not in self.deadband_grid:
            raise ValueError("the grids must contain the identity (gain 1, offset 0, deadband 0)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CheckConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Gate:
    """A team's release gate. Every field is optional; absent fields use the calibration.

    alpha:              overrides the false-alarm budget
    score_alpha:        {score: alpha} per score (divergence, nll, kl, support, disagreement)
    tolerances:         per gap, how big a gap may be and still pass (amber, not red):
                        latency: {max_steps}, actuator: {max_gain_error, max_offset}, sensor_noise:
                        {max_ratio, max_bias}, distribution: {min_coverage}, visual:
                        {max_distance_ratio, max_clip_distance}
    allow_unverifiable: let unverifiable episodes pass (exit 0) — the report still says so
    policy:             {min_episodes, min_success_rate} for closed-loop policy checks (`--policy`):
                        a policy check with fewer simulator episodes or a lower simulator success
                        rate fails; defaults 1000 / 0.85
    """

    alpha: float | None = None
    score_alpha: dict[str, float] = field(default_factory=dict)
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)
    allow_unverifiable: bool = False
    policy: dict[str, float] = field(default_factory=lambda: dict(POLICY_GATE_DEFAULTS))
    source: str = "defaults"

    @classmethod
    def load(cls, path: str | Path) -> "Gate":
        path = Path(path)
        if not path.exists():
            raise UserError(f"gate file {path} does not exist", "commit a gate file (see `wmcheck check --help`) or drop --gate")
        try:
            text = path.read_text()
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text) or {}
        except Exception as exc:
            raise UserError(f"cannot parse gate file {path}: {exc}", "fix its YAML/JSON syntax") from None
        if not isinstance(data, dict):
            raise UserError(f"gate file {path} must hold a mapping", "write keys such as alpha:, tolerances:, allow_unverifiable:")
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        unknown = set(data) - known
        if unknown:
            raise UserError(f"gate file {path} has unknown keys {sorted(unknown)}", f"use only {sorted(known)}")
        bad_scores = set(data.get("score_alpha", {})) - set(SCORES + COMPETENCE)
        bad_gaps = set(data.get("tolerances", {})) - set(GAPS)
        if bad_scores or bad_gaps:
            raise UserError(f"gate file {path}: unknown scores {sorted(bad_scores)} / gaps {sorted(bad_gaps)}",
                            f"scores are {SCORES + COMPETENCE}; gaps are {GAPS}")
        if "policy" in data:
            data["policy"] = validate_gate_policy(data["policy"], f"gate file {path}")
        gate = cls(**data)
        gate.source = str(path)
        for name, a in [("alpha", gate.alpha), *gate.score_alpha.items()]:
            if a is not None and not 0 < float(a) < 1:
                raise UserError(f"gate file {path}: {name} must be in (0, 1), got {a}", "use a probability such as 0.05")
        return gate


def validate_gate_policy(policy, where: str) -> dict:
    """The gate file's `policy:` mapping, checked: {min_episodes: int >= 1, min_success_rate: [0, 1]}."""
    if not isinstance(policy, dict):
        raise UserError(f"{where}: policy must be a mapping", "write policy: {min_episodes: 1000, min_success_rate: 0.85}")
    unknown = set(policy) - set(POLICY_GATE_DEFAULTS)
    if unknown:
        raise UserError(f"{where}: unknown policy keys {sorted(unknown)}", f"use {sorted(POLICY_GATE_DEFAULTS)}")
    out = {**POLICY_GATE_DEFAULTS, **policy}
    m, r = out["min_episodes"], out["min_success_rate"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or m < 1 or int(m) != m:
        raise UserError(f"{where}: policy.min_episodes must be a whole number >= 1, got {m!r}", "e.g. min_episodes: 1000")
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
        raise UserError(f"{where}: policy.min_success_rate must be in [0, 1], got {r!r}", "e.g. min_success_rate: 0.85")
    return {"min_episodes": int(m), "min_success_rate": float(r)}
