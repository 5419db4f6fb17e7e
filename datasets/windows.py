"""The training view: DreamerV3's step alignment, and fixed-length windows sampled from a stream.

Step view of one episode with N steps (`episode_steps`), N+1 rows, t = 0..N:

    obs[t]          = normalised o_t                          (N+1, D)
    prev_action[t]  = normalised a_{t-1};  exactly 0 at t = 0  (N+1, A)
    prev_input[t]   = normalised u_{t-1};  exactly 0 at t = 0  (N+1, E)   (E may be 0)
    reward[t]       = r_{t-1}, raw (the reward that arrived with o_t); 0 at t = 0   (N+1,)
    is_first[t]     = t == 0
    is_last[t]      = t == N
    is_terminal[t]  = t == N and terminations[N-1]   (a truncated episode is last, not terminal)

`WindowSampler` concatenates the chosen episodes' step views into one stream, as DreamerV3's
replay does, and samples windows of T consecutive steps anywhere in it, so a window may cross
episode boundaries (the next episode begins with is_first = True and zero prev_action/reward).

Forced start. Every window starts with is_first = True (the world model starts each window from
its initial state). Where that start is forced (the window begins mid-episode) we also zero
prev_action, prev_input and reward at column 0: after the reset there is no state that the action,
input or reward from before the window could be explained by, and a forced start then looks exactly
like a real episode start, which is what the model sees at evaluation. The cost is one reward target
per window. Then `is_last |= next step's is_first` inside the window (already true in the stream,
where step N precedes the next episode's step 0; kept as an invariant).

Memory: the sampler holds its episodes' vector step views (normalised float32) in memory. Camera
frames stay in the log when the source is a file: each sampled window reads only its own frames
(`frames.FrameStream`). Episodes given in memory keep their frames in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from wmcheck.datasets.episode import Episode
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.frames import FrameStream
from wmcheck.datasets.normalize import Normalizer

BATCH_FIELDS = ("obs", "prev_action", "prev_input", "reward", "is_first", "is_last", "is_terminal")

MIN_CONTEXT = 4
"""The fewest observed steps before imagining (`fitted_geometry`): a vector state is filtered into
the posterior within a few steps, and a log whose episodes end sooner still gets blocks."""
MIN_HORIZON = 8
"""The fewest imagined steps of a block or an open-loop window (`fitted_geometry`), and the horizon
of the corrections' objective, whose 8-step windows tile each block (checks/sysid.py)."""


def fitted_geometry(lengths: Sequence[int], context: int, horizon: int) -> tuple[int, int]:
    """(context, horizon) of the blocks that held-out episodes of `lengths` steps (step views:
    observations, actions + 1) allow, from the asked (context, horizon).

    A block must fit the median episode, so that at least half of them give one: the horizon
    shrinks first, down to MIN_HORIZON, then the context, down to MIN_CONTEXT. Episodes that end
    sooner than the asked block are a property of the task (a hopper that falls, a pendulum
    episode of 50 steps), not a reason to stop: without this rule a log whose median episode has
    15 steps could not be calibrated at all. When even MIN_CONTEXT + MIN_HORIZON does not fit the
    median, or nothing is given, the asked geometry is returned (cutting blocks then says which
    episodes are too short)."""
    if not len(lengths):
        return context, horizon
    median = int(np.median(lengths))
    if median >= context + horizon:
        return context, horizon
    h = max(min(horizon, median - context), min(horizon, MIN_HORIZON))
    c = min(context, median - h)
    if c < min(context, MIN_CONTEXT):
        return context, horizon
    return c, h


_ARRAYS = BATCH_FIELDS


@dataclass
class StepArrays:
    """Step view of one episode (or of a stream of them): T = N+1 rows per episode."""

    obs: np.ndarray  # (T, D) float32
    prev_action: np.ndarray  # (T, A) float32
    prev_input: np.ndarray  # (T, E) float32
    reward: np.ndarray  # (T,) float32
    is_first: np.ndarray  # (T,) bool
    is_last: np.ndarray  # (T,) bool
    is_terminal: np.ndarray  # (T,) bool
    images: dict[str, np.ndarray] = field(default_factory=dict)  # {key: (T, H, W, C) uint8}

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[StepArrays]) -> StepArrays:
        keys = set(parts[0].images)
        for p in parts:
            if set(p.images) != keys:
                raise ValueError(f"episodes differ in observation groups: {sorted(keys)} vs {sorted(p.images)}")
        return cls(
            *(np.concatenate([getattr(p, a) for p in parts]) for a in _ARRAYS),
            images={k: np.concatenate([p.images[k] for p in parts]) for k in keys},
        )


