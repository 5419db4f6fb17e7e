"""How the log format's HDF5 nodes map to arrays: shared by the reader (logformat) and the validator.

This module owns the parts of the layout that are not "one dataset, one array":

- which groups are episodes: `episode_<id>` with `<id>` a non-negative integer (other keys ignored);
- the observation layout, resolved from shapes only (no data read), in three forms:
  1. `observations` is a dataset (N+1, D) — or (N+1,) read as D=1, or (N+1, ...) flattened per step;
  2. `observations` is a group holding `state` (N+1, D): `state` is the vector state and every other
     key (e.g. `image` (N+1, H, W, C) uint8) is an extra observation group;
  3. `observations` is a group without `state` (a plain Minari Dict/Tuple observation space): the
     vector state is the concatenation of the numeric keys, walked depth first in sorted key order,
     each flattened per step; names are `key[i]` (or `key` for a per-step scalar). Image-like keys
     (uint8 with 3 dims per step, (N+1, H, W, C)) go to the extra observation groups instead.
- actions: a float dataset (N, A) (or (N,) → A=1). Integer actions of shape (N,) are discrete
  (Minari `Discrete` spaces) and become one-hot float32 (N, K). K, the number of classes, comes
  from, in order: the file attribute `num_action_classes`; the `n` of a Discrete `action_space` in
  the `metadata.json` Minari keeps beside `main_data.hdf5`; otherwise max(action) + 1 over the whole
  file. Integer actions with more dims per step (MultiDiscrete) are cast to float, not one-hot.
- file attributes → `LogMeta`. A file without wmcheck's attributes (a plain Minari file) gets
  `source="sim"` — Minari datasets are recorded from gymnasium environments by construction — with
  `dt=None` and generated names `obs_0..`, `action_0..`. A wmcheck file (it has `format`) that lacks
  `source` gets LogMeta's default, "real".

Layout problems raise `LayoutError` (a ValueError); the reader turns it into a UserError, the
validator into a finding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from wmcheck.datasets.episode import FORMAT_NAME, FORMAT_VERSION, LogMeta

EPISODE_RE = re.compile(r"^episode_(\d+)$")
STATE_KEY = "state"


class LayoutError(ValueError):
    """The HDF5 structure does not map onto the log format."""


def episode_index(f: h5py.File) -> dict[int, str]:
    """{episode id: group name} for every `episode_<id>` group (the id is taken from the name)."""
    out = {}
    for name, node in f.items():
        m = EPISODE_RE.match(name)
        if m and isinstance(node, h5py.Group):
            out[int(m.group(1))] = name
    return dict(sorted(out.items()))


def is_image_like(ds: h5py.Dataset) -> bool:
    """uint8 with 3 dims per step: (rows, H, W, C)."""
    return ds.dtype == np.uint8 and ds.ndim == 4


def _is_numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf"


def width(ds: h5py.Dataset) -> int:
    """Channels of a per-step dataset (rows first); LayoutError for a scalar, which has no rows."""
    if ds.ndim == 0:
        raise LayoutError(f"{ds.name} is a scalar dataset; a per-step dataset has one row per step")
    return int(np.prod(ds.shape[1:], dtype=np.int64)) if ds.ndim > 1 else 1


def non_numeric(nodes, keys) -> list[str]:
    """The datasets among `keys` of a group (or a dict of its members) whose values are not numbers
    or booleans (text, complex, compound): no per-step dataset may hold them."""
    return [k for k in keys if isinstance(nodes.get(k), h5py.Dataset) and not _is_numeric(nodes[k].dtype)]


def int_attr(attrs, name: str) -> int | None:
    """An integer attribute (`total_steps`, `id`, ...), None when absent; LayoutError naming it
    when it is not a whole number (a string, NaN, 2.5)."""
    if name not in attrs:
        return None
    value = attrs[name]
    try:
        out = int(value)
        if float(value) != out:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise LayoutError(f"attribute {name}={value!r} is not a whole number") from None
    return out


def _leaves(group: h5py.Group, prefix: str = "") -> list[tuple[str, h5py.Dataset]]:
    """Datasets under `group`, depth first, sorted key order; paths relative to `group`."""
    out = []
    for key in sorted(group.keys()):
        node = group[key]
        path = f"{prefix}{key}"
        if isinstance(node, h5py.Group):
            out.extend(_leaves(node, path + "/"))
        else:
            out.append((path, node))
    return out


@dataclass
class ObsLayout:
    """Where an episode's vector state and extra observation groups live inside `observations`."""

    kind: str  # "dataset" | "state" | "dict"
    vector_keys: list[str]  # paths relative to `observations` ("" = the dataset itself)
    widths: list[int]  # columns each vector key contributes
    names: list[str]  # default channel names, one per column
    group_keys: list[str] = field(default_factory=list)  # extra observation groups (images, ...)

    @property
    def dim(self) -> int:
        return int(sum(self.widths))


