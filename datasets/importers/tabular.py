"""The shared import pipeline: a table of columns (from CSV, Parquet or npz) to clean episodes.

Steps, in order, each counted in the `ImportSummary`:
1. machines: distinct values of the episode column, numbered by first appearance (name kept);
2. timestamps to UTC seconds (`timestamps.py`); rows sorted by time within each machine (stable);
3. values: empty/NA cells, then sentinel codes, then values outside the valid range become missing;
4. dt: given, or the median positive time step within machines;
5. the dt grid: snap mode puts each row on the nearest grid point; rows landing on the same point
   are duplicates, merged per column: the value they agree on (missing cells ignored), or missing
   when they disagree. Grid points with no row are missing rows. Resample mode interpolates every
   column onto the grid instead (rows with the very same timestamp merged the same way);
6. consecutive rows more than `split_gap` apart split the machine's series into segments;
7. gaps of <= `max_interp_gap` missing steps are linearly interpolated within a segment; a grid row
   still missing any value splits the episode there;
8. pieces with fewer than `min_episode_steps` steps are dropped.
Each piece becomes an `Episode` (N+1 observation rows; actions/inputs from row t or t+1 according
to `step_values`), ids numbered 0.. in machine order, then time.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import ImportMapping
from wmcheck.datasets.importers.summary import ImportResult, ImportSummary
from wmcheck.datasets.importers.timestamps import parse_timestamps

NA_STRINGS = (
    "",
    "NA",
    "N/A",
    "n/a",
    "na",
    "NaN",
    "nan",
    "NAN",
    "null",
    "NULL",
    "Null",
    "None",
    "none",
    "#N/A",
    "-nan",
    "nan(ind)",
)
"""Cells read as missing in text sources (exact match after stripping spaces)."""


@dataclass
class Table:
    """Columns as read from a source: {name: 1-D sequence}, all of length `n_rows`."""

    columns: dict[str, Sequence | np.ndarray]
    n_rows: int
    origin: str
    """The file, for messages."""
    row_label: Callable[[int], str] = field(default=lambda i: f"row {i}")
    """Describes data row i (0-based) for messages, e.g. "data row 5 (line 7)"."""
    notes: list[str] = field(default_factory=list)
    """What the reader did that the summary should say (e.g. typed timestamps converted to UTC)."""


def check_columns(available: Sequence[str], mapping: ImportMapping, origin: str) -> None:
    """Raise UserError naming every mapped column the source lacks, and the columns it has; then
    check that ranges, sentinels and units name mapped columns."""
    missing = [c for c in mapping.needed_cols if c not in available]
    if not missing:
        mapping.check_rule_columns()
        return
    hints = []
    for c in missing:
        close = difflib.get_close_matches(c, list(available), n=1)
        if close:
            hints.append(f"{c!r} -> {close[0]!r}?")
    fix = f"columns in the file: {', '.join(available)}"
    if hints:
        fix += f" (did you mean {', '.join(hints)})"
    raise UserError(f"{origin}: no column named {', '.join(map(repr, missing))}", fix)


def table_to_result(table: Table, mapping: ImportMapping) -> ImportResult:
    """Run the pipeline; raise UserError if nothing usable is left."""
    m = mapping
    s = ImportSummary(source_path=table.origin, rows_read=table.n_rows)
    if table.n_rows == 0:
        raise UserError(f"{table.origin} has no data rows", "check the file (header only?)")
    machine, names = _machines(table, m)
    s.machines = names if m.episode_col is not None else []
    s.notes.extend(table.notes)
    if m.time_col is not None:
        t, notes = parse_timestamps(table.columns[m.time_col], m.time_col, table.row_label, m.timezone)
        s.notes.extend(n for n in notes if not (table.notes and n.startswith("numeric")))
    else:
        t = np.zeros(table.n_rows)
        for k in range(len(names)):  # equally spaced in file order within each machine
            rows = machine == k
            t[rows] = np.arange(rows.sum()) * m.dt
    cols = m.value_cols
    V = np.empty((table.n_rows, len(cols)))  # (n, C) float64
    for j, c in enumerate(cols):
        V[:, j] = _to_float(table.columns[c], c, table)
    _clean(V, cols, m, s)

    order = np.lexsort((t, machine))  # stable: ties keep file order
    t, V, machine = t[order], V[order], machine[order]
    bounds = np.flatnonzero(np.r_[True, machine[1:] != machine[:-1], True])
    dt = m.dt if m.dt is not None else _infer_dt(t, machine)
    s.dt, s.dt_inferred = dt, m.dt is None
    if m.split_gap is not None and m.split_gap < dt:
        raise UserError(
            f"split_gap {m.split_gap:g} s is shorter than the step dt {dt:g} s", "give a split gap of at least one step"
        )
    s.interpolated = dict.fromkeys(cols, 0)

    episodes: list[Episode] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        name = names[machine[a]] if m.episode_col is not None else None
        for grid_t, G in _machine_pieces(t[a:b], V[a:b], dt, m, s):
            episodes.append(_episode(grid_t, G, len(episodes), name, m))
    s.episodes_produced = len(episodes)
    s.steps_produced = sum(e.num_steps for e in episodes)
    if episodes:
        s.time_start = float(min(e.timestamps[0] for e in episodes))
        s.time_end = float(max(e.timestamps[-1] for e in episodes))
    if not episodes:
        raise UserError(
            f"{table.origin}: no episode left after cleaning ({s.rows_read:,} rows read, "
            f"{s.values_missing:,} values missing, {s.episodes_dropped:,} pieces shorter than "
            f"min_episode_steps={m.min_episode_steps})\n{s.format_text()}",
            "check the valid ranges and sentinels, raise --max-interp-gap, or lower min_episode_steps",
        )
    meta = LogMeta(
        source=m.source,
        dt=dt,
        observation_names=list(m.obs_cols),
        action_names=list(m.action_cols),
        input_names=list(m.input_cols),
        units=dict(m.units),
    )
    return ImportResult(episodes=episodes, meta=meta, summary=s)


def _machines(table: Table, m: ImportMapping) -> tuple[np.ndarray, list[str]]:
    """(machine index per row, machine names in order of first appearance)."""
    if m.episode_col is None:
        return np.zeros(table.n_rows, np.int64), ["all rows"]
    keys = np.asarray(table.columns[m.episode_col])
    if keys.dtype.kind == "f" and np.isnan(keys).any():
        i = int(np.flatnonzero(np.isnan(keys))[0])
        raise UserError(f"empty {m.episode_col!r} at {table.row_label(i)}", "every row needs its machine/run id")
    keys = np.char.strip(keys.astype(str))
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if "" in set(uniq.tolist()):
        i = int(np.flatnonzero(keys == "")[0])
        raise UserError(f"empty {m.episode_col!r} at {table.row_label(i)}", "every row needs its machine/run id")
    rank = np.empty(len(uniq), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    names = [str(u) for u in uniq[np.argsort(first, kind="stable")]]
    return rank[inverse.reshape(-1)], names


def _to_float(col: Sequence | np.ndarray, name: str, table: Table) -> np.ndarray:
    arr = np.asarray(col)
    if arr.dtype.kind in "iufb":
        return arr.astype(np.float64)
    arr = arr.astype(str)
    for _attempt in range(2):  # fast path, then once more with surrounding spaces stripped
        missing = np.zeros(arr.shape, bool)
        for na in NA_STRINGS:  # a few vectorised compares beat np.isin's sort on 400k strings
            missing |= arr == na
        arr[missing] = "nan"
        try:
            return arr.astype(np.float64)
        except ValueError:
            arr = np.char.strip(arr)
    for i, v in enumerate(arr):  # noqa: B007 (i names the bad row below)  error path: name the first bad cell
        try:
            float(v)
        except ValueError:
            break
    raise UserError(
        f"{table.origin}: column {name!r} has a non-numeric value {str(v)!r} at {table.row_label(i)}",
        f"value columns must be numbers; empty cells and {', '.join(NA_STRINGS[1:6])} "
        "are read as missing; map codes with --sentinel",
    )


def _clean(V: np.ndarray, cols: list[str], m: ImportMapping, s: ImportSummary) -> None:
    """Empty cells, then sentinels, then out-of-range values become NaN (counted per column).
    Runs before duplicates are merged, so a duplicate row holding a fault code does not conflict."""
    for j, c in enumerate(cols):
        x = V[:, j]  # view: edits V in place
        x[~np.isfinite(x)] = np.nan
        s.missing_in_source[c] = int(np.isnan(x).sum())
        hits = np.zeros(len(x), bool)
        for code in m.sentinels.get(c, []):
            hits |= np.isclose(x, code, rtol=1e-6, atol=1e-9)
        s.sentinel_hits[c] = int(hits.sum())
        x[hits] = np.nan
        lo, hi = m.valid_ranges.get(c, (-np.inf, np.inf))
        with np.errstate(invalid="ignore"):
            out = (x < lo) | (x > hi)
        s.out_of_range[c] = int(out.sum())
        x[out] = np.nan


def _infer_dt(t: np.ndarray, machine: np.ndarray) -> float:
    d = np.diff(t)[machine[1:] == machine[:-1]]
    d = d[d > 0]
    if not d.size:
        raise UserError(
            "cannot infer dt: no machine has two rows at different times", "give the step period with --dt SECONDS"
        )
    return float(np.median(d))


def _merge_duplicates(V: np.ndarray, starts: np.ndarray, cols: list[str], s: ImportSummary) -> np.ndarray:
    """Merge groups of rows on one time step (groups begin at `starts`), per column: the value the
    rows agree on (missing cells ignored), or missing when they disagree (which one is right is
    unknown), counted in `s.duplicate_conflicts`."""
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(V, starts, axis=0)  # (U, C), NaN only where every row is NaN
        hi = np.fmax.reduceat(V, starts, axis=0)
        conflict = (hi - lo) > 1e-6 * np.maximum(np.abs(hi), np.abs(lo)) + 1e-9
    lo[conflict] = np.nan
    for j, c in enumerate(cols):
        s.duplicate_conflicts[c] = s.duplicate_conflicts.get(c, 0) + int(conflict[:, j].sum())
    return lo


def _machine_pieces(t: np.ndarray, V: np.ndarray, dt: float, m: ImportMapping, s: ImportSummary):
    """Yield (grid times (R,), values (R, C)) for each kept piece of one machine's sorted rows."""
    if m.resample:
        key = t  # exact duplicates only; the grid comes later
    else:
        phase = float(np.median((t - t[0] + dt / 2) % dt - dt / 2))
        origin = t[0] + phase
        key = np.rint((t - origin) / dt).astype(np.int64)
        s.max_snap_seconds = max(s.max_snap_seconds, float(np.abs(t - (origin + key * dt)).max()))
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    s.duplicate_rows += len(t) - len(starts)
    if len(starts) < len(t):
        V, key, t = _merge_duplicates(V, starts, m.value_cols, s), key[starts], t[starts]
    if m.resample:
        slot_t = t
    else:
        slot_t = origin + key * dt
        s.missing_rows += int(key[-1] - key[0] + 1 - len(key))
    # Segments: cut where rows are further apart than split_gap (a time-gap split), and where no
    # interpolation can bridge the gap (split there anyway; cutting first keeps grids small).
    gap = np.diff(slot_t)
    time_cut = gap > m.split_gap if m.split_gap is not None else np.zeros(len(gap), bool)
    cut = time_cut | (gap > (m.max_interp_gap + 1.5) * dt)
    bounds = np.r_[0, np.flatnonzero(cut) + 1, len(slot_t)]
    state = {"pieces": 0, "time_cut": False}
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if i and time_cut[a - 1]:
            state["time_cut"] = True
        if m.resample:
            grid_t, G, present = _resample(slot_t[a:b], V[a:b], dt, m, s)
        else:
            k = key[a:b] - key[a]
            G = np.full((int(k[-1]) + 1, V.shape[1]), np.nan)  # (L, C)
            G[k] = V[a:b]
            present = np.zeros(len(G), bool)
            present[k] = True
            grid_t = slot_t[a] + np.arange(len(G)) * dt
            _fill_short_gaps(G, m, s)
        yield from _pieces(grid_t, G, present, m, s, state)


