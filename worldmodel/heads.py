"""Encoder, decoder and prediction heads for vector observations (reference section 2-3).

Owns: `VectorEncoder` (symlog -> MLP -> tokens), `VectorDecoder` (feat -> MLP -> symlog-space mean,
plus our stop-gradient log-std head), `RewardHead` (two-hot over symexp bins, zero-init output)
and `ContinueHead` (Bernoulli logit). All read/return (B, T, ...) tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from wmcheck.worldmodel.config import WorldModelConfig
from wmcheck.worldmodel.distributions import symlog
from wmcheck.worldmodel.layers import MLP, Linear


class VectorEncoder(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.net = MLP(cfg.obs_dim, cfg.units, cfg.enc_layers)
        self.out_dim = self.net.out_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(symlog(obs))  # (B, T, D) -> (B, T, units)


class VectorDecoder(nn.Module):
    """Predicts symlog(obs): mean (trained with symlog-MSE summed over channels) and log-std."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.net = MLP(cfg.feat_dim, cfg.units, cfg.dec_layers)
        self.mean = Linear(cfg.units, cfg.obs_dim)
        self.learn_std = cfg.learn_obs_std
        if self.learn_std:
            # A separate small net on stop-gradient features: it cannot change the reference's
            # representation learning, only learn how noisy each channel is given the state.
            self.std_net = MLP(cfg.feat_dim, cfg.units, 1)
            self.log_std = Linear(cfg.units, cfg.obs_dim, outscale=0.0)

    def forward(self, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feat (B, T, F) -> mean (B, T, D), log_std (B, T, D), both in symlog space."""
        mean = self.mean(self.net(feat)).float()
        if self.learn_std:
            log_std = self.log_std(self.std_net(feat.detach())).float().clamp(-7.0, 3.0)
        else:
            log_std = torch.zeros_like(mean)
        return mean, log_std


class RewardHead(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.net = MLP(cfg.feat_dim, cfg.units, cfg.head_layers)
        self.out = Linear(cfg.units, cfg.reward_bins, outscale=0.0)  # reference: outscale 0

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(feat)).float()  # (B, T, bins) logits


class ContinueHead(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.net = MLP(cfg.feat_dim, cfg.units, cfg.head_layers)
        self.out = Linear(cfg.units, 1)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(feat)).float().squeeze(-1)  # (B, T) logit
