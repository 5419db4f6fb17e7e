"""Camera frames of a window stream, read from the HDF5 log on demand.

Owns `FrameStream`: the image counterpart of `WindowSampler`'s in-memory vector stream. The stream is
the concatenation of the chosen episodes' N+1 rows; a window [s, s+T) may cross episode boundaries.
`window(key, s, T)` reads only the rows of that window from each episode it touches (frames are
stored one per gzip chunk, so a read decompresses exactly those frames). The log file is opened on
the first read and kept open; `close()` releases it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class FrameStream:
    def __init__(
        self,
        path: str | os.PathLike,
        episode_ids: Sequence[int],
        rows: Sequence[int],
        specs: dict[str, tuple[tuple[int, ...], np.dtype]],
    ):
        """episode_ids / rows: the stream's episodes in order and their row counts (N+1 each);
        specs: {key: (per-row shape, dtype)} of the image groups."""
        self.path = Path(path)
        self.episode_ids = [int(i) for i in episode_ids]
        self.offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)  # (episodes + 1,)
        self.specs = dict(specs)
        self._log = None

    @property
    def keys(self) -> list[str]:
        return list(self.specs)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _reader(self):
        if self._log is None:
            from wmcheck.datasets.logformat import open_log

            self._log = open_log(self.path)
        return self._log

    def window(self, key: str, start: int, length: int) -> np.ndarray:
        """Stream rows [start, start + length) of group `key`: (length, H, W, C)."""
        stop = start + length
        if not 0 <= start < stop <= len(self):
            raise IndexError(f"window [{start}, {stop}) outside the stream of {len(self)} rows")
        shape, dtype = self.specs[key]
        out = np.empty((length, *shape), dtype)  # (T, H, W, C)
        e = int(np.searchsorted(self.offsets, start, side="right")) - 1  # episode holding `start`
        pos = start
        while pos < stop:
            lo, hi = int(self.offsets[e]), int(self.offsets[e + 1])
            end = min(stop, hi)
            out[pos - start : end - start] = self._reader().frames(self.episode_ids[e], key, pos - lo, end - lo)
            pos, e = end, e + 1
        return out

    def batch(self, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """Windows at `starts` (B,): {key: (B, T, H, W, C)}."""
        return {k: np.stack([self.window(k, int(s), length) for s in starts]) for k in self.keys}

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __getstate__(self):  # an open HDF5 handle does not travel to worker processes
        state = dict(self.__dict__)
        state["_log"] = None
        return state