def _resample(t: np.ndarray, V: np.ndarray, dt: float, m: ImportMapping, s: ImportSummary):
    """Linear interpolation of each column onto the epoch-aligned dt grid within [t0, t1]."""
    eps = 1e-6 * dt
    grid_t = np.arange(np.ceil((t[0] - eps) / dt), np.floor((t[-1] + eps) / dt) + 1) * dt  # (L,)
    G = np.full((len(grid_t), V.shape[1]), np.nan)
    present = np.zeros(len(grid_t), bool)
    if not len(grid_t):
        return grid_t, G, present
    j = np.searchsorted(t, grid_t)
    present = np.abs(t[np.clip(j, 0, len(t) - 1)] - grid_t) < dt / 2
    for c, col in enumerate(m.value_cols):
        ok = ~np.isnan(V[:, c])
        tv, xv = t[ok], V[ok, c]
        if not len(tv):
            continue
        r = np.clip(np.searchsorted(tv, grid_t - eps), 0, len(tv) - 1)  # first sample >= grid point
        exact = np.abs(tv[r] - grid_t) <= eps
        left = np.clip(r - 1, 0, len(tv) - 1)
        gap = tv[r] - tv[left]
        inside = (tv[left] < grid_t) & (grid_t < tv[r])
        fill = exact | (inside & (gap <= (m.max_interp_gap + 1) * dt + eps))
        G[fill, c] = np.interp(grid_t[fill], tv, xv)
        s.interpolated[col] += int((fill & ~exact & (gap > 1.5 * dt)).sum())
    return grid_t, G, present