def observation_layout(node: h5py.Dataset | h5py.Group) -> ObsLayout:
    """Resolve the observation layout from shapes and dtypes only."""
    if isinstance(node, h5py.Dataset):
        if not _is_numeric(node.dtype):
            raise LayoutError(f"observations have non-numeric dtype {node.dtype}")
        w = width(node)
        return ObsLayout("dataset", [""], [w], [f"obs_{i}" for i in range(w)])
    if STATE_KEY in node and isinstance(node[STATE_KEY], h5py.Dataset):
        state = node[STATE_KEY]
        if not _is_numeric(state.dtype):
            raise LayoutError(f"observations/state has non-numeric dtype {state.dtype}")
        w = width(state)
        extra = [p for p, _ in _leaves(node) if p != STATE_KEY]
        return ObsLayout("state", [STATE_KEY], [w], [f"obs_{i}" for i in range(w)], extra)
    keys, widths, names, extra = [], [], [], []
    for path, ds in _leaves(node):
        if is_image_like(ds):
            extra.append(path)
        elif _is_numeric(ds.dtype):
            w = width(ds)
            keys.append(path)
            widths.append(w)
            names.extend([path] if ds.ndim == 1 else [f"{path}[{i}]" for i in range(w)])
        else:
            raise LayoutError(f"observations/{path} has non-numeric dtype {ds.dtype}")
    if not keys and not extra:
        raise LayoutError("the observations group is empty")
    return ObsLayout("dict", keys, widths, names, extra)


def component(node: h5py.Dataset | h5py.Group, key: str) -> h5py.Dataset:
    return node if key == "" else node[key]


def read_state(node, layout: ObsLayout, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows [start, stop) of the vector state as float32, (rows, D)."""
    parts = []
    for key in layout.vector_keys:
        ds = component(node, key)
        x = ds[start:stop]
        parts.append(np.asarray(x, np.float32).reshape(x.shape[0], width(ds)))  # (rows, w)
    if not parts:
        rows = len(range(*slice(start, stop).indices(component(node, layout.group_keys[0]).shape[0])))
        return np.zeros((rows, 0), np.float32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)  # (rows, D)


def read_groups(node, layout: ObsLayout) -> dict[str, np.ndarray]:
    return {key: np.asarray(node[key][()]) for key in layout.group_keys}


def component_rows(node, layout: ObsLayout) -> dict[str, int]:
    """Row count of every observation component, keyed by its path ("" = the dataset itself)."""
    return {k: int(component(node, k).shape[0]) for k in layout.vector_keys + layout.group_keys}


# --- actions ----------------------------------------------------------------------------------


def is_discrete(ds: h5py.Dataset) -> bool:
    return ds.dtype.kind in "iu" and ds.ndim == 1


MAX_ACTION_CLASSES = 4096
"""The most one-hot classes a discrete action may have: every class becomes a model input channel,
so a file claiming 10**15 classes would exhaust memory before anything else could fail."""


def discrete_action_classes(f: h5py.File, path: Path, episodes: dict[int, str]) -> int | None:
    """Number of one-hot classes when the file's actions are discrete, else None (see module doc);
    a LayoutError above MAX_ACTION_CLASSES, whichever source the number came from."""
    n = _discrete_action_classes(f, path, episodes)
    if n is not None and not 1 <= n <= MAX_ACTION_CLASSES:
        raise LayoutError(
            f"discrete actions with {n} classes (the file attribute, Minari metadata or the largest action "
            f"value says so); wmcheck one-hot encodes at most {MAX_ACTION_CLASSES}"
        )
    return n


def _discrete_action_classes(f: h5py.File, path: Path, episodes: dict[int, str]) -> int | None:
    datasets = [
        f[g]["actions"]
        for g in episodes.values()
        if isinstance(f[g].get("actions"), h5py.Dataset) and is_discrete(f[g]["actions"])
    ]
    if not datasets:
        return None
    if "num_action_classes" in f.attrs:
        return int(f.attrs["num_action_classes"])
    n = _minari_discrete_n(path)
    if n is not None:
        return n
    lo = min((int(ds[()].min()) for ds in datasets if ds.shape[0]), default=0)
    hi = max((int(ds[()].max()) for ds in datasets if ds.shape[0]), default=0)
    if lo < 0:
        raise LayoutError(f"discrete actions must be >= 0 to be one-hot encoded, found {lo}")
    return hi + 1


def _minari_discrete_n(path: Path) -> int | None:
    meta_path = Path(path).with_name("metadata.json")
    try:
        space = json.loads(meta_path.read_text()).get("action_space")
        if isinstance(space, str):
            space = json.loads(space)
        if space.get("type") == "Discrete" and int(space.get("start", 0)) == 0:
            return int(space["n"])
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass
    return None


def action_dim(ds: h5py.Dataset | h5py.Group, num_classes: int | None) -> int:
    if isinstance(ds, h5py.Group):
        raise LayoutError(
            "actions stored as a group (a Dict/Tuple action space) are not supported: "
            "flatten them into one (N, A) dataset when importing"
        )
    if not _is_numeric(ds.dtype):
        raise LayoutError(f"actions have non-numeric dtype {ds.dtype}")
    if is_discrete(ds):
        if num_classes is None:
            raise LayoutError("discrete actions found but the number of classes is unknown")
        return num_classes
    return width(ds)


def _rows(ds: h5py.Dataset, start: int, stop: int | None) -> np.ndarray:
    """Rows [start, stop) of a per-step dataset; a scalar dataset (no rows at all) is a LayoutError."""
    if ds.ndim == 0:
        raise LayoutError(f"{ds.name} is a scalar dataset; a per-step dataset has one row per step")
    return np.asarray(ds[start:stop])


def _as_matrix(x: np.ndarray) -> np.ndarray:
    """(rows, ...) -> (rows, width) float32; zero rows keep the dataset's width."""
    return x.astype(np.float32).reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))


