"""Baselines for honest comparison: what a check without a latent world model would say.

Owns two detectors that score checked episodes against held-out real episodes with the same
block units and the same (episode-clustered) tests as the checks:
  - `mmd_baseline`: no model at all; an MMD two-sample test on visited states (observations with
    the controls that led there) whose permutations exchange whole episodes.
  - `OneStepEnsemble` / `MLPBaseline` / `mlp_baseline`: a one-step model without latent state, an ensemble of K
    small MLPs (bootstrap-trained) predicting obs_{t+1} - obs_t from (obs_t, a_t, e_t) in
    normalised units; each block's score is its mean squared one-step residual, compared with
    held-out real blocks by the one-sided clustered Mann-Whitney test.
  - `ARXBaseline`: the system-identification engineer's first tool, a linear ARX(1) one-step model
    (least squares of obs_{t+1} - obs_t on obs_t, a_t, e_t and a constant, training episodes); per
    block and channel the residuals' log std and mean, each compared with the held-out real
    blocks' by the episode-level t (stats.episode_t), **two-sided** (a too-smooth or biased simulator is as
    much a finding as a noisier one); Bonferroni over the 2 D statistics; score = the largest |z|.
Both return a p-value and a continuous score (higher = further from reality) so benchmarks can
compute detection rates at alpha and AUROCs side by side with wmcheck's `summary.score`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from wmcheck.checks.stats import block_mmd_test, clustered_mann_whitney, episode_t_columns, rank_auc, t_to_z_many
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.normalize import Normalizer


def _transitions(episodes: list[Episode], norm: Normalizer):
    """Per episode: inputs (N, D+A+E) and targets (N, D) in normalised units."""
    out = []
    for ep in episodes:
        obs = norm.norm_obs(ep.observations)  # (N+1, D)
        x = np.concatenate([obs[:-1], norm.norm_action(ep.actions), norm.norm_input(ep.input_array())], -1)
        out.append((x.astype(np.float32), (obs[1:] - obs[:-1]).astype(np.float32)))
    return out


def _blocks(arr: np.ndarray, length: int) -> list[np.ndarray]:
    return [arr[s : s + length] for s in range(0, len(arr) - length + 1, length)]


@dataclass
class BaselineResult:
    p_value: float
    score: float  # P(checked block worse than a real block); 0.5 = like reality


class OneStepEnsemble:
    def __init__(self, in_dim: int, out_dim: int, members: int = 5, hidden: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.members = [
            nn.Sequential(
                nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, out_dim)
            )
            for _ in range(members)
        ]
        self.gen = g

    def fit(self, transitions, steps: int = 300, batch: int = 256, lr: float = 3e-3) -> OneStepEnsemble:
        x = torch.from_numpy(np.concatenate([t[0] for t in transitions]))
        y = torch.from_numpy(np.concatenate([t[1] for t in transitions]))
        for net in self.members:
            boot = torch.randint(0, len(x), (len(x),), generator=self.gen)  # bootstrap sample per member
            opt = torch.optim.Adam(net.parameters(), lr=lr)
            for _ in range(steps):
                idx = boot[torch.randint(0, len(boot), (batch,), generator=self.gen)]
                loss = (net(x[idx]) - y[idx]).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return self

    @torch.no_grad()
    def residual(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Squared residual of the ensemble mean per step, averaged over channels: (N,)."""
        pred = torch.stack([net(torch.from_numpy(x)) for net in self.members]).mean(0).numpy()
        return ((pred - y) ** 2).mean(-1)


class MLPBaseline:
    """The one-step MLP ensemble baseline fitted once on training episodes, then used on many checks:
    `MLPBaseline(train, real_heldout, norm).test(checked)` (a benchmark runs dozens of checks)."""

    def __init__(
        self,
        train: list[Episode],
        real_heldout: list[Episode],
        norm: Normalizer,
        block: int = 64,
        members: int = 5,
        steps: int = 300,
        seed: int = 0,
    ):
        self.norm, self.block = norm, block
        self.ensemble = OneStepEnsemble(norm.dims[0] + norm.dims[1] + norm.dims[2], norm.dims[0], members, seed=seed)
        self.ensemble.fit(_transitions(train, norm), steps=steps)
        self.real, self.real_episode = self.block_scores(real_heldout)

    def block_scores(self, eps: list[Episode]) -> tuple[np.ndarray, np.ndarray]:
        """Mean squared one-step residual per block of `block` steps and each block's episode
        index: (n_blocks,), (n_blocks,)."""
        scores, groups = [], []
        for i, (x, y) in enumerate(_transitions(eps, self.norm)):
            for b in _blocks(self.ensemble.residual(x, y), self.block):
                scores.append(b.mean())
                groups.append(i)
        return np.array(scores), np.array(groups)

    def test(self, checked: list[Episode]) -> BaselineResult:
        c, g = self.block_scores(checked)
        return BaselineResult(clustered_mann_whitney(c, g, self.real, self.real_episode), rank_auc(c, self.real))