@dataclass
class Batch:
    """A batch of windows, time on axis 1. Fields are numpy arrays, or tensors after `to_torch`."""

    obs: np.ndarray  # (B, T, D) float32, normalised
    prev_action: np.ndarray  # (B, T, A) float32, normalised; 0 where is_first
    prev_input: np.ndarray  # (B, T, E) float32, normalised; 0 where is_first
    reward: np.ndarray  # (B, T) float32, raw; 0 where is_first
    is_first: np.ndarray  # (B, T) bool
    is_last: np.ndarray  # (B, T) bool
    is_terminal: np.ndarray  # (B, T) bool
    images: dict[str, np.ndarray] = field(default_factory=dict)  # {key: (B, T, H, W, C) uint8}

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T)."""
        return tuple(self.reward.shape)

    def check(self) -> Batch:
        """Assert that every field is (B, T, ...) with the same B and T."""
        bt = tuple(self.reward.shape)
        assert len(bt) == 2, f"reward must be (B, T), got {bt}"
        for name in ("obs", "prev_action", "prev_input"):
            shape = tuple(getattr(self, name).shape)
            assert len(shape) == 3 and shape[:2] == bt, f"{name} must be (B, T, C) = {bt} + (C,), got {shape}"
        for name in ("is_first", "is_last", "is_terminal"):
            assert tuple(getattr(self, name).shape) == bt, f"{name} must be {bt}, got {getattr(self, name).shape}"
        for key, x in self.images.items():
            assert tuple(x.shape[:2]) == bt and len(x.shape) == 5, (
                f"images[{key}] must be (B, T, H, W, C), got {x.shape}"
            )
        return self

    def start_from_initial_state(self) -> Batch:
        """Make column 0 of every window an episode start, in place, and return self: `is_first`
        True, and for windows cut mid-episode the previous action, input and reward zeroed, so
        every window starts from the model's initial state exactly as an episode does. The one
        place of this alignment: training windows, check blocks and their sub-windows use it."""
        forced = ~self.is_first[:, 0]  # (B,) windows that start mid-episode
        self.is_first[:, 0] = True
        self.prev_action[forced, 0] = 0.0
        self.prev_input[forced, 0] = 0.0
        self.reward[forced, 0] = 0.0
        return self

    def map(self, fn) -> Batch:
        """A new Batch with `fn` applied to every array (images included): slicing, moving, copying."""
        return Batch(*(fn(getattr(self, a)) for a in _ARRAYS), images={k: fn(v) for k, v in self.images.items()})

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """Concatenate numpy Batches along the batch axis."""
        return cls(
            *(np.concatenate([getattr(b, a) for b in batches]) for a in _ARRAYS),
            images={k: np.concatenate([b.images[k] for b in batches]) for k in batches[0].images},
        )

    def to_torch(self, device="cpu") -> Batch:
        """The same batch as torch tensors on `device` (bool masks stay bool, images stay uint8)."""
        import torch

        def t(x):
            return torch.as_tensor(np.ascontiguousarray(x), device=device)

        return Batch(*(t(getattr(self, a)) for a in _ARRAYS), images={k: t(v) for k, v in self.images.items()})


def episode_steps(ep: Episode, normalizer: Normalizer) -> StepArrays:
    """The per-episode step view (module docstring): N+1 rows."""
    n = ep.num_steps
    obs = normalizer.norm_obs(ep.observations).astype(np.float32)  # (N+1, D)
    if obs.shape[0] != n + 1:
        raise ValueError(f"episode {ep.id}: {obs.shape[0]} observation rows for {n} steps (need N+1)")
    act = normalizer.norm_action(ep.actions)  # (N, A)
    inp = normalizer.norm_input(ep.input_array())  # (N, E)
    prev_action = np.zeros((n + 1, act.shape[1]), np.float32)  # (N+1, A)
    prev_action[1:] = act
    prev_input = np.zeros((n + 1, inp.shape[1]), np.float32)  # (N+1, E)
    prev_input[1:] = inp
    reward = np.zeros(n + 1, np.float32)  # (N+1,)
    reward[1:] = ep.reward_array()
    is_first = np.zeros(n + 1, bool)
    is_first[0] = True
    is_last = np.zeros(n + 1, bool)
    is_last[n] = True
    is_terminal = np.zeros(n + 1, bool)
    is_terminal[n] = n > 0 and bool(ep.termination_array()[n - 1])
    images = {k: np.asarray(v) for k, v in ep.obs_groups.items()}  # {key: (N+1, H, W, C)}
    return StepArrays(obs, prev_action, prev_input, reward, is_first, is_last, is_terminal, images)


def episode_batch(ep: Episode, normalizer: Normalizer) -> Batch:
    """One whole episode as a Batch with B = 1 and T = N+1 (its step view, from the initial state)."""
    return _whole(episode_steps(ep, normalizer)).check()


def _whole(s: StepArrays) -> Batch:
    """A stream's rows as one Batch (1, N+1, ...), unchecked."""
    return _batch_of(s, np.arange(len(s))[None, :])


