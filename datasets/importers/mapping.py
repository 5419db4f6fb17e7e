"""How a table of user data maps onto a log: the `ImportMapping` config and its file/flag loading.

An `ImportMapping` names the time and machine columns, which columns are observations, actions
(commands) and exogenous inputs, and how to clean them: valid ranges and sentinel values become
missing, short gaps are linearly interpolated, longer ones split the episode, short pieces are
dropped. It is loaded from a small YAML or JSON file (`--mapping FILE`); command-line flags
override the file's values (`merge_overrides`). Every field is checked in `__post_init__`, and a bad
value raises `UserError` saying how to fix it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmcheck.datasets.episode import SOURCES
from wmcheck.datasets.errors import UserError

STEP_VALUES = ("start", "end")


@dataclass
class ImportMapping:
    """Column roles and cleaning rules for importing a table (CSV, Parquet, npz columns)."""

    obs_cols: list[str] = field(default_factory=list)
    """Observation channels, in column order of `observations`. At least one."""
    action_cols: list[str] = field(default_factory=list)
    """Commands chosen by the controller/operator (may be empty for a passively observed system)."""
    input_cols: list[str] = field(default_factory=list)
    """Exogenous, measured inputs (wind speed, ambient temperature, ...)."""
    time_col: str | None = None
    """Timestamps: ISO 8601 strings (any UTC offset, converted to UTC epoch seconds) or numeric
    seconds. None: rows are equally spaced in file order and `dt` must be given."""
    episode_col: str | None = None
    """Machine/run identifier (string or number). Each distinct value becomes its own episode(s),
    numbered in order of first appearance; the value is stored as the episode name. None: one run."""
    source: str = "real"
    """What produced the data: "real" | "sim" | "policy"."""
    dt: float | None = None
    """Step period in seconds. None: inferred as the median time step of the data."""
    units: dict[str, str] = field(default_factory=dict)
    """{channel: unit string}, written to the log's `units` attribute."""
    valid_ranges: dict[str, list[float | None]] = field(default_factory=dict)
    """{column: [lo, hi]}: values outside [lo, hi] become missing (None = unbounded on that side)."""
    sentinels: dict[str, list[float]] = field(default_factory=dict)
    """{column: [values]}: fault/placeholder codes that become missing (matched to 6 significant
    digits, since exports often print float32 values such as -273.20001 for -273.2)."""
    max_interp_gap: int = 3
    """Gaps of up to this many consecutive missing steps (missing rows or missing values) are
    linearly interpolated between the valid neighbours; longer gaps split the episode. 0: never."""
    split_gap: float | None = None
    """Seconds. Two consecutive rows further apart than this always split the episode, even when
    interpolation could bridge the gap. None: only the `max_interp_gap` rule splits."""
    min_episode_steps: int = 10
    """Pieces with fewer steps than this (after splitting) are dropped and counted."""
    max_episode_steps: int | None = None
    """Long pieces are cut into consecutive episodes of at most this many steps (e.g. 1008 = one
    week of 10-minute data), so a held-out split and a check see several episodes; a remainder
    shorter than `min_episode_steps` joins the previous episode. None: never cut."""
    resample: bool = False
    """False: each row is snapped to the nearest point of the dt grid (for loggers that write on a
    fixed period). True: every column is linearly interpolated onto the grid (irregular loggers)."""
    step_values: str = "start"
    """Which row's actions/inputs act during step t (obs row t -> obs row t+1). "start": row t,
    the command sampled when obs t was seen (sampled-data control logs). "end": row t+1, for
    interval averages logged together with their outcome (SCADA 10-minute means)."""
    timezone: str = "UTC"
    """IANA zone (e.g. "Europe/Paris") for timestamps written without a UTC offset."""
    delimiter: str | None = None
    """CSV field delimiter; None: detected from the header line (one of , ; tab |)."""

    def __post_init__(self) -> None:
        for name in ("obs_cols", "action_cols", "input_cols"):
            setattr(self, name, _as_name_list(getattr(self, name), name))
        if not self.obs_cols:
            raise UserError(
                "the import mapping names no observation columns",
                "give --obs-cols a,b (or `obs_cols: [a, b]` in the mapping file)",
            )
        roles = {c: "obs_cols" for c in self.obs_cols}
        for role in ("action_cols", "input_cols"):
            for c in getattr(self, role):
                if c in roles:
                    raise UserError(
                        f"column {c!r} is listed both in {roles[c]} and {role}",
                        "each column has one role: observation, action (chosen) or input (measured)",
                    )
                roles[c] = role
        for key in ("time_col", "episode_col"):
            c = getattr(self, key)
            if c is not None and c in roles:
                raise UserError(f"column {c!r} is both {key} and one of {roles[c]}", "give it one role")
        if self.time_col is not None and self.time_col == self.episode_col:
            raise UserError(f"time_col and episode_col are both {self.time_col!r}", "give two columns")
        if self.source not in SOURCES:
            raise UserError(
                f"source must be one of {SOURCES}, got {self.source!r}",
                "use --source real for measured logs, sim for simulator rollouts",
            )
        if self.dt is not None:
            self.dt = _positive(self.dt, "dt", "give the step period in seconds, e.g. --dt 600")
        if self.time_col is None and self.dt is None:
            raise UserError(
                "without a time column the step period is unknown",
                "give --time-col NAME, or --dt SECONDS for equally spaced rows",
            )
        if self.time_col is None and self.resample:
            raise UserError("resample needs a time column", "give --time-col NAME or drop resample")
        if isinstance(self.max_interp_gap, bool) or not isinstance(self.max_interp_gap, int) or self.max_interp_gap < 0:
            raise UserError(
                f"max_interp_gap must be a whole number of steps >= 0, got {self.max_interp_gap!r}",
                "e.g. --max-interp-gap 3 interpolates gaps of up to 3 missing steps",
            )
        if self.split_gap is not None:
            self.split_gap = _positive(self.split_gap, "split_gap", "give seconds, e.g. --split-gap 3600")
        if (
            isinstance(self.min_episode_steps, bool)
            or not isinstance(self.min_episode_steps, int)
            or self.min_episode_steps < 1
        ):
            raise UserError(
                f"min_episode_steps must be a whole number >= 1, got {self.min_episode_steps!r}",
                "e.g. min_episode_steps: 36 keeps pieces of at least 36 steps",
            )
        if self.max_episode_steps is not None and (
            isinstance(self.max_episode_steps, bool)
            or not isinstance(self.max_episode_steps, int)
            or self.max_episode_steps < self.min_episode_steps
        ):
            raise UserError(
                f"max_episode_steps must be a whole number >= min_episode_steps "
                f"({self.min_episode_steps}), got {self.max_episode_steps!r}",
                "e.g. max_episode_steps: 1008 cuts 10-minute data into weeks",
            )
        if self.step_values not in STEP_VALUES:
            raise UserError(
                f"step_values must be one of {STEP_VALUES}, got {self.step_values!r}",
                '"start" for sampled commands, "end" for interval averages',
            )
        if self.delimiter is not None and len(self.delimiter) != 1:
            raise UserError(f"delimiter must be one character, got {self.delimiter!r}", "e.g. delimiter: ';'")
        self._check_timezone()
        self.valid_ranges = {str(k): self._range(k, v) for k, v in dict(self.valid_ranges).items()}
        self.sentinels = {str(k): self._sentinels(k, v) for k, v in dict(self.sentinels).items()}
        self.units = {str(k): str(v) for k, v in dict(self.units).items()}

    def check_rule_columns(self) -> None:
        """Ranges, sentinels and units must name mapped channels (a typo would silently skip a rule).
        Called after the source's columns are checked, so a misspelt --obs-cols is reported first."""
        channels = self.value_cols
        for what, d in (("valid_ranges", self.valid_ranges), ("sentinels", self.sentinels), ("units", self.units)):
            for col in d:
                if col not in channels:
                    raise UserError(
                        f"{what} names {col!r}, which is not an observation, action or input column",
                        f"use one of: {', '.join(channels)} (check the spelling)",
                    )

    @property
    def value_cols(self) -> list[str]:
        """All channel columns in log order: observations, actions, inputs."""
        return [*self.obs_cols, *self.action_cols, *self.input_cols]

    @property
    def needed_cols(self) -> list[str]:
        """Every column the import reads from the source."""
        extra = [c for c in (self.episode_col, self.time_col) if c is not None]
        return [*extra, *self.value_cols]

    def _check_timezone(self) -> None:
        if self.timezone.upper() == "UTC":
            return
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise UserError(
                f"unknown time zone {self.timezone!r}", 'give an IANA name such as "Europe/Paris" or "UTC"'
            ) from None

    @staticmethod
    def _range(col: str, value: Any) -> list[float]:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise UserError(
                f"valid range for {col!r} must be [lo, hi], got {value!r}",
                f"e.g. --valid-range {col}=-40:50 (leave a side empty for no bound)",
            )
        lo = -math.inf if value[0] is None else _number(value[0], f"valid range low of {col!r}")
        hi = math.inf if value[1] is None else _number(value[1], f"valid range high of {col!r}")
        if not lo < hi:
            raise UserError(f"valid range for {col!r} is empty: [{lo}, {hi}]", "give lo < hi")
        return [lo, hi]

    @staticmethod
    def _sentinels(col: str, value: Any) -> list[float]:
        values = value if isinstance(value, (list, tuple)) else [value]
        return [_number(v, f"sentinel of {col!r}") for v in values]