def mlp_baseline(
    train: list[Episode],
    real_heldout: list[Episode],
    checked: list[Episode],
    norm: Normalizer,
    block: int = 64,
    members: int = 5,
    steps: int = 300,
    seed: int = 0,
) -> BaselineResult:
    return MLPBaseline(train, real_heldout, norm, block, members, steps, seed).test(checked)


def mmd_baseline(
    real_heldout: list[Episode],
    checked: list[Episode],
    norm: Normalizer,
    block: int = 64,
    per_block: int = 8,
    seed: int = 0,
) -> BaselineResult:
    rng = np.random.default_rng(seed)

    def states(eps):
        out, groups = [], []
        for i, (x, _) in enumerate(_transitions(eps, norm)):
            for b in _blocks(x, block):
                out.append(b[np.linspace(0, len(b) - 1, per_block).round().astype(int)])
                groups.append(i)
        return out, np.array(groups)

    (c, gc), (r, gr) = states(checked), states(real_heldout)
    mmd, p = block_mmd_test(c, r, rng, x_groups=gc, y_groups=gr)
    # continuous score: how far each checked block's mean state is from the real blocks', ranked
    cr = np.array([np.linalg.norm(b.mean(0) - np.mean([x.mean(0) for x in r], 0)) for b in c])
    rr = np.array([np.linalg.norm(b.mean(0) - np.mean([x.mean(0) for x in r], 0)) for b in r])
    return BaselineResult(p, rank_auc(cr, rr))


class ARXBaseline:
    """Linear one-step (ARX) residual detector, fitted once: `ARXBaseline(train, held, norm).test(checked)`."""

    def __init__(
        self, train: list[Episode], real_heldout: list[Episode], norm: Normalizer, block: int = 64, ridge: float = 1e-6
    ):
        self.norm, self.block = norm, block
        tr = _transitions(train, norm)
        x = np.concatenate([t[0] for t in tr]).astype(np.float64)  # (N, D + A + E)
        y = np.concatenate([t[1] for t in tr]).astype(np.float64)  # (N, D)
        x1 = np.concatenate([x, np.ones((len(x), 1))], 1)
        self.W = np.linalg.solve(x1.T @ x1 + ridge * np.eye(x1.shape[1]), x1.T @ y)  # (D + A + E + 1, D)
        self.real, self.real_episode = self.block_stats(real_heldout)

    def block_stats(self, eps: list[Episode]) -> tuple[np.ndarray, np.ndarray]:
        """Per block of `block` steps: (log residual std, residual mean) per channel, (n, 2, D), and
        each block's episode index (n,)."""
        stats, groups = [], []
        for i, (x, y) in enumerate(_transitions(eps, self.norm)):
            r = y - np.concatenate([x, np.ones((len(x), 1), np.float32)], 1) @ self.W  # (N, D)
            for b in _blocks(r, self.block):
                stats.append(np.stack([np.log(np.maximum(b.std(0), 1e-9)), b.mean(0)]))
                groups.append(i)
        D = self.W.shape[1]
        return (np.array(stats) if stats else np.zeros((0, 2, D))), np.array(groups)

    def test(self, checked: list[Episode]) -> BaselineResult:
        c, g = self.block_stats(checked)
        if not len(c):
            return BaselineResult(float("nan"), float("nan"))
        K = 2 * c.shape[2]  # (log std, mean) x channel
        t, df = episode_t_columns(c.reshape(len(c), K), g, self.real.reshape(len(self.real), K), self.real_episode)
        z = t_to_z_many(t, df)  # (2 D,)
        m = float(np.abs(z).max())
        # two-sided, Bonferroni over the statistics; erfc keeps p > 0 where 1 - cdf(m) rounds to 0 (m > 8)
        p = min(1.0, math.erfc(m / math.sqrt(2.0)) * z.size)
        return BaselineResult(p, m)
