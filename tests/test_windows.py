"""The training view: pinned DreamerV3 alignment, windows across episodes, forced starts."""

from __future__ import annotations

import numpy as np
import pytest

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import write_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.windows import Batch, WindowSampler, episode_steps


def identity(d=1, a=1, e=1) -> Normalizer:
    """A normaliser that leaves values unchanged, so the tests can read raw values back."""
    z = lambda n: (np.zeros(n), np.ones(n))  # noqa: E731
    return Normalizer({"obs": z(d), "action": z(a), "input": z(e)})


def pinned(n: int, base: int = 0, terminated: bool = False, images: bool = False, id: int = 0) -> Episode:
    """obs row k = base + 10k, action k = base + 100 + k, input k = base + 500 + k, reward k = base + 1000 + k."""
    k = np.arange(n + 1, dtype=np.float32)
    return Episode(
        observations=(base + 10 * k)[:, None],  # (N+1, 1)
        actions=(base + 100 + k[:n])[:, None],  # (N, 1)
        inputs=(base + 500 + k[:n])[:, None],  # (N, 1)
        rewards=base + 1000 + k[:n],  # (N,)
        terminations=np.arange(n) == n - 1 if terminated else np.zeros(n, bool),
        truncations=np.zeros(n, bool) if terminated else np.arange(n) == n - 1,
        obs_groups={"cam": np.full((n + 1, 2, 2, 3), base // 10000, np.uint8) + k[:, None, None, None].astype(np.uint8)}
        if images
        else {},
        id=id,
    )


def test_episode_steps_alignment_is_pinned():
    s = episode_steps(pinned(4, terminated=True), identity())
    # t:                      0    1     2     3     4
    np.testing.assert_array_equal(s.obs[:, 0], [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(s.prev_action[:, 0], [0, 100, 101, 102, 103])
    np.testing.assert_array_equal(s.prev_input[:, 0], [0, 500, 501, 502, 503])
    np.testing.assert_array_equal(s.reward, [0, 1000, 1001, 1002, 1003])
    np.testing.assert_array_equal(s.is_first, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(s.is_last, [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(s.is_terminal, [0, 0, 0, 0, 1])
    assert s.obs.dtype == s.prev_action.dtype == s.reward.dtype == np.float32
    assert s.is_first.dtype == bool


def test_truncated_episode_is_last_not_terminal():
    s = episode_steps(pinned(3, terminated=False), identity())
    np.testing.assert_array_equal(s.is_last, [0, 0, 0, 1])
    assert not s.is_terminal.any()


def test_prev_action_is_exactly_zero_at_first_step_after_normalising():
    norm = Normalizer({"obs": ([5.0], [2.0]), "action": ([100.0], [4.0]), "input": ([500.0], [3.0])})
    s = episode_steps(pinned(3), norm)
    assert s.prev_action[0, 0] == 0.0 and s.prev_input[0, 0] == 0.0
    np.testing.assert_allclose(s.prev_action[1:, 0], (np.array([100, 101, 102]) - 100) / 4)
    np.testing.assert_allclose(s.obs[:, 0], (np.array([0, 10, 20, 30]) - 5) / 2)
    np.testing.assert_array_equal(s.reward, [0, 1000, 1001, 1002])  # rewards stay raw


def test_no_inputs_gives_zero_width():
    ep = pinned(3)
    ep.inputs = None
    s = episode_steps(ep, identity(e=0))
    assert s.prev_input.shape == (4, 0)


def stream_sampler(T: int, images: bool = False) -> WindowSampler:
    # Episode A (id 0): 3 steps, 4 rows (stream 0..3); episode B (id 1): 4 steps, 5 rows (stream 4..8).
    eps = [pinned(3, base=0, terminated=True, images=images, id=0), pinned(4, base=20000, images=images, id=1)]
    return WindowSampler(eps, None, identity(), T)


def test_windows_cross_episode_boundaries():
    sampler = stream_sampler(T=5)
    assert (sampler.num_steps, sampler.num_windows) == (9, 5)
    rng = np.random.default_rng(0)
    batch = sampler.sample(rng, 64)
    starts = (batch.obs[:, 0, 0] // 10).astype(int)  # works for episode A; B starts are >= 2000
    crossing = [b for b in range(64) if batch.obs[b, 0, 0] < 20000 and starts[b] in (1, 2)]
    assert crossing, "no window crossed the boundary"
    b = crossing[0]
    j = 4 - starts[b]  # column of B's first step inside the window
    assert batch.is_first[b, j] and batch.prev_action[b, j, 0] == 0 and batch.reward[b, j] == 0
    assert batch.prev_input[b, j, 0] == 0
    assert batch.is_last[b, j - 1] and batch.is_terminal[b, j - 1]  # A terminated
    assert batch.obs[b, j, 0] == 20000 and batch.prev_action[b, j + 1, 0] == 20100
    assert batch.reward[b, j + 1] == 21000
    assert batch.is_first[b].sum() == 2 and batch.is_last[b].sum() == 1


def test_forced_first_at_column_zero():
    sampler = stream_sampler(T=3)
    batch = sampler.sample(np.random.default_rng(1), 200)
    assert batch.is_first[:, 0].all()
    mid = batch.obs[:, 0, 0] == 20020  # window starting at B's step 2 (mid-episode)
    assert mid.any()
    assert (batch.prev_action[mid, 0] == 0).all() and (batch.prev_input[mid, 0] == 0).all()
    assert (batch.reward[mid, 0] == 0).all()
    # the rest of the window is untouched
    assert (batch.prev_action[mid, 1, 0] == 20102).all() and (batch.reward[mid, 1] == 21002).all()
    assert not batch.is_first[mid, 1:].any()


def test_every_window_start_is_sampled_uniformly():
    sampler = stream_sampler(T=4)
    batch = sampler.sample(np.random.default_rng(2), 3000)
    counts = np.unique(batch.obs[:, 0, 0], return_counts=True)[1]
    assert len(counts) == sampler.num_windows == 6
    assert counts.min() > 400 and counts.max() < 600


def test_batch_shapes_b_ne_t_and_torch():
    sampler = stream_sampler(T=3, images=True)
    batch = sampler.sample(np.random.default_rng(3), 5)
    assert batch.shape == (5, 3)
    assert batch.obs.shape == (5, 3, 1) and batch.prev_action.shape == (5, 3, 1)
    assert batch.prev_input.shape == (5, 3, 1) and batch.reward.shape == (5, 3)
    assert batch.images["cam"].shape == (5, 3, 2, 2, 3) and batch.images["cam"].dtype == np.uint8
    np.testing.assert_array_equal(
        batch.images["cam"][:, :, 0, 0, 0] % 100,
        (batch.obs[:, :, 0] % 20000 // 10).astype(np.uint8) + np.where(batch.obs[:, :, 0] >= 20000, 2, 0),
    )
    import torch

    t = batch.to_torch("cpu")
    assert isinstance(t, Batch) and t.obs.shape == (5, 3, 1) and t.obs.dtype == torch.float32
    assert t.is_first.dtype == torch.bool and t.images["cam"].dtype == torch.uint8
    t.check()


def test_episodes_iterates_whole_episodes():
    sampler = stream_sampler(T=2)
    batches = list(sampler.episodes())
    assert [b.shape for b in batches] == [(1, 4), (1, 5)]
    np.testing.assert_array_equal(batches[1].obs[0, :, 0], 20000 + 10 * np.arange(5))
    assert batches[1].is_first[0, 0] and batches[1].is_last[0, -1] and not batches[1].is_terminal.any()


def test_stream_shorter_than_window_is_a_clear_error():
    with pytest.raises(UserError, match="fewer than the window length"):
        stream_sampler(T=10)


def test_sampler_reads_a_log_and_selects_episodes(tmp_path):
    eps = [pinned(3, base=0, id=0), pinned(5, base=20000, id=1), pinned(2, base=40000, id=2)]
    path = write_log(tmp_path / "log.h5", eps, LogMeta(source="sim"))
    sampler = WindowSampler(path, [2, 0], identity(), 2)
    assert sampler.episode_ids == [2, 0] and sampler.num_steps == 3 + 4
    (ep1,) = sampler.episodes([1])  # an episode outside the stream is read on demand
    assert ep1.shape == (1, 6)


def test_frames_stream_from_the_log_and_match_memory(tmp_path):
    """From a file, frames stay on disk (nothing held in memory) and each window reads only its rows;
    the windows equal those of the same episodes held in memory, across episode boundaries."""
    from wmcheck.datasets.episode import LogMeta
    from wmcheck.datasets.logformat import LogReader, write_log

    eps = [pinned(3, base=0, terminated=True, images=True, id=0), pinned(4, base=20000, images=True, id=1)]
    path = write_log(tmp_path / "cam.h5", eps, LogMeta(source="real", dt=0.1))
    mem = WindowSampler(eps, None, identity(), 5)
    disk = WindowSampler(path, None, identity(), 5)
    assert disk._stream.images == {} and disk.frames is not None and disk.frames.keys == ["cam"]
    reads = []
    original = LogReader.frames

    def counting(self, episode_id, key, start, stop):
        reads.append((episode_id, start, stop))
        return original(self, episode_id, key, start, stop)

    LogReader.frames = counting
    try:
        a, b = mem.sample(np.random.default_rng(4), 7), disk.sample(np.random.default_rng(4), 7)
    finally:
        LogReader.frames = original
    np.testing.assert_array_equal(a.images["cam"], b.images["cam"])  # (7, 5, 2, 2, 3)
    np.testing.assert_array_equal(a.obs, b.obs)
    assert sum(stop - start for _, start, stop in reads) == 7 * 5  # exactly the windows' frames
    assert any(start > 0 for _, start, _ in reads)
    whole = list(disk.episodes())
    assert whole[1].images["cam"].shape == (1, 5, 2, 2, 3)
    np.testing.assert_array_equal(whole[1].images["cam"][0], eps[1].obs_groups["cam"])
    disk.frames.close()