def _batch_of(s: StepArrays, idx: np.ndarray) -> Batch:
    """Gather rows `idx` (B, T) of a stream into a Batch."""
    return Batch(
        *(getattr(s, a)[idx] for a in _ARRAYS),  # each (B, T, ...)
        images={k: v[idx] for k, v in s.images.items()},
    )


class WindowSampler:
    """Uniformly random windows of `length` steps from the stream of the chosen episodes.

    `source` is a log path (episodes are read from it) or a list of Episodes; `episode_ids` picks
    and orders the episodes of the stream (None = all, in id order for a log, list order otherwise).
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[Episode],
        episode_ids: Sequence[int] | None,
        normalizer: Normalizer,
        length: int,
    ):
        if length < 1:
            raise ValueError(f"window length must be >= 1, got {length}")
        self.normalizer, self.length = normalizer, int(length)
        self._source = source
        self._steps: dict[int, StepArrays] = {}
        for ep in self._load(episode_ids):
            self._steps[ep.id] = episode_steps(ep, normalizer)
        if not self._steps:
            raise UserError("no episodes to sample windows from", "pass at least one episode id")
        self.episode_ids = list(self._steps)
        self._stream = StepArrays.concat(list(self._steps.values()))
        self.frames: FrameStream | None = None
        if self._lazy:
            from wmcheck.datasets.logformat import open_log

            with open_log(self._source) as log:
                specs = log.group_specs(self.episode_ids[0])
            if specs:
                self.frames = FrameStream(self._source, self.episode_ids, [len(s) for s in self._steps.values()], specs)
        if len(self._stream) < self.length:
            raise UserError(
                f"the chosen episodes hold {len(self._stream)} steps in all, fewer than the "
                f"window length {self.length}",
                "use a shorter sequence length or more (or longer) episodes",
            )

    @property
    def _lazy(self) -> bool:
        """Frames are read from the log file on demand (the source is a path)."""
        return isinstance(self._source, (str, os.PathLike))

    def _load(self, ids: Sequence[int] | None) -> Iterator[Episode]:
        if self._lazy:
            from wmcheck.datasets.logformat import open_log

            with open_log(self._source) as log:
                yield from log.episodes(ids, groups=False)
            return
        by_id: dict[int, Episode] = {}
        for ep in self._source:
            if ep.id in by_id:
                raise ValueError(f"two episodes share id {ep.id}")
            by_id[ep.id] = ep
        for i in by_id if ids is None else ids:
            if i not in by_id:
                raise KeyError(f"episode {i} is not among the given episodes {sorted(by_id)}")
            yield by_id[i]

    @property
    def num_steps(self) -> int:
        """Steps in the stream (sum of N+1 over its episodes)."""
        return len(self._stream)

    @property
    def num_windows(self) -> int:
        return len(self._stream) - self.length + 1

    def sample(self, rng: np.random.Generator, batch_size: int) -> Batch:
        """`batch_size` windows with uniformly random starts among all windows inside the stream."""
        T = self.length
        starts = rng.integers(0, self.num_windows, size=batch_size)  # (B,)
        idx = starts[:, None] + np.arange(T)[None, :]  # (B, T)
        b = _batch_of(self._stream, idx)
        if self.frames is not None:
            b.images = self.frames.batch(starts, T)  # {key: (B, T, H, W, C)}, read from the file
        b.start_from_initial_state()
        b.is_last[:, :-1] |= b.is_first[:, 1:]
        return b.check()

    def episodes(self, ids: Sequence[int] | None = None) -> Iterator[Batch]:
        """Whole episodes, one Batch each with B = 1 and T = N+1 (for evaluation)."""
        ids = self.episode_ids if ids is None else list(ids)
        missing = [i for i in ids if i not in self._steps]
        extra = {ep.id: episode_steps(ep, self.normalizer) for ep in self._load(missing)} if missing else {}
        for i in ids:
            s = self._steps[i] if i in self._steps else extra[i]
            b = _whole(s)  # (1, N+1, ...)
            if self._lazy and not b.images:
                b.images = self._episode_frames(i, len(s))
            yield b.check()

    def _episode_frames(self, episode_id: int, rows: int) -> dict[str, np.ndarray]:
        """All frames of one episode from the log: {key: (1, N+1, H, W, C)}."""
        from wmcheck.datasets.logformat import open_log

        with open_log(self._source) as log:
            return {k: log.frames(episode_id, k, 0, rows)[None] for k in log.group_specs(episode_id)}
