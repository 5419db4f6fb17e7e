"""Minari datasets (`main_data.hdf5`, or an existing wmcheck log) copied into a wmcheck log, and
the rules for reading Minari datasets that every command shares.

Owns:
- where a command-line argument points (`resolve_dataset`, used by `import`, `train` and
  `validate` alike): an existing file is itself; a Minari dataset folder (`<id>/` or `<id>/data/`)
  is its `main_data.hdf5`; a Minari dataset id (`[namespace/]name-vN`) that is not a path is looked
  up in the local Minari root (`minari_root`: `$MINARI_DATASETS_PATH`, else `~/.minari/datasets`,
  through Minari's own function when Minari is installed);
- the step period of a Minari dataset (`env_spec_dt`): from the `env_spec` in its `metadata.json`,
  by making the environment (gymnasium, checker off, no rendering) and reading `dt` as
  `wmcheck record` does (`env.unwrapped.dt`, else 1 / `render_fps`); when the env cannot be made,
  from the spec's kwargs (`dt`, else `timestep` x `frame_skip`); else unknown;
- the reality rule (`reality_warning`): a log is real data only when its wmcheck `source` file
  attribute says "real" (written by `wmcheck import` of tables, by `--source real`, and kept by
  `wmcheck export`). A `source` of sim / policy, and a plain Minari file (no `source` attribute:
  Minari datasets are recorded from gymnasium environments by construction, and an `env_spec`
  names the simulator), are simulated; `wmcheck train` warns when it trains on one as reality.

Reading goes through the log reader (`open_log`), which already understands Minari's layout (dict
observations, discrete actions, missing attributes) and rejects broken episodes with every problem
listed. `import_minari` only replaces the file attributes a plain Minari file lacks: `source`, `dt`
and channel names, from `CopyOptions` (the command-line flags), with `dt` from the env spec when
neither the flags nor the file give one. Episodes are streamed one at a time, so datasets larger
than memory copy fine; ids and seeds are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import CopyOptions
from wmcheck.datasets.importers.summary import ImportResult, ImportSummary
from wmcheck.datasets.logformat import open_h5, open_log

MAIN_FILE = "main_data.hdf5"
METADATA_FILE = "metadata.json"
DATASET_ID_RE = re.compile(r"^(?:(?P<namespace>[-_\w][-_\w/]*[-_\w]+)/)?(?P<name>[-_\w]+?)-v(?P<version>\d+)$")
"""A Minari dataset id, `[namespace/]name-vN` (Minari's own pattern, with the version it requires)."""


# --- where a dataset is ------------------------------------------------------------------------


def minari_root() -> Path:
    """The local Minari datasets folder: Minari's own answer when it is installed (it creates the
    folder), else the same rule by hand: `$MINARI_DATASETS_PATH`, else `~/.minari/datasets`."""
    try:
        from minari.storage.datasets_root_dir import get_dataset_path
    except Exception:  # not installed, or broken against this gymnasium: the rule is documented
        env = os.environ.get("MINARI_DATASETS_PATH")
        return Path(env) if env else Path.home() / ".minari" / "datasets"
    return Path(get_dataset_path())


def is_dataset_id(text: str) -> bool:
    return bool(DATASET_ID_RE.match(str(text)))


def dataset_folder(root: str | os.PathLike, dataset_id: str) -> Path:
    """`<root>/<id>`: the folder Minari keeps a dataset in (its files are in `<id>/data/`)."""
    return Path(root) / dataset_id


def resolve_dataset(arg: str | os.PathLike) -> Path:
    """The HDF5 file a LOG / SRC argument names (see the module doc). A path that does not exist
    and is not a dataset id is returned as it is, for the caller's own "does not exist" error."""
    path = Path(arg)
    if path.is_file():
        return path
    if path.is_dir():
        return _main_file(path, str(arg))
    if is_dataset_id(str(arg)):
        root = minari_root()
        folder = dataset_folder(root, str(arg))
        if folder.is_dir():
            return _main_file(folder, str(arg))
        raise UserError(
            f"{arg} is neither a file nor a Minari dataset in the local Minari root {root}",
            "check the path or the id (`minari list local`), download the dataset with "
            f"`minari download {arg}`, or set MINARI_DATASETS_PATH to the root that holds it",
        )
    return path


def _main_file(folder: Path, arg: str) -> Path:
    for cand in (folder / "data" / MAIN_FILE, folder / MAIN_FILE):
        if cand.is_file():
            return cand
    meta = _read_metadata(folder / "data" / METADATA_FILE) or _read_metadata(folder / METADATA_FILE) or {}
    if meta.get("data_format") not in (None, "hdf5"):
        raise UserError(
            f"{arg} is a Minari dataset stored as {meta['data_format']!r}; wmcheck reads Minari's hdf5 format",
            "re-create it with data_format='hdf5' (minari.create_dataset_from_buffers / DataCollector)",
        )
    raise UserError(
        f"{arg} is a folder without a Minari {MAIN_FILE} (looked in {folder / 'data'} and {folder})",
        "pass a log file, a Minari dataset folder (<id>/ or <id>/data/) or a dataset id",
    )


def _read_metadata(path: Path) -> dict | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def minari_metadata(path: str | os.PathLike) -> dict | None:
    """The `metadata.json` Minari keeps beside `main_data.hdf5` (None when there is none)."""
    return _read_metadata(Path(path).with_name(METADATA_FILE))


# --- the env spec ------------------------------------------------------------------------------


def env_spec_dict(metadata: dict | None) -> dict | None:
    """The `env_spec` of a Minari metadata.json as a dict (None when absent or unreadable)."""
    spec = (metadata or {}).get("env_spec")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("id"), str) else None