def _fill_short_gaps(G: np.ndarray, m: ImportMapping, s: ImportSummary) -> None:
    """Interpolate, per column in place, NaN runs of <= max_interp_gap rows with valid rows on both sides."""
    L = len(G)
    pos = np.arange(L)
    for c, col in enumerate(m.value_cols):
        x = G[:, c]
        isn = np.isnan(x)
        if not isn.any() or m.max_interp_gap == 0 or isn.all():
            continue
        valid = np.flatnonzero(~isn)
        run_start = isn & ~np.r_[False, isn[:-1]]
        run_id = np.cumsum(run_start) * isn  # 0 outside runs, 1.. per run
        length = np.bincount(run_id)[run_id]
        fill = isn & (length <= m.max_interp_gap) & (pos > valid[0]) & (pos < valid[-1])
        x[fill] = np.interp(pos[fill], valid, x[valid])
        s.interpolated[col] += int(fill.sum())


def _pieces(grid_t: np.ndarray, G: np.ndarray, present: np.ndarray, m: ImportMapping, s: ImportSummary, state: dict):
    """Split at rows still missing a value; drop short pieces; yield the rest. `state` carries, per
    machine, the pieces seen so far and whether a split_gap cut came since the last one, so that
    each split (a boundary between two pieces) is counted once, under its reason."""
    ok = ~np.isnan(G).any(axis=1)
    edges = np.diff(np.r_[0, ok.astype(np.int8), 0])
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    kept = np.zeros(len(G), bool)
    for a, b in zip(starts, ends):
        if state["pieces"]:
            if state["time_cut"]:
                s.splits_time_gap += 1
            else:
                s.splits_missing += 1
        state["pieces"] += 1
        state["time_cut"] = False
        if b - a - 1 < m.min_episode_steps:
            s.episodes_dropped += 1
            continue
        kept[a:b] = True
        chunks = _chunks(a, b, m)
        s.length_cuts += len(chunks) - 1
        for c0, c1 in chunks:
            yield grid_t[c0:c1], G[c0:c1]
    s.rows_dropped += int((present & ~kept).sum())


