"""Building blocks with DreamerV3's initialisation and normalisation.

Owns: the reference weight init (truncated normal scaled by fan-in), `Linear`, `BlockLinear`
(grouped linear whose init fan-in is the *full* input width, as in the reference), `RMSNorm`
(scale only, eps 1e-4, computed in fp32), and `MLP` (stacks of Linear -> RMSNorm -> SiLU).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

# Standard normal truncated to [-2, 2] has std 0.87962566; 1.1368 = 1 / 0.8796 restores unit std.
_TRUNC_STD_CORRECTION = 1.1368


def init_weight_(weight: torch.Tensor, fan_in: int, scale: float = 1.0) -> None:
    """truncnormal(+-2) * 1.1368 / sqrt(fan_in) * scale; scale 0 gives zeros (outscale 0)."""
    with torch.no_grad():
        if scale == 0.0:
            weight.zero_()
            return
        nn.init.trunc_normal_(weight, mean=0.0, std=1.0, a=-2.0, b=2.0)
        weight.mul_(_TRUNC_STD_CORRECTION / math.sqrt(fan_in) * scale)


class Linear(nn.Linear):
    """nn.Linear with the reference init (zero bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, outscale: float = 1.0):
        super().__init__(in_features, out_features, bias=bias)
        init_weight_(self.weight, in_features, outscale)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class BlockLinear(nn.Module):
    """Block-diagonal linear map: `groups` independent (in/g -> out/g) maps on the flat vector.

    Input (..., in_features) is split into `groups` contiguous slices. The init uses the full
    `in_features` as fan-in (the reference's choice; ports that used in/g drifted).
    """

    def __init__(self, in_features: int, out_features: int, groups: int):
        super().__init__()
        if in_features % groups or out_features % groups:
            raise ValueError(f"BlockLinear: in {in_features} and out {out_features} must divide by groups {groups}")
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(groups, in_features // groups, out_features // groups))
        self.bias = nn.Parameter(torch.zeros(out_features))
        init_weight_(self.weight, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = rearrange(x, "... (g i) -> ... g i", g=self.groups)  # (..., G, in/G)
        y = torch.einsum("...gi,gio->...go", x, self.weight)  # (..., G, out/G)
        return rearrange(y, "... g o -> ... (g o)") + self.bias  # (..., out)


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale and no offset; computed in fp32 (bf16-safe)."""

    def __init__(self, dim: int, eps: float = 1e-4):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is one fused kernel: x * rsqrt(mean(x^2) + eps) * scale.
        return F.rms_norm(x.float(), (x.shape[-1],), self.scale.float(), self.eps).to(x.dtype)


class NormAct(nn.Sequential):
    """Linear -> RMSNorm -> SiLU: the reference's dense layer."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(Linear(in_features, out_features), RMSNorm(out_features), nn.SiLU())


class MLP(nn.Sequential):
    """`layers` x (Linear -> RMSNorm -> SiLU). Output width = `units`."""

    def __init__(self, in_features: int, units: int, layers: int):
        mods = []
        for i in range(layers):
            mods.append(NormAct(in_features if i == 0 else units, units))
        super().__init__(*mods)
        self.out_features = units if layers else in_features