def env_spec_dt(spec: dict) -> tuple[float | None, str]:
    """(step period in seconds or None, how it was found) from an env spec dict (see module doc)."""
    made = _dt_by_making(spec)
    if made is not None:
        return made, f"from {spec['id']} (made from the dataset's env_spec)"
    kwargs = spec.get("kwargs") if isinstance(spec.get("kwargs"), dict) else {}
    if _positive(kwargs.get("dt")):
        return float(kwargs["dt"]), f"from the dt kwarg of the env_spec of {spec['id']}"
    step = next((kwargs[k] for k in ("timestep", "time_step") if _positive(kwargs.get(k))), None)
    if step is not None:
        skip = kwargs.get("frame_skip", 1)
        if _positive(skip):
            return float(step) * float(skip), f"from the timestep x frame_skip kwargs of the env_spec of {spec['id']}"
    return None, f"the env_spec of {spec['id']} does not give it (the env cannot be made here)"


def _dt_by_making(spec: dict) -> float | None:
    """dt of the env the spec makes, or None when it cannot be made here (missing package, ...)."""
    try:
        import gymnasium as gym
        from gymnasium.envs.registration import EnvSpec

        from wmcheck.datasets.record import env_dt
    except ImportError:
        return None
    fields = {f.name for f in dataclasses.fields(EnvSpec) if f.init}
    kwargs = dict(spec.get("kwargs") or {})
    if "render_mode" in kwargs:
        kwargs["render_mode"] = None  # never open a window to read a number
    env = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            clean = {k: v for k, v in spec.items() if k in fields and k != "additional_wrappers"}
            clean["kwargs"] = kwargs
            env = gym.make(EnvSpec(**clean), disable_env_checker=True)
            dt, unknown = env_dt(env)
        except Exception:  # any failure to make it means "not cheaply made here": fall back to kwargs
            return None
        finally:
            if env is not None:
                with contextlib.suppress(Exception):
                    env.close()
    return None if unknown else dt


def _positive(x) -> bool:
    try:
        return x is not None and not isinstance(x, bool) and math.isfinite(float(x)) and float(x) > 0
    except (TypeError, ValueError):
        return False


# --- real or simulated -------------------------------------------------------------------------


def reality_warning(path: str | os.PathLike) -> str | None:
    """Why the log at `path` is not real data (the module doc's rule), or None when it is."""
    path = Path(path)
    with open_log(path) as reader:  # the reader's rule: a wmcheck log without a source is real
        source = reader.meta.source
    if source == "real":
        return None
    with open_h5(path) as f:
        marked = "source" in f.attrs
    spec = env_spec_dict(minari_metadata(path))
    if marked:
        why = f"{path} is marked source {source!r} (it was recorded from a simulator or a policy)"
    elif spec is not None:
        why = (
            f"{path} is a Minari dataset recorded from the gymnasium environment {spec['id']} "
            "(its metadata.json has an env_spec) and is not marked as real data"
        )
    else:
        why = f"{path} is a Minari dataset that is not marked as real data (no wmcheck source attribute)"
    return (
        f"{why}: training on it learns that simulator, not reality, so checks against it measure a "
        "simulator-to-simulator gap. If it is real data, import it with "
        "`wmcheck import SRC --out LOG.h5 --source real` and train on LOG.h5"
    )


# --- import ------------------------------------------------------------------------------------


def import_minari(path: str | Path, options: CopyOptions) -> ImportResult:
    """An ImportResult whose `episodes` is a generator over the source file (closed when exhausted).

    `path` is a file, a Minari dataset folder or a dataset id (`resolve_dataset`). The summary's
    episode and step counts are filled in as the generator runs."""
    path = resolve_dataset(path)
    reader = open_log(path)
    notes = []
    try:
        src = reader.meta
        first = reader.read(reader.episode_ids[0])
        d, a = first.observations.shape[1], first.actions.shape[1]
        e = first.input_array().shape[1]
        with open_h5(path) as raw:
            stored = "dt" in raw.attrs  # else the reader's dt, if any, is the env spec's: say so below
        dt = options.dt if options.dt is not None else (src.dt if stored else None)
        spec = env_spec_dict(minari_metadata(path))
        if dt is None and spec is not None:
            dt, how = env_spec_dt(spec)
            notes.append(f"step period {f'{dt:g} s ' if dt is not None else ''}{how}")
        if options.source is None and src.source != "real" and spec is not None:
            notes.append(
                f"read as source {src.source!r}: recorded from {spec['id']}; give --source real if it is real data"
            )
        meta = LogMeta(
            source=options.source or src.source,
            dt=dt,
            observation_names=options.names("observation", src.observation_names, d, "--obs-cols"),
            action_names=options.names("action", src.action_names, a, "--action-cols"),
            input_names=options.names("input", src.input_names, e, "--input-cols"),
            units={**src.units, **options.units},
            env_id=src.env_id,
            env_kwargs=src.env_kwargs,
        )
    except BaseException:
        reader.close()
        raise
    s = ImportSummary(source_path=str(path), rows_read=0, dt=meta.dt, notes=notes)
    if meta.dt is None:
        s.notes.append("the source has no step period: give --dt SECONDS so that checks can report time")
    return ImportResult(episodes=_stream(reader, s), meta=meta, summary=s)


def _stream(reader, s: ImportSummary) -> Iterator[Episode]:
    with reader:
        for ep_id in reader.episode_ids:
            ep = reader.read(ep_id)
            s.episodes_produced += 1
            s.steps_produced += ep.num_steps
            s.rows_read += ep.num_steps + 1
            yield ep
    if s.episodes_produced == 0:  # the reader refuses files without episodes; keep the promise anyway
        raise UserError(f"{reader.path} holds no episodes", "check the file")
