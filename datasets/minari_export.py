"""Export a wmcheck log as a Minari dataset that `minari.load_dataset(id)` reads (`wmcheck export`).

Owns writing Minari's on-disk layout (the 0.5.4 HDF5 format) with h5py alone, so exporting needs
no Minari install:

    <root>/<namespace>/namespace_metadata.json   one per namespace level, `{}` (when absent)
    <root>/<id>/data/metadata.json               total_episodes, total_steps, data_format "hdf5",
                                                 jpeg_encoding false, observation_space,
                                                 action_space, env_spec (when known), dataset_id,
                                                 minari_version, dataset_size, description, ...
    <root>/<id>/data/main_data.hdf5              episode_0 .. episode_{n-1}

Spaces are serialised as Minari serialises them (`serialize_space`: Box, Discrete, Dict, as JSON
strings). With a gymnasium env id (`env`, or the log's `env_id` file attribute, or the env_spec of a
Minari source) the env's own spaces and `EnvSpec.to_json()` are written; observations and actions
are reshaped to the env's Box shapes (and dtypes), and one-hot actions become the integers of a
Discrete space. Without one, both spaces are unbounded float32 Boxes of the log's widths. A log
with camera frames has a Dict observation space {"state": ..., "<group>": uint8 Box} and raw
(not JPEG) frames.

Each episode group holds what Minari reads (`observations`, `actions`, `rewards`, `terminations`,
`truncations`, attributes `id`, `total_steps`, `seed`), resizable and chunked as Minari writes them,
plus every per-episode array Minari does not know, kept as extra datasets of the group: `inputs`,
`timestamps`, `proposed_actions`, and any other member of the source group (a Minari `infos`
group, for instance). Episodes are renumbered 0..n-1 as Minari requires; an episode whose log id
differs keeps it as the attribute `wmcheck_id`, and its machine `name` too. The file attributes
of the log (source, dt, channel names, units) are copied, so `wmcheck import` / `train` of the
exported dataset get them back.

The dataset is written into a hidden temporary folder beside `<root>/<id>` (Minari skips hidden
folders) and renamed into place; on any error it is removed, so nothing is left under the final
name. An existing dataset is refused unless `force`; with `force` it is replaced only after the new
one is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from wmcheck.datasets.atomic import current_umask, fsync_dir
from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.minari_source import (
    DATASET_ID_RE,
    MAIN_FILE,
    METADATA_FILE,
    dataset_folder,
    env_spec_dict,
    minari_metadata,
    minari_root,
    resolve_dataset,
)
from wmcheck.datasets.logformat import open_h5, open_log

MINARI_FORMAT_VERSION = "0.5.4"
"""The Minari version whose layout this module writes (`minari_version` in metadata.json)."""
NAMESPACE_FILE = "namespace_metadata.json"
KNOWN = {"observations", "actions", "rewards", "terminations", "truncations"}
"""Episode members Minari reads; the log's other per-episode arrays are copied beside them."""
WRITTEN_EXTRAS = ("inputs", "timestamps", "proposed_actions")


@dataclass
class ExportResult:
    dataset_id: str
    path: Path
    """`<root>/<id>`, the dataset folder."""
    root: Path
    episodes: int
    steps: int
    env_id: str | None
    notes: list[str] = field(default_factory=list)


# --- spaces ------------------------------------------------------------------------------------


