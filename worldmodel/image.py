"""Image encoder and decoder: the reference's CNNs for camera observations (reference section 2).

Owns `ImageEncoder` (uint8 frames -> tokens) and `ImageDecoder` (features -> frames in [0, 1]) and
`image_loss`. Frames arrive channels-last as stored in the log, (B, T, H, W, C) uint8; several image
keys of one model share H and W and are stacked on the channel axis (C = sum of their channels).

Encoder: x / 255 - 0.5, then one stage per depth multiplier, depth = cnn_depth * mult:
    conv k5 stride 1 "same" -> 2x2 max-pool -> RMSNorm (over channels) -> SiLU
and the final (H / 2^S, W / 2^S, depth) map is flattened. The final resolution must be 3-16.

Decoder (reference bspace = 8):
    BlockLinear(h -> h0*w0*C, groups)  +  Linear(z -> 2*units) -> RMSNorm -> SiLU -> Linear(h0*w0*C)
    sum -> RMSNorm -> SiLU, then one stage per remaining multiplier (reversed):
    nearest 2x upsample -> conv k5 -> RMSNorm -> SiLU, then upsample -> conv to C -> sigmoid.
Loss: sum over H, W, C of (pred - img / 255)^2, per (b, t).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from wmcheck.worldmodel.config import WorldModelConfig
from wmcheck.worldmodel.layers import BlockLinear, Linear, RMSNorm, init_weight_


class Conv2d(nn.Conv2d):
    """k x k convolution, stride 1, "same" padding, with the reference init (fan-in = k*k*C_in)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int):
        super().__init__(in_channels, out_channels, kernel, stride=1, padding=kernel // 2)
        init_weight_(self.weight, in_channels * kernel * kernel)
        nn.init.zeros_(self.bias)


class ChannelNormAct(nn.Module):
    """RMSNorm over the channel axis of an (N, C, H, W) map, then SiLU (the reference norms channels-last)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = RMSNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.permute(0, 2, 3, 1))  # (N, H, W, C)
        return F.silu(x).permute(0, 3, 1, 2)  # (N, C, H, W)


def _stack(images: dict[str, torch.Tensor], keys) -> torch.Tensor:
    """Stack the frames of `keys` on the channel axis: {key: (B, T, H, W, c)} -> (B, T, H, W, C)."""
    missing = [k for k in keys if k not in images]
    assert not missing, f"image keys {missing} missing from the sequence (has {sorted(images)})"
    return torch.cat([images[k] for k in keys], -1)


class ImageEncoder(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.keys = list(cfg.image_keys)
        H, W, C = cfg.image_shape
        self.shape = (H, W, C)
        depths = [cfg.cnn_depth * m for m in cfg.cnn_mults]
        stages, c_in = [], C
        for d in depths:
            stages += [Conv2d(c_in, d, cfg.cnn_kernel), nn.MaxPool2d(2), ChannelNormAct(d)]
            c_in = d
        self.stages = nn.Sequential(*stages)
        S = len(depths)
        self.out_dim = (H >> S) * (W >> S) * depths[-1]

    def forward(self, images: dict[str, torch.Tensor]) -> torch.Tensor:
        x = _stack(images, self.keys)  # (B, T, H, W, C) uint8
        B, T = x.shape[:2]
        assert tuple(x.shape[2:]) == self.shape, f"images {tuple(x.shape[2:])} != model's (H, W, C) {self.shape}"
        x = rearrange(x.float() / 255.0 - 0.5, "b t h w c -> (b t) c h w")  # (B*T, C, H, W)
        x = self.stages(x)  # (B*T, depth, H/2^S, W/2^S)
        return rearrange(x, "(b t) c h w -> b t (h w c)", b=B, t=T)  # (B, T, out_dim)


class ImageDecoder(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        H, W, C = cfg.image_shape
        depths = [cfg.cnn_depth * m for m in cfg.cnn_mults]
        S = len(depths)
        self.h0, self.w0, self.c0 = H >> S, W >> S, depths[-1]
        self.groups = cfg.dec_blocks
        u = self.h0 * self.w0 * self.c0
        self.deter_dim = cfg.deter
        self.sp0 = BlockLinear(cfg.deter, u, self.groups)
        self.sp1 = Linear(cfg.stoch * cfg.classes, 2 * cfg.units)
        self.sp1norm = RMSNorm(2 * cfg.units)
        self.sp2 = Linear(2 * cfg.units, u)
        self.spnorm = RMSNorm(self.c0)
        stages, c_in = [], self.c0
        for d in reversed(depths[:-1]):
            stages += [nn.Upsample(scale_factor=2, mode="nearest"), Conv2d(c_in, d, cfg.cnn_kernel), ChannelNormAct(d)]
            c_in = d
        stages += [nn.Upsample(scale_factor=2, mode="nearest"), Conv2d(c_in, C, cfg.cnn_kernel)]
        self.stages = nn.Sequential(*stages)
        self.keys, self.channels = list(cfg.image_keys), list(cfg.image_key_channels)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        """feat (..., F) = concat(h, flat z) -> frames (..., H, W, C) in [0, 1] (float32)."""
        lead = feat.shape[:-1]
        feat = feat.reshape(-1, feat.shape[-1])  # (N, F)
        h, z = feat[:, : self.deter_dim], feat[:, self.deter_dim :]
        x0 = rearrange(
            self.sp0(h), "n (g y x c) -> n y x (g c)", g=self.groups, y=self.h0, x=self.w0
        )  # (N, h0, w0, C0)
        x1 = self.sp2(F.silu(self.sp1norm(self.sp1(z))))
        x1 = rearrange(x1, "n (y x c) -> n y x c", y=self.h0, x=self.w0)  # (N, h0, w0, C0)
        x = F.silu(self.spnorm(x0 + x1)).permute(0, 3, 1, 2)  # (N, C0, h0, w0)
        x = torch.sigmoid(self.stages(x).float())  # (N, C, H, W)
        return x.permute(0, 2, 3, 1).reshape(*lead, *x.shape[2:], x.shape[1])  # (..., H, W, C)

    def split(self, frames: torch.Tensor) -> dict[str, torch.Tensor]:
        """(..., H, W, C) stacked frames -> {key: (..., H, W, c)}."""
        return dict(zip(self.keys, torch.split(frames, self.channels, dim=-1)))


def image_target(images: dict[str, torch.Tensor], keys) -> torch.Tensor:
    """Stacked frames as float targets in [0, 1]: (B, T, H, W, C)."""
    return _stack(images, keys).float() / 255.0


def image_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, C) x 2 -> (B, T): squared error summed over H, W, C (the reference's image loss)."""
    return (pred - target).pow(2).sum((-3, -2, -1))
