"""Log format v1 (log-format.md): the HDF5 writer and the lazy reader.

Owns turning `Episode`s + `LogMeta` into a file and back. The mapping of HDF5 nodes to arrays
(Minari dict observations, discrete actions, attributes) lives in `layout`; whole-file checks with
statistics live in `validate`.

Writing: `write_log(path, episodes, meta)` or, incrementally, `with LogWriter(path, meta) as w:
w.add(ep)`. Both write to a temporary name beside the target and rename on success; on any
exception nothing is left at the target. Vector observations go to `observations` (N+1, D) float32
when the episode has no `obs_groups`, else to `observations/state` plus one dataset per group key
(images uint8, chunked one frame per chunk, gzip). `inputs` only when E > 0, `timestamps` only when
present; `rewards`/`terminations`/`truncations` always (defaults from the Episode helpers). Empty
name lists in `meta` are filled with generated names (`obs_0`, `action_0`, `input_0`).

Reading: `LogReader(path)` / `open_log(path)` opens lazily (attributes and the episode list only);
`read(id)` loads one episode and rejects it, with one UserError listing every problem, when it
breaks the format's rules (missing datasets, row counts, NaN/inf, non-increasing timestamps,
dimensions that differ from the file's names). `wmcheck validate` gives the full report.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import h5py
import numpy as np

from wmcheck.datasets import layout as L
from wmcheck.datasets.atomic import atomic_path, write_room
from wmcheck.datasets.episode import FORMAT_NAME, FORMAT_VERSION, Episode, LogMeta
from wmcheck.datasets.errors import UserError

REQUIRED = ("observations", "actions", "terminations", "truncations")
PER_STEP = ("actions", *L.PER_STEP_OPTIONAL)
"""The datasets with one row per step (N, or N + 1 for timestamps); observations are read by layout.py."""
_VALIDATE_FIX = "run `wmcheck validate {path}` for the full report, then fix the importer or its mapping and re-import"


# --- writing ----------------------------------------------------------------------------------


def _generated(prefix: str, n: int) -> list[str]:
    return [f"{prefix}_{i}" for i in range(n)]


class LogWriter:
    """Incremental, atomic writer: `with LogWriter(path, meta) as w: w.add(episode)`.

    `add` checks each episode against the first one and against the names in `meta` and raises
    ValueError listing every problem. Closing with no episodes raises ValueError (a log without
    episodes cannot be read back).
    """

    def __init__(self, path: str | os.PathLike, meta: LogMeta):
        self.path = Path(path)
        self.meta = meta
        self._stack: contextlib.ExitStack | None = None
        self._file: h5py.File | None = None
        self._ids: set[int] = set()
        self._dims: tuple[int, int, int] | None = None  # (D, A, E) of the first episode
        self._groups: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        self._tmp: Path | None = None

    # HDF5 does not survive a write the OS refuses (a full disk, `ulimit -f`): it floods errors
    # while freeing its objects and can crash the process. So `add` checks first that the
    # episode's raw bytes, plus this margin for HDF5's own metadata and buffers, fit.
    ROOM_MARGIN = 256 * 1024

    def __enter__(self) -> LogWriter:
        self._stack = contextlib.ExitStack()
        try:
            tmp = self._tmp = self._stack.enter_context(atomic_path(self.path, suffix=".h5"))
            self._file = h5py.File(tmp, "w", track_order=True)
            self._stack.callback(self._file.close)  # closed before atomic_path renames
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self._write_file_attrs()
            except BaseException as err:
                self._stack.__exit__(type(err), err, err.__traceback__)
                raise
        return bool(self._stack.__exit__(exc_type, exc, tb))

    def add(self, ep: Episode) -> None:
        if self._file is None:
            raise RuntimeError("LogWriter.add called outside its `with` block")
        self._check(ep)
        self._check_room(ep)
        g = self._file.create_group(f"episode_{ep.id}")
        g.attrs["id"] = int(ep.id)
        g.attrs["total_steps"] = ep.num_steps
        if ep.seed is not None:
            g.attrs["seed"] = int(ep.seed)
        if ep.name is not None:
            g.attrs["name"] = str(ep.name)
        obs = np.asarray(ep.observations, np.float32)  # (N+1, D)
        if ep.obs_groups:
            og = g.create_group("observations")
            og.create_dataset(L.STATE_KEY, data=obs)
            for key, x in ep.obs_groups.items():
                x = np.asarray(x)  # (N+1, ...) e.g. (N+1, H, W, C) uint8
                chunks = (1, *x.shape[1:]) if x.shape[0] and x.size else None
                og.create_dataset(key, data=x, chunks=chunks, compression="gzip" if chunks else None)
        else:
            g.create_dataset("observations", data=obs)
        g.create_dataset("actions", data=np.asarray(ep.actions, np.float32))  # (N, A)
        if ep.inputs is not None and ep.inputs.shape[1] > 0:
            g.create_dataset("inputs", data=np.asarray(ep.inputs, np.float32))  # (N, E)
        g.create_dataset("rewards", data=ep.reward_array())  # (N,)
        g.create_dataset("terminations", data=ep.termination_array())  # (N,)
        g.create_dataset("truncations", data=ep.truncation_array())  # (N,)
        if ep.timestamps is not None:
            g.create_dataset("timestamps", data=np.asarray(ep.timestamps, np.float64))  # (N+1,)
        if ep.proposed_actions is not None:  # shadow mode (N, A)
            g.create_dataset("proposed_actions", data=np.asarray(ep.proposed_actions, np.float32))
        self._ids.add(int(ep.id))

    def _check_room(self, ep: Episode) -> None:
        """UserError before the episode is written when the disk (or the file-size limit) has no
        room for its uncompressed arrays: nothing is left under the final name."""
        arrays = [ep.observations, ep.actions, ep.inputs, ep.timestamps, ep.proposed_actions]
        arrays += list((ep.obs_groups or {}).values())
        need = sum(np.asarray(x).size * max(np.asarray(x).itemsize, 4) for x in arrays if x is not None)
        need += 10 * ep.num_steps + self.ROOM_MARGIN  # rewards (f8), terminations and truncations (bool)
        room = write_room(self._tmp)
        if need > room:
            raise UserError(
                f"no room to write {self.path}: episode {ep.id} needs up to {need / 2**20:.3g} MiB more, and the disk "
                f"(or the file-size limit) leaves {max(room, 0) / 2**20:.3g} MiB",
                "free disk space (or raise `ulimit -f`) and run the command again; nothing was written under that name",
            )

    def _check(self, ep: Episode) -> None:
        problems = []
        obs, act = np.asarray(ep.observations), np.asarray(ep.actions)
        if obs.ndim != 2 or act.ndim != 2:
            raise ValueError(
                f"episode {ep.id}: observations must be (N+1, D) and actions (N, A), got {obs.shape} and {act.shape}"
            )
        n = act.shape[0]
        e = 0 if ep.inputs is None else ep.inputs.shape[1]
        dims = (obs.shape[1], act.shape[1], e)
        if not (isinstance(ep.id, (int, np.integer)) and ep.id >= 0):
            problems.append(f"id must be a non-negative integer, got {ep.id!r}")
        elif int(ep.id) in self._ids:
            problems.append("id is already in the file")
        if obs.shape[0] != n + 1:
            problems.append(f"observations have {obs.shape[0]} rows, expected N+1 = {n + 1}")
        for name, x, rows in [
            ("inputs", ep.inputs, n),
            ("rewards", ep.rewards, n),
            ("terminations", ep.terminations, n),
            ("truncations", ep.truncations, n),
            ("timestamps", ep.timestamps, n + 1),
            ("proposed_actions", ep.proposed_actions, n),
        ]:
            if x is not None and x.shape[0] != rows:
                problems.append(f"{name} have {x.shape[0]} rows, expected {rows}")
        if ep.proposed_actions is not None and np.asarray(ep.proposed_actions).shape[1:] != act.shape[1:]:
            problems.append(
                f"proposed_actions must be (N, A) like actions {act.shape}, got {ep.proposed_actions.shape}"
            )
        if ep.inputs is not None and ep.inputs.ndim != 2:
            problems.append(f"inputs must be (N, E), got {ep.inputs.shape}")
        for key, x in ep.obs_groups.items():
            if key == L.STATE_KEY:
                problems.append(f"obs_groups may not use the reserved key {L.STATE_KEY!r}")
            if x.shape[0] != n + 1:
                problems.append(f"obs_groups[{key!r}] has {x.shape[0]} rows, expected {n + 1}")
        groups = {k: (tuple(x.shape[1:]), np.asarray(x).dtype) for k, x in ep.obs_groups.items()}
        if self._dims is None:
            for what, names, d in [
                ("observation", self.meta.observation_names, dims[0]),
                ("action", self.meta.action_names, dims[1]),
                ("input", self.meta.input_names, dims[2]),
            ]:
                if names and len(names) != d:
                    problems.append(f"{d} {what} columns but meta names {len(names)} {what} channels")
        else:
            if dims != self._dims:
                problems.append(f"(D, A, E) = {dims} differs from the first episode's {self._dims}")
            if groups != self._groups:
                problems.append(f"obs_groups {groups} differ from the first episode's {self._groups}")
        if problems:
            raise ValueError(f"episode {ep.id} cannot be written: " + "; ".join(problems))
        if self._dims is None:
            self._dims, self._groups = dims, groups

    def _write_file_attrs(self) -> None:
        if self._dims is None:
            raise ValueError(f"no episodes were added to {self.path}: a log needs at least one")
        write_meta_attrs(self._file.attrs, self.meta, self._dims)


def write_meta_attrs(attrs, m: LogMeta, dims: tuple[int, int, int]) -> None:
    """The file attributes of a log with metadata `m` and widths (D, A, E): the one writer of them
    (LogWriter, the Minari export); empty channel-name lists are generated for the widths."""
    d, a, e = dims
    attrs["format"] = FORMAT_NAME
    attrs["format_version"] = FORMAT_VERSION
    attrs["source"] = m.source
    if m.dt is not None:
        attrs["dt"] = float(m.dt)
    str_dtype = h5py.string_dtype()
    for key, names, prefix, n in [
        ("observation_names", m.observation_names, "obs", d),
        ("action_names", m.action_names, "action", a),
        ("input_names", m.input_names, "input", e),
    ]:
        attrs[key] = np.array(list(names) or _generated(prefix, n), dtype=str_dtype)
    attrs["units"] = json.dumps(m.units)
    if m.env_id is not None:
        attrs["env_id"] = m.env_id
        if m.env_kwargs:
            attrs["env_kwargs"] = json.dumps(m.env_kwargs)


def _minari_dt(path: Path) -> float | None:
    """A plain Minari file's step period, from the env spec of the metadata.json beside it (as
    `wmcheck import` takes it), so train / validate / check of a Minari dataset know it too."""
    from wmcheck.datasets.importers.minari_source import env_spec_dict, env_spec_dt, minari_metadata

    spec = env_spec_dict(minari_metadata(path))
    return env_spec_dt(spec)[0] if spec is not None else None


def write_log(path: str | os.PathLike, episodes: Iterable[Episode], meta: LogMeta) -> Path:
    """Write all episodes to `path` atomically; returns the path."""
    with LogWriter(path, meta) as writer:
        for ep in episodes:
            writer.add(ep)
    return Path(path)


# --- reading ----------------------------------------------------------------------------------


def outside_references(f: h5py.File) -> list[str]:
    """Every object of the file that would make a reader read outside it, or loop: external links,
    datasets with external raw storage, virtual datasets (their sources are other files or
    datasets), and soft links that dangle, loop or leave their episode group. One line each,
    naming the object; empty for a self-contained file. Reads metadata only."""
    found: list[str] = []
    seen: set = set()

    def episode_of(path: str) -> str:
        return "/" + path.strip("/").split("/")[0]

    def walk(group: h5py.Group, path: str) -> None:
        for name in group:
            where = f"{path.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                found.append(f"{where} is an external link to {link.filename}:{link.path}")
                continue
            if isinstance(link, h5py.SoftLink):
                target = link.path if link.path.startswith("/") else f"{path.rstrip('/')}/{link.path}"
                if target not in f or isinstance(f.get(target, getlink=True), (h5py.SoftLink, h5py.ExternalLink)):
                    found.append(f"{where} is a soft link to {link.path} that dangles or chains to another link")
                elif episode_of(target) != episode_of(where) or where.startswith(target.rstrip("/") + "/"):
                    found.append(f"{where} is a soft link to {link.path}, outside its episode or onto itself")
                continue
            try:
                obj = group[name]
            except (KeyError, OSError) as exc:
                found.append(f"{where} cannot be resolved ({exc})")
                continue
            token = hash(obj.id)  # the same for every link to one object (file number + object number)
            if token in seen:  # a hard link to an object already visited (a group cycle)
                if isinstance(obj, h5py.Group):
                    found.append(f"{where} is a hard link back to a group already visited (a loop)")
                continue
            seen.add(token)
            if isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    sources = sorted({m.file_name for m in obj.virtual_sources()})
                    found.append(f"{where} is a virtual dataset reading from {', '.join(sources)}")
                elif obj.external:
                    found.append(f"{where} is stored in external file(s) {', '.join(str(e[0]) for e in obj.external)}")
            elif isinstance(obj, h5py.Group):
                walk(obj, where)

    walk(f, "/")
    return found


def open_h5(path: str | os.PathLike) -> h5py.File:
    """Open an HDF5 file read-only, turning every way that fails into a UserError. A file whose
    objects point outside it (`outside_references`) is refused: a log handed to wmcheck must
    never make it read another file."""
    path = Path(path)
    if path.is_dir():
        hint = next((p for p in (path / "data" / "main_data.hdf5", path / "main_data.hdf5") if p.exists()), None)
        raise UserError(
            f"{path} is a folder, not a log file", f"pass the HDF5 file itself{f', e.g. {hint}' if hint else ''}"
        )
    if not path.exists():
        raise UserError(
            f"log file {path} does not exist",
            "check the path, or create the log with `wmcheck import` / `wmcheck record`",
        )
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UserError(
            f"{path} is not a readable HDF5 file (truncated or not HDF5: {exc})",
            "re-create it with `wmcheck import` or re-copy it; a file cut off during "
            "copying or writing cannot be repaired",
        ) from None
    try:
        outside = outside_references(f)
    except BaseException:
        f.close()
        raise
    if outside:
        f.close()
        more = f"; ... {len(outside) - 5} more" if len(outside) > 5 else ""
        raise UserError(
            f"{path} refers outside itself: " + "; ".join(outside[:5]) + more,
            "wmcheck reads only data stored inside the log (no external links, external storage, virtual "
            "datasets or soft links leaving an episode): re-create it with `wmcheck import` from the original data",
        )
    return f


class LogReader:
    """Lazy reader: opening reads the file attributes and the episode list only.

    Use as a context manager (`with open_log(path) as log:`) or call `close()`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open_h5(self.path)
        try:
            problems = L.check_format(self._file.attrs)
            if problems:
                raise UserError(
                    f"{self.path}: " + "; ".join(problems),
                    "upgrade wmcheck, or convert the file to format version "
                    f"{FORMAT_VERSION} with the wmcheck that wrote it",
                )
            self._groups = L.episode_index(self._file)
            if not self._groups:
                raise UserError(
                    f"{self.path} holds no episode groups (episode_<id>)",
                    "is this a wmcheck log or a Minari main_data.hdf5? Re-create it with `wmcheck import`",
                )
        except BaseException:
            self._file.close()
            raise
        self._meta: LogMeta | None = None
        self._classes: int | None = None
        self._obs_layouts: dict[int, L.ObsLayout] = {}

    # context manager / lifetime
    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    # index
    @property
    def episode_ids(self) -> list[int]:
        return list(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def _group(self, episode_id: int) -> h5py.Group:
        if episode_id not in self._groups:
            raise KeyError(
                f"episode {episode_id} is not in {self.path} "
                f"(ids {self.episode_ids[:5]}{'...' if len(self) > 5 else ''})"
            )
        return self._file[self._groups[episode_id]]

    def num_steps(self, episode_id: int) -> int:
        """N from the shape of `actions` (or the `total_steps` attribute); reads no data."""
        g = self._group(episode_id)
        if isinstance(g.get("actions"), h5py.Dataset):
            return int(g["actions"].shape[0])
        try:
            steps = L.int_attr(g.attrs, "total_steps")
        except L.LayoutError as exc:
            raise UserError(
                f"episode {episode_id} of {self.path}: {exc}", _VALIDATE_FIX.format(path=self.path)
            ) from None
        if steps is not None:
            return steps
        raise UserError(f"episode {episode_id} of {self.path} has no actions", _VALIDATE_FIX.format(path=self.path))

    @property
    def meta(self) -> LogMeta:
        """File metadata; names are generated from the first episode's shapes when not stored."""
        if self._meta is None:
            first = self._group(self.episode_ids[0])
            try:
                obs_names = self._obs_layout(self.episode_ids[0]).names if "observations" in first else []
                a = L.action_dim(first["actions"], self.num_action_classes) if "actions" in first else 0
                self._meta = L.meta_from_attrs(self._file.attrs, obs_names, _generated("action", a))
            except L.LayoutError as exc:
                raise UserError(f"{self.path}: {exc}", _VALIDATE_FIX.format(path=self.path)) from None
            if self._meta.dt is None and "format" not in self._file.attrs:
                self._meta.dt = _minari_dt(self.path)
        return self._meta

    @property
    def num_action_classes(self) -> int | None:
        """One-hot width of discrete (integer) actions, None when actions are continuous."""
        if self._classes is None:
            self._classes = L.discrete_action_classes(self._file, self.path, self._groups) or 0
        return self._classes or None

    def _obs_layout(self, episode_id: int) -> L.ObsLayout:
        if episode_id not in self._obs_layouts:
            self._obs_layouts[episode_id] = L.observation_layout(self._group(episode_id)["observations"])
        return self._obs_layouts[episode_id]

    # data
    def read(self, episode_id: int, groups: bool = True) -> Episode:
        """Load one episode; UserError listing every problem when it breaks the format's rules.

        groups=False leaves the extra observation groups (camera frames) in the file: `obs_groups`
        is then empty, and `frames` reads rows of them on demand."""
        g = self._group(episode_id)
        try:
            ep, problems = self._read(episode_id, g, groups)
        except L.LayoutError as exc:
            ep, problems = None, [str(exc)]
        except OSError as exc:
            raise UserError(
                f"could not read episode {episode_id} of {self.path}: {exc}",
                "the file is damaged (truncated?); re-create or re-copy it",
            ) from None
        if problems:
            raise UserError(
                f"episode {episode_id} of {self.path} breaks the log format: " + "; ".join(problems),
                _VALIDATE_FIX.format(path=self.path),
            )
        return ep

    def _read(self, episode_id: int, g: h5py.Group, load_groups: bool = True) -> tuple[Episode | None, list[str]]:
        nodes = {k: g[k] for k in g}  # each member looked up once (h5py lookups dominate reading)
        missing = [k for k in REQUIRED if k not in nodes]
        if missing:
            return None, [f"missing dataset(s) {', '.join(missing)}"]
        scalars = [k for k in PER_STEP if isinstance(nodes.get(k), h5py.Dataset) and nodes[k].ndim == 0]
        if scalars:
            return None, [f"{', '.join(scalars)}: scalar dataset(s); a per-step dataset has one row per step"]
        text = L.non_numeric(nodes, PER_STEP)
        if text:
            return None, [f"{k} holds {nodes[k].dtype} values, not numbers" for k in text]
        problems = []
        meta = self.meta
        lay = self._obs_layout(episode_id)
        obs = L.read_state(nodes["observations"], lay)  # (N+1, D)
        groups = L.read_groups(nodes["observations"], lay) if load_groups else {}  # {key: (N+1, ...)}
        if not load_groups:  # row counts of the groups left in the file are still checked
            groups_rows = {k: v for k, v in L.component_rows(nodes["observations"], lay).items() if k in lay.group_keys}
        actions = L.read_actions(nodes["actions"], self.num_action_classes)  # (N, A)
        n = actions.shape[0]
        steps = L.int_attr(g.attrs, "total_steps")  # a LayoutError (not a whole number) is a problem too
        if steps is not None and steps != n:  # validate's total_steps_mismatch
            problems.append(f"attribute total_steps={steps} but actions have {n} rows")
        inputs = L.read_vector(nodes["inputs"]) if "inputs" in nodes else None  # (N, E)
        rewards = np.asarray(nodes["rewards"][()], np.float32) if "rewards" in nodes else None  # (N,)
        terms = np.asarray(nodes["terminations"][()], bool)  # (N,)
        truncs = np.asarray(nodes["truncations"][()], bool)  # (N,)
        ts = np.asarray(nodes["timestamps"][()], np.float64) if "timestamps" in nodes else None  # (N+1,)
        proposed = L.read_vector(nodes["proposed_actions"]) if "proposed_actions" in nodes else None  # (N, A)
        expected = {
            "observations": (obs, n + 1),
            "inputs": (inputs, n),
            "rewards": (rewards, n),
            "terminations": (terms, n),
            "truncations": (truncs, n),
            "timestamps": (ts, n + 1),
            "proposed_actions": (proposed, n),
        }
        expected.update({f"observations/{k}": (x, n + 1) for k, x in groups.items()})
        if not load_groups:
            problems += [
                f"observations/{k} has {r} rows, expected {n + 1} (actions have {n})"
                for k, r in groups_rows.items()
                if r != n + 1
            ]
        for name, (x, rows) in expected.items():
            if x is not None and x.shape[0] != rows:
                problems.append(f"{name} has {x.shape[0]} rows, expected {rows} (actions have {n})")
        for name, x, names in [
            ("observations", obs, meta.observation_names),
            ("actions", actions, meta.action_names),
            ("inputs", inputs, meta.input_names),
        ]:
            d = 0 if x is None else x.shape[1]
            if (x is not None or names) and d != len(names):
                problems.append(f"{name} have {d} columns but the file names {len(names)} channels")
            if x is not None and not np.isfinite(x).all():
                problems.append(f"{name} contain {int((~np.isfinite(x)).sum())} NaN/inf values")
        if rewards is not None and not np.isfinite(rewards).all():
            problems.append("rewards contain NaN/inf values")
        if proposed is not None and (proposed.shape[1] != actions.shape[1] or not np.isfinite(proposed).all()):
            problems.append(f"proposed_actions must be finite and have the actions' {actions.shape[1]} columns")
        if ts is not None and ts.shape[0] > 1 and not (np.diff(ts) > 0).all():
            problems.append("timestamps are not strictly increasing")
        seed = g.attrs.get("seed")
        try:
            seed = None if seed is None else int(seed)
        except (TypeError, ValueError):  # older Minari wrote the string "None"
            seed = None
        name = g.attrs.get("name")
        ep = Episode(
            observations=obs,
            actions=actions,
            inputs=inputs,
            rewards=rewards,
            terminations=terms,
            truncations=truncs,
            timestamps=ts,
            obs_groups=groups,
            id=episode_id,
            seed=seed,
            name=None if name is None else L.attr_str(name),
            proposed_actions=proposed,
        )
        return ep, problems

    def episodes(self, ids: Iterable[int] | None = None, groups: bool = True) -> Iterator[Episode]:
        """Episodes one at a time (all, in id order, when `ids` is None); groups as in `read`."""
        for i in self.episode_ids if ids is None else ids:
            yield self.read(i, groups)

    def group_specs(self, episode_id: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """{group key: (per-row shape, dtype)} of an episode's extra observation groups; reads no data."""
        node = self._group(episode_id)["observations"]
        lay = self._obs_layout(episode_id)
        return {k: (tuple(node[k].shape[1:]), node[k].dtype) for k in lay.group_keys}

    def frames(self, episode_id: int, key: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of observation group `key` of one episode, e.g. (rows, H, W, C) uint8.

        Reads only the chunks of those rows (frames are stored one per chunk)."""
        node = self._group(episode_id)["observations"]
        if key not in self._obs_layout(episode_id).group_keys:
            raise KeyError(f"episode {episode_id} of {self.path} has no observation group {key!r}")
        return np.asarray(node[key][start:stop])

    def __iter__(self) -> Iterator[Episode]:
        return self.episodes()


def open_log(path: str | os.PathLike) -> LogReader:
    return LogReader(path)