def serialize_space(space) -> dict:
    """A gymnasium Box / Discrete / Dict space as Minari's serialisation dict (json.dumps it)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "dtype": str(space.dtype),
            "shape": list(space.shape),
            "low": space.low.tolist(),
            "high": space.high.tolist(),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "subspaces": {k: serialize_space(s) for k, s in space.spaces.items()}}
    raise UserError(
        f"cannot export a {type(space).__name__} space to Minari here",
        "wmcheck exports Box, Discrete and Dict spaces; export without --env (unbounded Box spaces)",
    )


def _box_for(shape: tuple[int, ...], dtype) -> object:
    """The widest Box of this shape and dtype (unbounded floats, the integer type's range)."""
    import gymnasium as gym

    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    info = np.iinfo(dtype)
    return gym.spaces.Box(info.min, info.max, shape, dtype)


@dataclass
class _Plan:
    """How each episode's arrays become what the spaces promise."""

    obs_space: object
    action_space: object
    state_space: object  # the vector part (== obs_space without camera groups)
    env_spec_json: str | None
    discrete: bool
    action_start: int = 0


def _plan(meta: LogMeta, first: Episode, group_specs: dict, env_id: str | None, env_kwargs: dict | None, notes):
    import gymnasium as gym

    d, a = first.observations.shape[1], first.actions.shape[1]
    state = _box_for((d,), np.float32)
    action = _box_for((a,), np.float32)
    spec_json, discrete, start = None, False, 0
    if env_id is not None:
        from wmcheck.datasets.record import env_dt

        env, spec_json = _make_env(env_id, env_kwargs)
        try:
            o, act = env.observation_space, env.action_space
            dt, unknown = env_dt(env)
        finally:
            with contextlib.suppress(Exception):
                env.close()
        if isinstance(o, gym.spaces.Box) and int(np.prod(o.shape)) == d:
            state = o
        else:
            notes.append(
                f"the observation space of {env_id} ({o}) does not match the log's {d} channels: "
                f"exported as an unbounded Box of {d}"
            )
        if isinstance(act, gym.spaces.Box) and int(np.prod(act.shape)) == a:
            action = act
        elif isinstance(act, gym.spaces.Discrete) and int(act.n) == a:
            action, discrete, start = act, True, int(act.start)
        else:
            notes.append(
                f"the action space of {env_id} ({act}) does not match the log's {a} action channels: "
                f"exported as an unbounded Box of {a}"
            )
        if meta.dt is not None and not unknown and not np.isclose(dt, meta.dt, rtol=1e-6):
            notes.append(f"the log's dt {meta.dt:g} s differs from {env_id}'s {dt:g} s")
    obs = state
    if group_specs:
        obs = gym.spaces.Dict(
            {"state": state, **{k: _box_for(shape, dtype) for k, (shape, dtype) in group_specs.items()}}
        )
    return _Plan(obs, action, state, spec_json, discrete, start)


def _make_env(env_id: str, env_kwargs: dict | None):
    """(env, EnvSpec JSON) of a registered gymnasium id; UserError otherwise."""
    import dataclasses

    import gymnasium as gym

    from wmcheck.datasets.record import make_env

    if env_id not in gym.registry:
        import difflib

        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(
            f"{env_id!r} is not a registered gymnasium environment id, so it has no env_spec",
            f"give a registered id{hint}, or leave --env out (the spaces then come from the data, with no env_spec)",
        )
    spec = gym.spec(env_id)
    if env_kwargs:
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **env_kwargs})
    try:
        spec_json = spec.to_json()
    except (TypeError, ValueError) as exc:
        raise UserError(f"the env_spec of {env_id} cannot be written as JSON: {exc}", "check --env-kwargs") from None
    return make_env(env_id, env_kwargs), spec_json


def _log_env(path: Path) -> tuple[str | None, dict | None]:
    """The env id and kwargs a log names: `LogMeta.env_id` / `env_kwargs` (written by `wmcheck
    record`), else a Minari source's env_spec (its id and kwargs)."""
    with open_log(path) as reader:
        if reader.meta.env_id is not None:
            return reader.meta.env_id, reader.meta.env_kwargs
    spec = env_spec_dict(minari_metadata(path))
    if not spec:
        return None, None
    kwargs = spec.get("kwargs") if isinstance(spec.get("kwargs"), dict) else None
    return spec["id"], ({k: v for k, v in kwargs.items() if k != "render_mode"} or None) if kwargs else None


# --- writing -----------------------------------------------------------------------------------


def check_dataset_id(dataset_id: str) -> str:
    if not isinstance(dataset_id, str) or not DATASET_ID_RE.match(dataset_id):
        raise UserError(
            f"{dataset_id!r} is not a Minari dataset id",
            "give [namespace/]name-vN with letters, digits, '-' and '_', e.g. wmcheck/pendulum-real-v0",
        )
    return dataset_id


