"""Minari datasets (`main_data.hdf5`, or an existing wmcheck log) copied into a wmcheck log.

Reading goes through the log reader (`open_log`), which already understands Minari's layout (dict
observations, discrete actions, missing attributes) and rejects broken episodes with every problem
listed. This module only replaces the file attributes a plain Minari file lacks: `source`, `dt` and
channel names, from `CopyOptions` (the command-line flags). Episodes are streamed one at a time, so
datasets larger than memory copy fine; ids and seeds are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.importers.mapping import CopyOptions
from wmcheck.datasets.importers.summary import ImportResult, ImportSummary
from wmcheck.datasets.logformat import open_log


def import_minari(path: str | Path, options: CopyOptions) -> ImportResult:
    """An ImportResult whose `episodes` is a generator over the source file (closed when exhausted).

    The summary's episode and step counts are filled in as the generator runs."""
    path = Path(path)
    if path.is_dir():  # a Minari dataset folder: <name>/data/main_data.hdf5
        for cand in (path / "data" / "main_data.hdf5", path / "main_data.hdf5"):
            if cand.is_file():
                path = cand
                break
    reader = open_log(path)
    try:
        src = reader.meta
        first = reader.read(reader.episode_ids[0])
        d, a = first.observations.shape[1], first.actions.shape[1]
        e = first.input_array().shape[1]
        meta = LogMeta(
            source=options.source or src.source,
            dt=options.dt if options.dt is not None else src.dt,
            observation_names=options.names("observation", src.observation_names, d, "--obs-cols"),
            action_names=options.names("action", src.action_names, a, "--action-cols"),
            input_names=options.names("input", src.input_names, e, "--input-cols"),
            units={**src.units, **options.units},
        )
    except BaseException:
        reader.close()
        raise
    s = ImportSummary(source_path=str(path), rows_read=0, dt=meta.dt)
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