def _number(v: Any, what: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a number, got {v!r}", "write plain numbers, e.g. -273.2") from None
    if math.isnan(x):
        raise UserError(f"{what} is NaN", "empty and NaN cells are always treated as missing; drop it")
    return x


def _positive(v: Any, name: str, fix: str) -> float:
    x = _number(v, name)
    if not (x > 0 and math.isfinite(x)):
        raise UserError(f"{name} must be a positive number of seconds, got {v!r}", fix)
    return x


def _as_name_list(v: Any, name: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [s.strip() for s in v.split(",") if s.strip()]
    if isinstance(v, (list, tuple)):
        return [str(s).strip() for s in v]
    raise UserError(
        f"{name} must be a list of column names, got {v!r}", f"e.g. {name}: [a, b] or --{name.replace('_', '-')} a,b"
    )


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ImportMapping))


def read_mapping_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or JSON mapping file into a dict of ImportMapping fields."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"mapping file {str(path)!r} does not exist", "check the --mapping path")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError: both carry line numbers
        raise UserError(
            f"cannot parse mapping file {str(path)!r}: {exc}", "fix the syntax (YAML for .yaml/.yml, JSON for .json)"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            f"mapping file {str(path)!r} must hold key: value pairs, got {type(data).__name__}",
            f"keys: {', '.join(FIELD_NAMES)}",
        )
    unknown = [k for k in data if k not in FIELD_NAMES]
    if unknown:
        raise UserError(
            f"mapping file {str(path)!r} has unknown keys: {', '.join(map(str, unknown))}",
            f"known keys: {', '.join(FIELD_NAMES)}",
        )
    return dict(data)