def export_minari(
    log: str | os.PathLike,
    dataset_id: str,
    root: str | os.PathLike | None = None,
    env: str | None = None,
    env_kwargs: dict | None = None,
    force: bool = False,
) -> ExportResult:
    """Write the log (or Minari dataset) `log` as the Minari dataset `dataset_id` under `root`
    (default: `minari_root()`); see the module doc."""
    check_dataset_id(dataset_id)
    src = Path(log)
    if not src.exists() and not DATASET_ID_RE.match(str(log)):
        raise UserError(
            f"log file {log} does not exist", "check the path; create logs with `wmcheck record` or `wmcheck import`"
        )
    src = resolve_dataset(log)
    root = Path(root) if root is not None else minari_root()
    if root.exists() and not root.is_dir():
        raise UserError(f"--out {root} is a file, not a folder", "give the Minari datasets root folder")
    target = dataset_folder(root, dataset_id)
    if target.exists() or target.is_symlink():
        if not force:
            raise UserError(
                f"a Minari dataset {dataset_id} already exists at {target}",
                "give --force to replace it, or export under another id (e.g. a new -vN version)",
            )
        if not (target / "data" / METADATA_FILE).is_file() and not (target / "data" / MAIN_FILE).is_file():
            raise UserError(
                f"{target} exists and is not a Minari dataset (no data/{METADATA_FILE}): --force will not delete it",
                "choose another dataset id or root",
            )
        if src.resolve().is_relative_to(target.resolve()):
            raise UserError(f"{log} is inside the dataset {target} it would replace", "export under another id")
    env_id, named_kwargs = (env, None) if env is not None else _log_env(src)
    if env is None and env_kwargs is None:
        env_kwargs = named_kwargs  # the kwargs the log's env was made with
    notes: list[str] = []
    with open_log(src) as reader, open_h5(src) as raw:
        meta = reader.meta
        first = reader.read(reader.episode_ids[0])
        plan = _plan(meta, first, reader.group_specs(reader.episode_ids[0]), env_id, env_kwargs, notes)
        with _dataset_folder(target) as tmp:
            data = tmp / "data"
            data.mkdir()
            episodes, steps = _write_main(data / MAIN_FILE, reader, raw, meta, plan)
            metadata = _metadata(dataset_id, plan, meta, src, episodes, steps, data / MAIN_FILE)
            _write_json(data / METADATA_FILE, metadata)
            if target.exists():
                _replace_folder(tmp, target)
    _write_namespaces(root, dataset_id)
    return ExportResult(dataset_id, target, root, episodes, steps, env_id if plan.env_spec_json else None, notes)


def _write_main(path: Path, reader, raw: h5py.File, meta: LogMeta, plan: _Plan) -> tuple[int, int]:
    total = 0
    with h5py.File(path, "w", track_order=True) as f:
        for index, ep_id in enumerate(reader.episode_ids):
            ep = reader.read(ep_id)
            g = f.create_group(f"episode_{index}")
            g.attrs["id"] = index
            if ep.seed is not None:
                g.attrs["seed"] = int(ep.seed)
            g.attrs["total_steps"] = ep.num_steps
            if ep_id != index:
                g.attrs["wmcheck_id"] = int(ep_id)
            if ep.name is not None:
                g.attrs["name"] = str(ep.name)
            n = ep.num_steps
            state = np.asarray(ep.observations).reshape(n + 1, *plan.state_space.shape)
            state = state.astype(plan.state_space.dtype)
            if ep.obs_groups:
                og = g.create_group("observations")
                _dataset(og, "state", state)
                for key, x in ep.obs_groups.items():
                    _dataset(og, key, np.asarray(x), frames=True)
            else:
                _dataset(g, "observations", state)
            _dataset(g, "actions", _actions(ep, plan, ep_id))
            _dataset(g, "rewards", ep.reward_array())
            _dataset(g, "terminations", ep.termination_array())
            _dataset(g, "truncations", ep.truncation_array())
            if ep.inputs is not None and ep.inputs.shape[1] > 0:
                _dataset(g, "inputs", np.asarray(ep.inputs, np.float32))
            if ep.timestamps is not None:
                _dataset(g, "timestamps", np.asarray(ep.timestamps, np.float64))
            if ep.proposed_actions is not None:
                _dataset(g, "proposed_actions", np.asarray(ep.proposed_actions, np.float32))
            source_group = raw[f"episode_{ep_id}"]
            for key in source_group:  # what neither Minari nor wmcheck reads, kept as it is
                if key not in KNOWN and key not in g:
                    raw.copy(source_group[key], g, key)
            total += n
        _file_attrs(f, reader, meta, plan)
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())  # the bytes are on disk before the folder is renamed into place
    return len(reader.episode_ids), total


