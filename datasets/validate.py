"""Whole-file validation of a log: every problem at once, plus a per-channel summary.

`validate_log(path)` walks the file episode by episode, and each episode in blocks of rows, so
files (and single episodes) larger than memory are fine; only one episode's timestamps are held at
a time. It never stops at the first problem: each check appends a `Finding` and the walk goes on.

Findings (code — severity — rule):
- `no_episodes` — error — the file has no `episode_<id>` groups.
- `bad_attribute` — error — a file attribute (source, dt, units, ...) has an invalid value.
- `names_mismatch` — error — the name lists in the attributes do not match the data's columns.
- `missing_dataset` — error — observations, actions, terminations or truncations is absent
  (rewards, inputs, timestamps are optional).
- `bad_layout`, `bad_actions` — error — the structure does not map onto the format (see layout).
- `row_count` — error — observations (and each observation key) and timestamps need N+1 rows,
  inputs/rewards/terminations/truncations N rows, where N = rows of actions.
- `total_steps_mismatch` — error — the episode's `total_steps` attribute is not N.
- `dim_mismatch` / `dtype_mismatch` — error — an episode's columns, observation keys, per-step shapes
  or dtypes differ from the first episode's.
- `nonfinite` — error — NaN/inf values, counted per channel over the whole file (the message names
  the first episodes that hold them).
- `timestamps_not_increasing` — error — steps whose timestamp difference is <= 0.
- `irregular_dt` — warning — steps whose timestamp difference differs from the reference period by
  more than 1% (the file's `dt`, else the episode's median difference); counted per episode.
- `zero_steps` — warning — an episode with N = 0 (one observation, nothing to learn from).
- `early_termination` — warning — `terminations` is true before the last step.
- `id_mismatch` — warning — the `id` attribute differs from the number in the group name
  (the group name wins).
- `constant_channel` — warning — min == max over the whole file (it will be normalised with std 1).
- `saturated_channel` — warning — the channel looks clipped at a sensor/actuator limit: more than
  20% of its finite values sit exactly at its min (or at its max) while at least 10% lie strictly
  between min and max. The second condition keeps binary, one-hot and bang-bang channels (which
  only ever take their extreme values) from being reported.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import numpy as np

from wmcheck.datasets import layout as L
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.json_safe import json_safe
from wmcheck.datasets.logformat import PER_STEP, REQUIRED, open_h5

REPORT_VERSION = 1
SATURATION_AT_LIMIT = 0.20  # fraction of values at one limit that counts as saturated ...
SATURATION_INTERIOR = 0.10  # ... provided at least this fraction lies strictly between the limits
DT_TOLERANCE = 0.01  # relative deviation of a step's period that counts as irregular
BLOCK_ROWS = 65536  # rows read at a time


@dataclass
class Finding:
    severity: str  # "error" | "warning"
    code: str
    episode: int | None
    channel: str | None
    message: str

    def format(self) -> str:
        where = "".join(
            [
                f" episode {self.episode}" if self.episode is not None else "",
                f" [{self.channel}]" if self.channel else "",
            ]
        )
        return f"{self.severity:7s} {self.code}{where}: {self.message}"


@dataclass
class ChannelSummary:
    name: str
    min: float
    max: float
    mean: float
    count: int  # finite values
    nonfinite: int


@dataclass
class Summary:
    episodes: int = 0
    total_steps: int = 0
    source: str | None = None
    dt: float | None = None
    channels: dict[str, list[ChannelSummary]] = field(default_factory=dict)  # observations/actions/inputs


@dataclass
class ValidationReport:
    path: str
    findings: list[Finding]
    summary: Summary

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def codes(self, severity: str | None = None) -> set[str]:
        return {f.code for f in self.findings if severity in (None, f.severity)}

    def to_dict(self) -> dict:
        return {
            "report_version": REPORT_VERSION,
            "path": self.path,
            "ok": self.ok,
            "summary": asdict(self.summary),
            "findings": [asdict(f) for f in self.findings],
        }

    def format_text(self) -> str:
        s = self.summary
        dt = "unknown" if s.dt is None else f"{s.dt:g} s"
        lines = [f"log {self.path}", f"  {s.episodes} episodes, {s.total_steps} steps, source {s.source}, dt {dt}"]
        for kind, chans in s.channels.items():
            lines.append(f"  {kind} ({len(chans)} channels)")
            if chans:
                w = max(12, *(len(c.name) for c in chans))
                lines.append(f"    {'name':{w}s} {'min':>12s} {'max':>12s} {'mean':>12s}")
                lines += [f"    {c.name:{w}s} {c.min:12.5g} {c.max:12.5g} {c.mean:12.5g}" for c in chans]
        n_err = sum(f.severity == "error" for f in self.findings)
        lines.append(
            f"findings: {n_err} error(s), {len(self.findings) - n_err} warning(s)"
            + ("" if self.findings else " — the log is valid")
        )
        lines += ["  " + f.format() for f in self.findings]
        return "\n".join(lines)


class _ChannelStats:
    """Streaming per-channel statistics, including counts at the running min and max."""

    def __init__(self, names: list[str]):
        d = len(names)
        self.names = names
        self.count = np.zeros(d, np.int64)
        self.nonfinite = np.zeros(d, np.int64)
        self.sum = np.zeros(d, np.float64)
        self.min = np.full(d, np.inf)
        self.max = np.full(d, -np.inf)
        self.at_min = np.zeros(d, np.int64)
        self.at_max = np.zeros(d, np.int64)
        self.bad_episodes: list[list[int]] = [[] for _ in range(d)]

    def update(self, x: np.ndarray, episode: int) -> None:
        x = x.astype(np.float64)  # (rows, D)
        finite = np.isfinite(x)  # (rows, D)
        bad = (~finite).sum(0)  # (D,)
        self.nonfinite += bad
        for j in np.flatnonzero(bad):
            if episode not in self.bad_episodes[j]:
                self.bad_episodes[j].append(episode)
        self.count += finite.sum(0)
        self.sum += np.where(finite, x, 0.0).sum(0)
        for lim, at, pad, better in [
            (self.min, self.at_min, np.inf, np.less),
            (self.max, self.at_max, -np.inf, np.greater),
        ]:
            block = np.where(finite, x, pad).min(0) if pad > 0 else np.where(finite, x, pad).max(0)
            hits = ((x == block) & finite).sum(0)  # (D,)
            new, same = better(block, lim), block == lim
            at[new] = hits[new]
            at[same & np.isfinite(block)] += hits[same & np.isfinite(block)]
            lim[new] = block[new]

    def summaries(self) -> list[ChannelSummary]:
        mean = np.where(self.count > 0, self.sum / np.maximum(self.count, 1), np.nan)
        return [
            ChannelSummary(
                n,
                float(self.min[j]) if self.count[j] else float("nan"),
                float(self.max[j]) if self.count[j] else float("nan"),
                float(mean[j]),
                int(self.count[j]),
                int(self.nonfinite[j]),
            )
            for j, n in enumerate(self.names)
        ]

    def findings(self, kind: str) -> list[Finding]:
        out = []
        for j, name in enumerate(self.names):
            ch = f"{kind}/{name}"
            if self.nonfinite[j]:
                eps = self.bad_episodes[j]
                out.append(
                    Finding(
                        "error",
                        "nonfinite",
                        None,
                        ch,
                        f"{self.nonfinite[j]} NaN/inf values in {len(eps)} episode(s) "
                        f"(first: {', '.join(map(str, eps[:5]))})",
                    )
                )
            n = self.count[j]
            if n < 2:
                continue
            if self.min[j] == self.max[j]:
                out.append(
                    Finding("warning", "constant_channel", None, ch, f"constant at {self.min[j]:g} over {n} values")
                )
                continue
            interior = n - self.at_min[j] - self.at_max[j]
            for lim, at in [("min", self.at_min[j]), ("max", self.at_max[j])]:
                if at > SATURATION_AT_LIMIT * n and interior >= SATURATION_INTERIOR * n:
                    value = self.min[j] if lim == "min" else self.max[j]
                    out.append(
                        Finding(
                            "warning",
                            "saturated_channel",
                            None,
                            ch,
                            f"{100 * at / n:.0f}% of values sit exactly at its {lim} "
                            f"{value:g}: clipped at a sensor or actuator limit?",
                        )
                    )
        return out


class _Validator:
    def __init__(self, f: h5py.File, path: Path):
        self.f, self.path = f, path
        self.findings: list[Finding] = []
        self.summary = Summary()
        self.ref: dict | None = None  # dims, keys, shapes and dtypes of the first readable episode
        self.stats: dict[str, _ChannelStats] = {}
        self.classes: int | None = None

    def add(self, severity, code, message, episode=None, channel=None) -> None:
        self.findings.append(Finding(severity, code, episode, channel, message))

    def run(self) -> ValidationReport:
        problems = L.check_format(self.f.attrs)
        if problems:
            raise UserError(
                f"{self.path}: " + "; ".join(problems),
                "upgrade wmcheck, or convert the file to a supported format version",
            )
        groups = L.episode_index(self.f)
        if not groups:
            self.add("error", "no_episodes", "the file holds no episode_<id> groups")
        try:
            self.classes = L.discrete_action_classes(self.f, self.path, groups)
        except L.LayoutError as exc:
            self.add("error", "bad_actions", str(exc), channel="actions")
        # The first episode whose layout resolves sets the reference dims (shapes only, no data).
        self.ref = next(
            (s for s in map(self._quiet_signature, (self.f[n] for n in groups.values())) if s is not None), None
        )
        meta = self._meta()
        self.summary.source = meta.source if meta else None
        self.summary.dt = meta.dt if meta else None
        self.summary.episodes = len(groups)
        for eid, name in groups.items():
            self._episode(eid, self.f[name])
        for kind, st in self.stats.items():
            self.summary.channels[kind] = st.summaries()
            self.findings += st.findings(kind)
        return ValidationReport(str(self.path), self.findings, self.summary)

    def _quiet_signature(self, g: h5py.Group) -> dict | None:
        act = g.get("actions")
        if "observations" not in g or not isinstance(act, h5py.Dataset):
            return None
        try:
            return self._signature(g, L.observation_layout(g["observations"]), act)
        except L.LayoutError:
            return None

    def _meta(self):
        """LogMeta from the attributes (names generated from the reference episode); sets up stats."""
        ref = self.ref or {"D": 0, "A": 0, "E": 0, "obs_names": []}
        try:
            meta = L.meta_from_attrs(self.f.attrs, ref["obs_names"], [f"action_{i}" for i in range(ref["A"])])
        except L.LayoutError as exc:
            self.add("error", "bad_attribute", str(exc))
            meta = None
        if self.ref is None:
            return meta
        names = {
            "observations": ref["obs_names"],
            "actions": [f"action_{i}" for i in range(ref["A"])],
            "inputs": [f"input_{i}" for i in range(ref["E"])],
        }
        for kind, d in [("observations", ref["D"]), ("actions", ref["A"]), ("inputs", ref["E"])]:
            stored = (
                {"observations": meta.observation_names, "actions": meta.action_names, "inputs": meta.input_names}[kind]
                if meta
                else names[kind]
            )
            if len(stored) != d:
                self.add(
                    "error",
                    "names_mismatch",
                    f"the data has {d} {kind} columns but the file attributes name {len(stored)}",
                    channel=kind,
                )
            else:
                names[kind] = stored
            self.stats[kind] = _ChannelStats(list(names[kind]))
        return meta

    def _episode(self, eid: int, g: h5py.Group) -> None:
        add = lambda sev, code, msg, ch=None: self.add(sev, code, msg, eid, ch)  # noqa: E731
        try:
            attr_id, attr_steps = L.int_attr(g.attrs, "id"), L.int_attr(g.attrs, "total_steps")
        except L.LayoutError as exc:
            add("error", "bad_attribute", str(exc))
            return
        if attr_id is not None and attr_id != eid:
            add("warning", "id_mismatch", f"attribute id={attr_id} but the group is episode_{eid}; using {eid}")
        for key in REQUIRED:
            if key not in g:
                add("error", "missing_dataset", f"dataset {key} is missing", key)
        scalars = [k for k in PER_STEP if isinstance(g.get(k), h5py.Dataset) and g[k].ndim == 0]
        for k in scalars:
            add("error", "scalar_dataset", f"{k} is a scalar dataset; a per-step dataset has one row per step", k)
        for k in L.non_numeric(g, PER_STEP):
            add("error", "bad_dtype", f"{k} holds {g[k].dtype} values, not numbers", k)
            scalars.append(k)
        if scalars:  # the episode's other checks read rows of these datasets
            return
        lay = None
        if "observations" in g:
            try:
                lay = L.observation_layout(g["observations"])
            except L.LayoutError as exc:
                add("error", "bad_layout", str(exc), "observations")
        act = g.get("actions")
        if isinstance(act, h5py.Group):
            add("error", "bad_layout", "actions are a group; expected one (N, A) dataset", "actions")
            act = None
        n = act.shape[0] if act is not None else attr_steps
        if n is None:
            return
        n = int(n)
        self.summary.total_steps += n
        if attr_steps is not None and act is not None and attr_steps != n:
            add("error", "total_steps_mismatch", f"attribute total_steps={attr_steps} but actions have {n} rows")
        if n == 0:
            add("warning", "zero_steps", "the episode has no steps")
        rows = {
            f"observations/{k}".rstrip("/"): (r, n + 1)
            for k, r in (L.component_rows(g["observations"], lay).items() if lay else [])
        }
        per_step = [k for k in L.PER_STEP_OPTIONAL if isinstance(g.get(k), h5py.Dataset)]
        for k in [k for k in per_step if g[k].ndim == 0]:
            add("error", "scalar_dataset", f"{k} is a scalar dataset; a per-step dataset has one row per step", k)
        rows.update({k: (g[k].shape[0], n + (k == "timestamps")) for k in per_step if g[k].ndim > 0})
        for k, (r, want) in rows.items():
            if r != want:
                add(
                    "error",
                    "row_count",
                    f"{k} has {r} rows, expected {want} ({'N+1' if want == n + 1 else 'N'} with N = {n} actions)",
                    k,
                )
        self._timestamps(eid, g, add)
        if isinstance(g.get("rewards"), h5py.Dataset):
            r = np.asarray(g["rewards"][()], np.float64)  # (N,)
            if not np.isfinite(r).all():
                add("error", "nonfinite", f"{int((~np.isfinite(r)).sum())} NaN/inf rewards", "rewards")
        if isinstance(g.get("terminations"), h5py.Dataset) and n > 1 and g["terminations"].shape[0] == n:
            early = int(np.asarray(g["terminations"][: n - 1], bool).sum())
            if early:
                add(
                    "warning",
                    "early_termination",
                    f"terminations is true at {early} step(s) "
                    "before the last: steps after a termination carry no valid dynamics",
                    "terminations",
                )
        if lay is None or act is None:
            return
        try:
            sig = self._signature(g, lay, act)
        except L.LayoutError as exc:
            add("error", "bad_actions", str(exc), "actions")
            return
        if not self._same_as_ref(sig, add):
            return
        self._stream(eid, g, lay, act)

    def _signature(self, g, lay, act) -> dict | None:
        a = L.action_dim(act, self.classes)  # LayoutError for the caller
        obs = g["observations"]
        inputs = g.get("inputs")
        return {
            "D": lay.dim,
            "A": a,
            "E": L.width(inputs) if inputs is not None else 0,
            "obs_names": lay.names,
            "obs_keys": lay.vector_keys,
            "groups": {k: tuple(obs[k].shape[1:]) for k in lay.group_keys},
            "dtypes": {
                **{
                    f"observations/{k}".rstrip("/"): L.component(obs, k).dtype for k in lay.vector_keys + lay.group_keys
                },
                "actions": act.dtype,
                **({"inputs": inputs.dtype} if inputs is not None else {}),
            },
        }

    def _same_as_ref(self, sig, add) -> bool:
        ref, same = self.ref, True
        for key, what in [
            ("D", "observation columns"),
            ("A", "action columns"),
            ("E", "input columns"),
            ("obs_keys", "observation keys"),
            ("groups", "observation groups"),
        ]:
            if sig[key] != ref[key]:
                add("error", "dim_mismatch", f"{what} {sig[key]} differ from the first episode's {ref[key]}")
                same = False
        for k in sorted(set(sig["dtypes"]) | set(ref["dtypes"])):
            a, b = sig["dtypes"].get(k), ref["dtypes"].get(k)
            if a is not None and b is not None and a != b:
                add("error", "dtype_mismatch", f"dtype {a} differs from the first episode's {b}", k)
        return same

    def _stream(self, eid, g, lay, act) -> None:
        obs = g["observations"]
        obs_rows = min([L.component(obs, k).shape[0] for k in lay.vector_keys] or [0])
        jobs = [
            ("observations", obs_rows, lambda s, e: L.read_state(obs, lay, s, e)),
            ("actions", act.shape[0], lambda s, e: L.read_actions(act, self.classes, s, e)),
        ]
        if "inputs" in g:
            jobs.append(("inputs", g["inputs"].shape[0], lambda s, e: L.read_vector(g["inputs"], s, e)))
        for kind, rows, read in jobs:
            for start in range(0, rows, BLOCK_ROWS):
                try:
                    x = read(start, min(rows, start + BLOCK_ROWS))  # (rows, C)
                except L.LayoutError as exc:
                    self.add("error", "bad_actions", str(exc), eid, kind)
                    break
                self.stats[kind].update(x, eid)

    def _timestamps(self, eid, g, add) -> None:
        if not isinstance(g.get("timestamps"), h5py.Dataset):
            return
        ts = np.asarray(g["timestamps"][()], np.float64)  # (N+1,)
        if not np.isfinite(ts).all():
            add("error", "nonfinite", f"{int((~np.isfinite(ts)).sum())} NaN/inf timestamps", "timestamps")
            return
        d = np.diff(ts)  # (N,)
        bad = d <= 0
        if bad.any():
            add(
                "error",
                "timestamps_not_increasing",
                f"{int(bad.sum())} step(s) with a timestamp "
                f"difference <= 0 (first at step {int(np.flatnonzero(bad)[0])})",
                "timestamps",
            )
        good = d[~bad]
        if good.size == 0:
            return
        ref = self.summary.dt or float(np.median(good))
        off = np.abs(good - ref) > DT_TOLERANCE * ref
        if off.any():
            add(
                "warning",
                "irregular_dt",
                f"{int(off.sum())} of {d.size} step(s) deviate from the "
                f"period {ref:g} s by more than {DT_TOLERANCE:.0%} (range {good.min():g}..{good.max():g} s)",
                "timestamps",
            )


def validate_log(path: str | os.PathLike) -> ValidationReport:
    """Check every episode of a log; UserError only when the file cannot be opened at all."""
    path = Path(path)
    with open_h5(path) as f:
        v = _Validator(f, path)
        try:
            return v.run()
        except OSError as exc:
            raise UserError(
                f"could not read {path}: {exc}", "the file is damaged (truncated?); re-create or re-copy it"
            ) from None


def report_json(report: ValidationReport) -> str:
    return json.dumps(json_safe(report.to_dict()), indent=2, allow_nan=False)
