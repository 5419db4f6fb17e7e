"""In-memory episode and log metadata: the types every reader, writer and importer shares.

An `Episode` holds one episode in the log format's row convention (see log-format.md):
`observations` has N+1 rows, `actions`/`inputs`/`rewards`/`terminations`/`truncations` N rows,
`timestamps` N+1 rows. Extra observation groups (e.g. camera frames) live in `obs_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FORMAT_NAME = "wmcheck-log"
FORMAT_VERSION = 1
SOURCES = ("real", "sim", "policy")


@dataclass
class LogMeta:
    """File-level attributes of a log (all optional when reading a plain Minari file)."""

    source: str = "real"
    """What produced the log: "real" | "sim" | "policy"."""
    dt: float | None = None
    """Step period in seconds; None when unknown (e.g. a plain Minari file)."""
    observation_names: list[str] = field(default_factory=list)
    """Channel names in column order of `observations` (or `observations/state`)."""
    action_names: list[str] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    """Exogenous, measured inputs (wind speed, ambient temperature, ...), conditioned on like actions."""
    units: dict[str, str] = field(default_factory=dict)
    """{channel name: unit string}."""
    env_id: str | None = None
    """The registered gymnasium id a recorded log came from (`wmcheck record`); None otherwise."""
    env_kwargs: dict | None = None
    """The keyword arguments that env was made with (JSON-serialisable), when not the defaults."""
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.dt is not None and not (self.dt > 0):
            raise ValueError(f"dt must be a positive number of seconds, got {self.dt!r}")


@dataclass
class Episode:
    """One episode: N steps, N+1 observation rows."""

    observations: np.ndarray  # (N+1, D) float32 — the vector state (or `state` group key)
    actions: np.ndarray  # (N, A) float32 — command chosen at observation t
    inputs: np.ndarray | None = None  # (N, E) float32 — exogenous inputs acting during step t
    rewards: np.ndarray | None = None  # (N,) float32 — absent = zeros
    terminations: np.ndarray | None = None  # (N,) bool — absent = all False
    truncations: np.ndarray | None = None  # (N,) bool — absent = last step True
    timestamps: np.ndarray | None = None  # (N+1,) float64 seconds
    obs_groups: dict[str, np.ndarray] = field(default_factory=dict)  # extra keys, e.g. image (N+1,H,W,C) uint8
    id: int = 0
    seed: int | None = None
    name: str | None = None  # e.g. the machine this episode came from ("R80711"); stored as an attr
    proposed_actions: np.ndarray | None = None  # (N, A) float32 — shadow mode: the candidate policy's
    # proposal at observation t, while `actions` holds what the acting (baseline) controller applied

    @property
    def num_steps(self) -> int:
        return int(self.actions.shape[0])

    def input_array(self) -> np.ndarray:
        """Exogenous inputs as float32 (N, E); (N, 0) when the episode has none."""
        n = self.num_steps
        return np.zeros((n, 0), np.float32) if self.inputs is None else self.inputs.astype(np.float32)

    def reward_array(self) -> np.ndarray:
        n = self.num_steps
        return np.zeros(n, np.float32) if self.rewards is None else self.rewards.astype(np.float32)

    def termination_array(self) -> np.ndarray:
        n = self.num_steps
        return np.zeros(n, bool) if self.terminations is None else self.terminations.astype(bool)

    def truncation_array(self) -> np.ndarray:
        n = self.num_steps
        if self.truncations is not None:
            return self.truncations.astype(bool)
        out = np.zeros(n, bool)
        if n and not self.termination_array()[-1]:
            out[-1] = True
        return out