def _chunks(a: int, b: int, m: ImportMapping) -> list[tuple[int, int]]:
    """Row ranges [c0, c1) cutting the piece [a, b) into episodes of at most max_episode_steps
    steps (rows = steps + 1; consecutive episodes share their boundary row, as a log split in two
    would). A remainder shorter than min_episode_steps stays with the previous episode."""
    n_max = m.max_episode_steps
    if n_max is None or b - a - 1 <= n_max:
        return [(a, b)]
    cuts = list(range(a, b - 1, n_max))  # first row of each episode
    if b - 1 - cuts[-1] < m.min_episode_steps:
        cuts.pop()
    return [(c, min(c + n_max, b - 1) + 1 if i < len(cuts) - 1 else b) for i, c in enumerate(cuts)]


def _episode(grid_t: np.ndarray, G: np.ndarray, ep_id: int, name: str | None, m: ImportMapping) -> Episode:
    D, A = len(m.obs_cols), len(m.action_cols)
    step = G[:-1, D:] if m.step_values == "start" else G[1:, D:]  # (N, A+E): values acting during step t
    n = len(G) - 1
    truncations = np.zeros(n, bool)
    truncations[-1] = True  # a log ends (or is cut) without the system terminating
    return Episode(
        observations=G[:, :D].astype(np.float32),  # (N+1, D)
        actions=np.ascontiguousarray(step[:, :A], np.float32),  # (N, A)
        inputs=np.ascontiguousarray(step[:, A:], np.float32) if m.input_cols else None,  # (N, E)
        terminations=np.zeros(n, bool),
        truncations=truncations,
        timestamps=grid_t.astype(np.float64),  # (N+1,)
        id=ep_id,
        name=name,
    )
