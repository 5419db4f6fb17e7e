"""Cutting episodes into blocks: the unit every check scores and every statistic resamples.

Owns `Blocks`: windows of `context + horizon` consecutive steps inside single episodes, in the
training view's alignment (normalised, `is_first` at column 0 so each block starts from the
model's initial state, exactly as in training and in calibration), with the episode and start
step of each. Calibration and checks cut blocks the same way, so their scores are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.endings import terminates
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.windows import BATCH_FIELDS, Batch, episode_steps


@dataclass
class Blocks:
    batch: Batch  # numpy arrays (n, L, ...)
    episode: np.ndarray  # (n,) episode id of each block
    start: np.ndarray  # (n,) first step of each block inside its episode
    context: int
    skipped: dict[int, int] = field(default_factory=dict)  # episode id -> steps, too short for a block
    ending: np.ndarray | None = None  # (n,) bool: the block's last step is its episode's termination

    def __post_init__(self):
        if self.ending is None:
            self.ending = np.zeros(len(self.episode), bool)

    def __len__(self) -> int:
        return int(self.episode.shape[0])

    @property
    def length(self) -> int:
        return int(self.batch.obs.shape[1])

    def subset(self, idx) -> Blocks:
        idx = np.asarray(idx)
        return Blocks(
            self.batch.map(lambda x: x[idx]),
            self.episode[idx],
            self.start[idx],
            self.context,
            dict(self.skipped),
            self.ending[idx],
        )

    def with_controls(self, prev_action: np.ndarray | None = None, prev_input: np.ndarray | None = None) -> Blocks:
        """The same blocks with replaced (normalised) controls (n, L, A) / (n, L, E)."""
        return self._replaced(prev_action=prev_action, prev_input=prev_input)

    def with_observations(self, obs: np.ndarray) -> Blocks:
        """The same blocks with replaced (normalised) observations (n, L, D)."""
        return self._replaced(obs=obs)

    def _replaced(self, **arrays: np.ndarray | None) -> Blocks:
        """A copy whose batch holds the given arrays (float32) instead of its own; the others are
        shared, not copied."""
        b = self.batch.map(lambda x: x)
        for name, value in arrays.items():
            if value is not None:
                setattr(b, name, value.astype(np.float32))
        return Blocks(b, self.episode, self.start, self.context, dict(self.skipped), self.ending)

    def windows(self, horizon: int) -> tuple[Blocks, np.ndarray]:
        """Short windows inside every block: `context` observed + `horizon` imagined steps, starting
        every `horizon` steps (so their imagined parts tile the block), each aligned like a block
        (`is_first` at column 0, from the model's initial state). Returns (windows, parent) with
        parent (n_windows,) the index of each window's block."""
        W = self.context + horizon
        offsets = list(range(0, self.length - W + 1, horizon))
        if not offsets:
            raise ValueError(f"blocks of {self.length} steps are shorter than a window of {W}")
        parts, parent, starts = [], [], []
        for o in offsets:
            part = self.batch.map(lambda x, o=o: x[:, o : o + W].copy())
            if o > 0:  # a window inside a block starts from the initial state, as every block does
                part.start_from_initial_state()
            parts.append(part)
            parent.append(np.arange(len(self)))
            starts.append(self.start + o)
        parent = np.concatenate(parent)
        last = np.concatenate([np.full(len(self), o + W == self.length) for o in offsets])  # (n_windows,)
        return Blocks(
            Batch.concat(parts),
            self.episode[parent],
            np.concatenate(starts),
            self.context,
            dict(self.skipped),
            self.ending[parent] & last,
        ), parent

    def torch_chunks(self, chunk: int, device="cpu"):
        """Yield (slice, tensor Batch) chunks of at most `chunk` blocks."""
        for s in range(0, len(self), chunk):
            sl = slice(s, min(s + chunk, len(self)))
            yield sl, self.batch.map(lambda x, sl=sl: x[sl]).to_torch(device)


def block_starts(steps: int, length: int, stride: int, terminated: bool) -> list[int]:
    """First steps of the windows of an episode view of `steps` steps. Windows run from the start
    (the rest, under a block, is not scored), except in an episode that terminates: there they run
    back from the end, so that its last window holds the last `length` steps that led to the
    termination (a fall, a trip) and the windows before it hold none of those. Cut from the start, a fall lands in a
    window only when the episode's length happens to fit, partly and by chance."""
    if steps < length:
        return []
    if terminated:
        return list(range(steps - length, -1, -stride))[::-1]
    return list(range(0, steps - length + 1, stride))


def make_blocks(
    episodes: list[Episode], normalizer: Normalizer, context: int, horizon: int, stride: int | None = None
) -> Blocks:
    """Cut each episode's step view (N+1 steps) into windows of L = context + horizon steps.

    Windows are `stride` steps apart (default L: non-overlapping) and never cross episodes.
    Episodes with fewer than L steps are listed in `skipped`. In an episode that terminates the
    windows run back from the termination (`block_starts`), and the last one is marked `ending`:
    the divergence tests leave those to the ending test (divergence.py).
    """
    L = context + horizon
    stride = stride or L
    parts, frames, eps, starts, ending, skipped = [], [], [], [], [], {}
    for ep in episodes:
        s = episode_steps(ep, normalizer)
        n = len(s)
        if n < L:
            skipped[ep.id] = n
            continue
        terminated = terminates(ep)
        for st in block_starts(n, L, stride, terminated):
            parts.append({f: getattr(s, f)[st : st + L] for f in BATCH_FIELDS})
            frames.append({k: v[st : st + L] for k, v in s.images.items()})  # camera frames, if any
            eps.append(ep.id)
            starts.append(st)
            ending.append(terminated and st + L == n)
    if not parts:
        raise ValueError(f"no episode has the {L} steps (context {context} + horizon {horizon}) a block needs")
    arrays = {f: np.stack([p[f] for p in parts]) for f in BATCH_FIELDS}  # each (n, L, ...)
    images = {k: np.stack([f[k] for f in frames]) for k in frames[0]}  # {key: (n, L, H, W, C)}
    batch = Batch(**arrays, images=images).start_from_initial_state()  # as in training
    return Blocks(batch, np.asarray(eps), np.asarray(starts), context, skipped, np.asarray(ending, bool))


def block_states(blocks: Blocks, k: int = 8) -> np.ndarray:
    """k evenly spaced visited states per block, (n, k, D + A + E) normalised: obs with the control
    that led there. Used by the distribution two-sample test (whole blocks are the units)."""
    steps = np.linspace(blocks.context, blocks.length - 1, k).round().astype(int)
    b = blocks.batch
    return np.concatenate([b.obs[:, steps], b.prev_action[:, steps], b.prev_input[:, steps]], -1).astype(np.float32)


def block_controls(blocks: Blocks) -> np.ndarray:
    """The controls acting on every horizon step t >= C, (n, H, A + E) normalised: the command and
    the exogenous inputs that led to observation t (the operating conditions of that step)."""
    b, C = blocks.batch, blocks.context
    return np.concatenate([b.prev_action[:, C:], b.prev_input[:, C:]], -1).astype(np.float32)