def _actions(ep: Episode, plan: _Plan, ep_id: int) -> np.ndarray:
    a = np.asarray(ep.actions)
    if not plan.discrete:
        return a.reshape(a.shape[0], *plan.action_space.shape).astype(plan.action_space.dtype)
    one_hot = (np.isin(a, (0.0, 1.0)).all(axis=1)) & (a.sum(axis=1) == 1)
    if not one_hot.all():
        row = int(np.argmin(one_hot))
        raise UserError(
            f"episode {ep_id}: action row {row} is not one-hot, so it is not an action of the Discrete space "
            f"{plan.action_space}",
            "export without --env (the actions then stay a Box of their columns), or give the env they came from",
        )
    return (a.argmax(axis=1) + plan.action_start).astype(np.int64)


def _dataset(g: h5py.Group, name: str, x: np.ndarray, frames: bool = False) -> None:
    """A dataset as Minari creates them: chunked and resizable along the rows (frames: one per chunk, gzip)."""
    rows = (1, *x.shape[1:]) if frames or x.shape[0] == 0 else True
    if frames and x.size == 0:
        rows = None
    g.create_dataset(
        name,
        data=x,
        chunks=rows,
        maxshape=(None, *x.shape[1:]) if rows is not None else None,
        compression="gzip" if frames and rows is not None else None,
    )


def _file_attrs(f: h5py.File, reader, meta: LogMeta, plan: _Plan) -> None:
    """The log's own attributes, so that wmcheck reads the dataset back with its names, dt and env."""
    from wmcheck.datasets.logformat import write_meta_attrs

    dims = (len(meta.observation_names), len(meta.action_names), len(meta.input_names))
    write_meta_attrs(f.attrs, meta, dims)
    if plan.discrete:
        f.attrs["num_action_classes"] = int(plan.action_space.n)


def _metadata(dataset_id, plan: _Plan, meta: LogMeta, src: Path, episodes: int, steps: int, main: Path) -> dict:
    from wmcheck.datasets.version import version

    out = {
        "total_episodes": episodes,
        "total_steps": steps,
        "data_format": "hdf5",
        "jpeg_encoding": False,  # camera frames are stored raw, as the log has them
        "observation_space": json.dumps(serialize_space(plan.obs_space)),
        "action_space": json.dumps(serialize_space(plan.action_space)),
    }
    if plan.env_spec_json is not None:
        out["env_spec"] = plan.env_spec_json
    dt = f", dt {meta.dt:g} s" if meta.dt is not None else ""
    out.update(
        {
            "dataset_id": dataset_id,
            "algorithm_name": "wmcheck export",
            "description": f"exported by wmcheck {version()} from {src.name} (source {meta.source}{dt}); "
            "per-episode inputs / timestamps, when the log has them, are extra datasets of each episode group",
            "minari_version": MINARI_FORMAT_VERSION,
            "wmcheck_source": meta.source,
            "dataset_size": round(main.stat().st_size / 1e6, 1),
        }
    )
    return out


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_namespaces(root: Path, dataset_id: str) -> None:
    """`namespace_metadata.json` ({}) in each namespace folder that lacks one, as Minari's create_namespace."""
    parts = dataset_id.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        p = root.joinpath(*parts[:i]) / NAMESPACE_FILE
        if not p.exists():
            from wmcheck.datasets.atomic import write_text_atomic

            write_text_atomic(p, "{}")


@contextlib.contextmanager
def _dataset_folder(target: Path) -> Iterator[Path]:
    """A hidden temporary folder beside `target`, renamed onto it on success (when `target` does
    not exist; `_replace_folder` swaps it in otherwise); removed, with any folder it had to create
    above it, on error."""
    created = []
    parent = target.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a dataset gets the usual permissions
    try:
        yield tmp
        if tmp.exists():  # not swapped in by _replace_folder
            os.rename(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:  # innermost first; only the ones this export made, and only if empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _replace_folder(new: Path, target: Path) -> None:
    """Put the complete `new` folder at `target`, deleting the old dataset only once `new` is there."""
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    old.rmdir()
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
