"""NumPy `.npz` archives to a log. Two layouts, chosen by the keys present:

1. **Columns** (no `observations` key): one 1-D array per column, all the same length, exactly like a
   CSV saved with `np.savez(path, time=..., machine=..., power=...)`. The `ImportMapping` names the
   columns and the file goes through the same cleaning pipeline as a CSV (`tabular.py`): timestamps
   (numeric seconds, or ISO strings in a unicode array), machines, ranges, sentinels, gaps.

2. **Log layout** (an `observations` key): row-aligned transition arrays in the D4RL convention, one
   row per time step of every episode, episodes stacked:
     observations (R, D) (or (R,))     — obs_t
     actions      (R, A) (or (R,))     — the action taken at obs_t
     inputs       (R, E)               — optional, exogenous inputs during step t
     rewards      (R,)                 — optional, reward of the transition from row t
     terminations (R,) or `terminals`  — optional, the transition from row t ended in a terminal state
     truncations  (R,) or `timeouts`   — optional
     timestamps   (R,)                 — optional, seconds
     next_observations (R, D)          — optional, obs_{t+1} for every row
   Episode boundaries: `episode_starts` (R,) bool (True on each episode's first row), or `episode`
   (R,) integer ids (a new episode wherever the id changes), or neither (one episode).
   Optional `observation_names`, `action_names`, `input_names` (string arrays) and `dt` (scalar).
   An episode of M rows becomes N = M-1 steps (its last row is the final observation; that row's
   action, reward and flags are dropped), or N = M steps when `next_observations` is present (the
   last row's next observation is appended). This layout is taken as clean: NaN/inf is an error
   (use the columns layout to clean data on import).
Pickled (object) arrays are refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import CopyOptions, ImportMapping
from wmcheck.datasets.importers.summary import ImportResult, ImportSummary
from wmcheck.datasets.importers.tabular import Table, check_columns, table_to_result

ALIASES = {"terminations": ("terminations", "terminals"), "truncations": ("truncations", "timeouts")}


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file {str(path)!r} does not exist", "check the path")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as exc:  # object arrays need pickle
        raise UserError(f"{path}: {exc}", "save plain numeric or string arrays (no Python objects)") from None
    except (OSError, EOFError) as exc:
        raise UserError(f"{path} is not a readable .npz archive: {exc}", "re-create it with np.savez") from None


def is_log_layout(arrays: dict[str, np.ndarray]) -> bool:
    return "observations" in arrays


def import_npz_columns(
    path: str | Path, mapping: ImportMapping, arrays: dict[str, np.ndarray] | None = None
) -> ImportResult:
    """Columns layout: through the tabular pipeline."""
    arrays = load_npz(path) if arrays is None else arrays
    check_columns(list(arrays), mapping, str(path))
    lengths = {c: arrays[c].shape for c in mapping.needed_cols}
    bad = {c: s for c, s in lengths.items() if len(s) != 1}
    if bad:
        raise UserError(
            f"{path}: columns must be 1-D arrays, got shapes {bad}",
            "save one 1-D array per column (or use the log layout with `observations`)",
        )
    n = {s[0] for s in lengths.values()}
    if len(n) > 1:
        raise UserError(f"{path}: columns have different lengths {lengths}", "save equal-length columns")
    table = Table(
        columns={c: arrays[c] for c in mapping.needed_cols},
        n_rows=n.pop(),
        origin=str(path),
        row_label=lambda i: f"index {i}",
    )
    return table_to_result(table, mapping)


def import_npz_log(path: str | Path, options: CopyOptions, arrays: dict[str, np.ndarray] | None = None) -> ImportResult:
    """Log layout: split the stacked rows into episodes."""
    z = load_npz(path) if arrays is None else arrays
    if "actions" not in z:
        raise UserError(
            f"{path}: log-layout npz has `observations` but no `actions`",
            f"add an `actions` array (R, A); keys present: {', '.join(z)}",
        )
    obs, act = _matrix(z["observations"], "observations", path), _matrix(z["actions"], "actions", path)
    R = obs.shape[0]
    arrays = {"observations": obs, "actions": act}
    for key in ("inputs", "next_observations"):
        if key in z:
            arrays[key] = _matrix(z[key], key, path)
    for key in ("rewards", "timestamps", "episode_starts", "episode"):
        if key in z:
            x = np.asarray(z[key])
            arrays[key] = x[:, 0] if x.ndim == 2 and x.shape[1] == 1 else x
    for key, names in ALIASES.items():
        found = next((n for n in names if n in z), None)
        if found:
            x = np.asarray(z[found])
            arrays[key] = (x[:, 0] if x.ndim == 2 and x.shape[1] == 1 else x).astype(bool)
    vectors = ("observations", "actions", "inputs", "next_observations")
    wrong = {k: v.shape for k, v in arrays.items() if v.shape[:1] != (R,) or (k not in vectors and v.ndim != 1)}
    if wrong:
        raise UserError(
            f"{path}: every array needs one row per time step ({R} rows, like observations; "
            f"rewards, flags, timestamps and episode ids 1-D); got {wrong}",
            "stack the rows of all episodes in the same order in every array",
        )
    bad = [
        k
        for k in ("observations", "actions", "inputs", "next_observations", "rewards", "timestamps")
        if k in arrays and not np.isfinite(arrays[k].astype(np.float64)).all()
    ]
    if bad:
        raise UserError(
            f"{path}: NaN/inf values in {', '.join(bad)}",
            "clean the data first, or save it as columns (no `observations` key) so that "
            "the import pipeline treats them as missing",
        )
    starts = _episode_starts(arrays, R, path)
    meta = LogMeta(
        source=options.source or "sim",
        dt=options.dt if options.dt is not None else (float(z["dt"]) if "dt" in z else None),
        observation_names=options.names(
            "observation", _stored_names(z, "observation_names"), obs.shape[1], "--obs-cols"
        ),
        action_names=options.names("action", _stored_names(z, "action_names"), act.shape[1], "--action-cols"),
        input_names=options.names(
            "input",
            _stored_names(z, "input_names"),
            arrays["inputs"].shape[1] if "inputs" in arrays else 0,
            "--input-cols",
        ),
        units=dict(options.units),
    )
    s = ImportSummary(source_path=str(path), rows_read=R, dt=meta.dt)
    episodes = []
    for a, b in zip(starts, [*starts[1:], R]):
        ep = _episode(arrays, a, b, len(episodes), meta.dt)
        if ep is None:
            s.episodes_dropped += 1
            continue
        episodes.append(ep)
    s.episodes_produced = len(episodes)
    s.steps_produced = sum(e.num_steps for e in episodes)
    if not episodes:
        raise UserError(
            f"{path}: every episode has a single row (no step)",
            "check `episode_starts`/`episode`, or add `next_observations`",
        )
    if s.episodes_dropped:
        s.notes.append(f"{s.episodes_dropped} single-row episode(s) dropped: no step to learn from")
    return ImportResult(episodes=episodes, meta=meta, summary=s)


def _matrix(x: np.ndarray, name: str, path) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "iufb":
        raise UserError(f"{path}: `{name}` must be numeric, got dtype {x.dtype}", "save numbers")
    if x.ndim == 1:
        return x[:, None]
    if x.ndim != 2:
        raise UserError(f"{path}: `{name}` must be (R, D), got shape {x.shape}", "flatten each row")
    return x


def _stored_names(z: dict[str, np.ndarray], key: str) -> list[str]:
    return [str(v) for v in np.asarray(z[key]).reshape(-1)] if key in z else []


def _episode_starts(arrays: dict[str, np.ndarray], R: int, path) -> list[int]:
    if "episode_starts" in arrays:
        flags = arrays["episode_starts"].astype(bool)
        flags[0] = True
        return np.flatnonzero(flags).tolist()
    if "episode" in arrays:
        ids = arrays["episode"]
        if ids.dtype.kind not in "iu":
            raise UserError(
                f"{path}: `episode` must hold integer ids, got {ids.dtype}", "use integers (or a bool `episode_starts`)"
            )
        return np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]).tolist()
    return [0]


def _episode(arrays: dict[str, np.ndarray], a: int, b: int, ep_id: int, dt: float | None) -> Episode | None:
    nxt = arrays.get("next_observations")
    if nxt is not None:  # N = M steps: every row's transition is complete
        obs = np.vstack([arrays["observations"][a:b], nxt[b - 1 : b]])  # (M+1, D)
        stop = b
    else:  # N = M - 1 steps: the last row only contributes its observation
        obs = arrays["observations"][a:b]  # (M, D)
        stop = b - 1
    n = stop - a
    if n < 1:
        return None

    def rows(key):
        x = arrays.get(key)
        return None if x is None else x[a:stop]

    truncs = rows("truncations")
    truncs = np.zeros(n, bool) if truncs is None else truncs.copy()
    terms = rows("terminations")
    terms = np.zeros(n, bool) if terms is None else terms.copy()
    if not terms[-1]:
        truncs[-1] = True  # the recorded episode ends here without a terminal state
    ts = arrays.get("timestamps")
    if ts is not None:
        ts = ts[a:b].astype(np.float64)
        if nxt is not None:
            ts = np.r_[ts, ts[-1] + dt] if dt is not None else None
    return Episode(
        observations=obs.astype(np.float32),
        actions=rows("actions").astype(np.float32),  # (N, A)
        inputs=None if "inputs" not in arrays else rows("inputs").astype(np.float32),  # (N, E)
        rewards=None if "rewards" not in arrays else rows("rewards").astype(np.float32),  # (N,)
        terminations=terms,
        truncations=truncs,
        timestamps=ts,
        id=ep_id,
    )