def build_mapping(file: str | Path | None = None, **overrides: Any) -> ImportMapping:
    """File values, then every override that is not None (dict overrides merge per column)."""
    values = read_mapping_file(file) if file is not None else {}
    for key, v in overrides.items():
        if key not in FIELD_NAMES:
            raise TypeError(f"unknown ImportMapping field {key!r}")
        if v is None:
            continue
        if isinstance(v, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **v}
        else:
            values[key] = v
    return ImportMapping(**values)


def parse_assignments(items: list[str] | None, flag: str, example: str) -> dict[str, str]:
    """`["col=value", ...]` from a repeated flag into {col: value}."""
    out: dict[str, str] = {}
    for item in items or []:
        col, sep, value = item.partition("=")
        if not sep or not col.strip():
            raise UserError(f"{flag} expects COLUMN=VALUE, got {item!r}", f"e.g. {flag} {example}")
        out[col.strip()] = value.strip()
    return out


def parse_ranges(items: list[str] | None) -> dict[str, list[float | None]]:
    """`--valid-range col=lo:hi` (either side may be empty) into {col: [lo, hi]}."""
    out: dict[str, list[float | None]] = {}
    for col, text in parse_assignments(items, "--valid-range", "Ot_avg=-40:50").items():
        lo, sep, hi = text.partition(":")
        if not sep:
            raise UserError(f"--valid-range {col}={text}: expected lo:hi", f"e.g. --valid-range {col}=-40:50")
        out[col] = [
            _number(lo, f"valid range low of {col!r}") if lo.strip() else None,
            _number(hi, f"valid range high of {col!r}") if hi.strip() else None,
        ]
    return out


def parse_sentinels(items: list[str] | None) -> dict[str, list[float]]:
    """`--sentinel col=value` (repeatable; several values per column accumulate)."""
    out: dict[str, list[float]] = {}
    for item in items or []:
        for col, text in parse_assignments([item], "--sentinel", "Ot_avg=-273.2").items():
            out.setdefault(col, []).append(_number(text, f"sentinel of {col!r}"))
    return out


@dataclass
class CopyOptions:
    """File attributes for sources already in log layout (Minari HDF5, log-layout npz).

    Empty name lists and None keep what the source says (or the generated obs_0.. names)."""

    source: str | None = None
    """"real" | "sim" | "policy"; None keeps the source's (a plain Minari file reads as "sim")."""
    dt: float | None = None
    """Step period in seconds; None keeps the source's (a plain Minari file has none)."""
    observation_names: list[str] = field(default_factory=list)
    action_names: list[str] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source is not None and self.source not in SOURCES:
            raise UserError(
                f"source must be one of {SOURCES}, got {self.source!r}",
                "use --source sim for simulator rollouts, policy for policy trajectories",
            )
        if self.dt is not None:
            self.dt = _positive(self.dt, "dt", "give the step period in seconds, e.g. --dt 0.05")
        for name in ("observation_names", "action_names", "input_names"):
            setattr(self, name, _as_name_list(getattr(self, name), name))
        self.units = {str(k): str(v) for k, v in dict(self.units).items()}

    def names(self, what: str, given: list[str], n: int, flag: str) -> list[str]:
        """The names to store for `what` ("observation", ...): ours if given (n of them), else `given`."""
        ours = getattr(self, f"{what}_names")
        if not ours:
            return list(given)
        if len(ours) != n:
            raise UserError(
                f"{flag} names {len(ours)} {what} channels but the data has {n}",
                f"give exactly {n} names in column order, or leave {flag} out for generated names",
            )
        return list(ours)