def read_actions(ds: h5py.Dataset, num_classes: int | None, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows [start, stop) of the actions as float32 (rows, A); discrete actions one-hot."""
    x = _rows(ds, start, stop)
    if is_discrete(ds):
        k = action_dim(ds, num_classes)
        if x.size and (x.min() < 0 or x.max() >= k):
            raise LayoutError(f"discrete action values must lie in [0, {k}), found [{x.min()}, {x.max()}]")
        return np.eye(k, dtype=np.float32)[x]  # (rows, K)
    return _as_matrix(x)  # (rows, A)


PER_STEP_OPTIONAL = ("inputs", "rewards", "terminations", "truncations", "timestamps", "proposed_actions")
"""The per-step datasets besides `actions` (N rows each; N + 1 for timestamps)."""


def read_vector(ds: h5py.Dataset, start: int = 0, stop: int | None = None) -> np.ndarray:
    """A (rows, ...) numeric dataset as float32 (rows, width)."""
    return _as_matrix(_rows(ds, start, stop))


# --- file attributes --------------------------------------------------------------------------


def str_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        value = [value]
    return [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(value).ravel()]


def attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_format(attrs) -> list[str]:
    """Problems with `format`/`format_version` that make the file unreadable by this version."""
    problems = []
    if "format" in attrs and attr_str(attrs["format"]) != FORMAT_NAME:
        problems.append(f"file attribute format={attr_str(attrs['format'])!r}, expected {FORMAT_NAME!r}")
    if "format_version" in attrs:
        try:
            version = int(attrs["format_version"])
        except (TypeError, ValueError):
            problems.append(f"format_version {attrs['format_version']!r} is not an integer")
        else:
            if version > FORMAT_VERSION:
                problems.append(f"format_version {version} is newer than this wmcheck supports ({FORMAT_VERSION})")
            elif version < 1:
                problems.append(f"format_version {version} is not a valid version")
    return problems


def _json_object(attrs, key: str, shape: str, problems: list[str]) -> dict | None:
    """The file attribute `key` as a JSON object; None when absent, and a problem when it is not one."""
    if key not in attrs:
        return None
    try:
        value = json.loads(attr_str(attrs[key]))
    except ValueError:
        value = None
    if not isinstance(value, dict):
        problems.append(f"{key} is not a JSON object {shape}")
        return None
    return value


def meta_from_attrs(attrs, obs_names: list[str], action_names: list[str]) -> LogMeta:
    """LogMeta from file attributes; names fall back to the given generated ones.

    Raises LayoutError naming every bad attribute.
    """
    problems = []
    source = attr_str(attrs["source"]) if "source" in attrs else ("real" if "format" in attrs else "sim")
    dt = None
    if "dt" in attrs:
        try:
            dt = float(attrs["dt"])
        except (TypeError, ValueError):
            problems.append(f"dt {attrs['dt']!r} is not a number")
    units = _json_object(attrs, "units", "{channel: unit}", problems) or {}
    env_id = attr_str(attrs["env_id"]) if "env_id" in attrs else None
    env_kwargs = _json_object(attrs, "env_kwargs", "{name: value}", problems)
    try:
        meta = LogMeta(
            source=source,
            dt=dt,
            observation_names=str_list(attrs.get("observation_names")) or obs_names,
            action_names=str_list(attrs.get("action_names")) or action_names,
            input_names=str_list(attrs.get("input_names")),
            units={str(k): str(v) for k, v in units.items()},
            format_version=int(attrs.get("format_version", FORMAT_VERSION)),
            env_id=env_id,
            env_kwargs=env_kwargs,
        )
    except ValueError as exc:
        problems.append(str(exc))
        meta = None
    if problems:
        raise LayoutError("; ".join(problems))
    return meta
