"""Configuration of the world model and its named size presets.

Owns `WorldModelConfig` (one dataclass builds the whole model) and `PRESETS`. Sizes follow the
reference's table (deter / hidden / classes / cnn depth / units; 32 latents and 8 GRU blocks in
every reference preset). `debug` is ours: small enough to train in seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class WorldModelConfig:
    # --- data interface (filled in from the log when training starts) ---
    obs_dim: int = 0
    """Vector observation channels D."""
    action_dim: int = 0
    """Command channels A (previous action a_{t-1} conditions the dynamics)."""
    input_dim: int = 0
    """Exogenous input channels E; conditioned on exactly like actions (concatenated to them)."""
    image_keys: list[str] = field(default_factory=list)
    """Observation groups that are camera frames (e.g. ["image"]); empty = a vector-only model."""
    image_key_channels: list[int] = field(default_factory=list)
    """Channels of each image key (3 for RGB); the keys are stacked on the channel axis."""
    image_shape: list[int] = field(default_factory=list)
    """(H, W, C) of the stacked frames, C = sum(image_key_channels); e.g. [64, 64, 3]."""

    # --- RSSM (reference section 1) ---
    deter: int = 512
    """Size of the deterministic GRU state h."""
    hidden: int = 64
    """Width of the core's input projections and of the prior/posterior MLPs."""
    stoch: int = 32
    """Number of categorical latents."""
    classes: int = 4
    """Classes per categorical latent."""
    blocks: int = 8
    """Groups of the block GRU."""
    dyn_layers: int = 1
    img_layers: int = 2
    """Prior MLP depth."""
    obs_layers: int = 1
    """Posterior MLP depth."""
    unimix: float = 0.01
    ensemble: int = 1
    """K prior heads sharing the core; their disagreement measures epistemic uncertainty. K=1 is the reference."""
    bootstrap: bool = True
    """With K > 1, each head trains on a random half of the sequences of a batch (bootstrap), so
    heads disagree where data are scarce. Ignored for K=1."""
    action_scale: float = 3.0
    """Deviation from the reference, which divides actions by max(1, |a|) assuming actions in
    [-1, 1]. Our actions and inputs are standardised (z-scores), so we apply that squash to
    a / action_scale: values within +-3 std pass linearly instead of being clipped at +-1 std."""
    fused_core: bool = True
    """Run the block GRU as the scan's rewrite (`RSSM.core_scan`: the control's work done for every
    step before the loop, fewer kernels per step) instead of the reference formulation
    (`RSSM.core_reference`); both compute the same numbers up to float rounding."""

    # --- encoder / decoder / heads (reference sections 2-3) ---
    units: int = 64
    enc_layers: int = 3
    dec_layers: int = 3
    head_layers: int = 1
    reward_bins: int = 255
    cnn_depth: int = 4
    """Base channel count of the image CNNs; stage i has cnn_depth * cnn_mults[i] channels."""
    cnn_mults: list[int] = field(default_factory=list)
    """Depth multipliers, one per conv + 2x2 pooling stage. Empty = the reference's [2, 3, 4, 4] cut to
    the stages that bring the image to 4-7 pixels (64 -> 4 stages, 32 -> 3, 16 -> 2)."""
    cnn_kernel: int = 5
    dec_blocks: int = 8
    """Groups of the image decoder's BlockLinear from h (reference bspace = 8)."""
    learn_obs_std: bool = True
    """Addition to the reference: a per-channel log-std head on stop-gradient features, trained
    with a Gaussian NLL on the (stop-gradient) reconstruction residual. It leaves the reference's
    symlog-MSE training untouched and gives the checks a calibrated observation noise."""
    cont_horizon: float = 333.0
    """Continue target is (1 - is_terminal) * (1 - 1/horizon) = 0.997 (reference 'contdisc')."""

    # --- loss (reference sections 3-4) ---
    rec_scale: float = 1.0
    rew_scale: float = 1.0
    con_scale: float = 1.0
    dyn_scale: float = 1.0
    rep_scale: float = 0.1
    free_nats: float = 1.0

    def __post_init__(self) -> None:
        if self.deter % self.blocks:
            raise ValueError(f"deter ({self.deter}) must be divisible by blocks ({self.blocks}); pick a multiple")
        if self.ensemble < 1:
            raise ValueError(f"ensemble must be >= 1, got {self.ensemble}")
        if not 0 <= self.unimix < 1:
            raise ValueError(f"unimix must be in [0, 1), got {self.unimix}")
        if self.classes < 2 or self.stoch < 1:
            raise ValueError("need stoch >= 1 latents with classes >= 2")
        if self.action_scale <= 0:
            raise ValueError("action_scale must be positive")
        self._check_images()

    def _check_images(self) -> None:
        self.image_keys, self.image_key_channels = list(self.image_keys), [int(c) for c in self.image_key_channels]
        self.image_shape, self.cnn_mults = [int(v) for v in self.image_shape], [int(m) for m in self.cnn_mults]
        if not self.image_keys:
            if self.image_shape or self.image_key_channels:
                raise ValueError("image_shape / image_key_channels given without image_keys")
            return
        if len(self.image_shape) != 3 or min(self.image_shape) < 1:
            raise ValueError(f"image_shape must be (H, W, C), got {self.image_shape}")
        if len(self.image_key_channels) != len(self.image_keys) or sum(self.image_key_channels) != self.image_shape[2]:
            raise ValueError(
                f"image_key_channels {self.image_key_channels} must give one channel count per image key "
                f"{self.image_keys}, summing to C = {self.image_shape[2]}"
            )
        H, W = self.image_shape[:2]
        if not self.cnn_mults:
            stages = 0
            while stages < 4 and min(H, W) >> (stages + 1) >= 4:
                stages += 1
            self.cnn_mults = REFERENCE_CNN_MULTS[: max(stages, 1)]
        S = len(self.cnn_mults)
        if H % (1 << S) or W % (1 << S):
            raise ValueError(
                f"image {H}x{W} must divide by 2^{S} for {S} pooling stages; resize the frames "
                "(wmcheck record --render 64x64) or give cnn_mults with fewer stages"
            )
        if not (3 <= H >> S <= 16 and 3 <= W >> S <= 16):
            raise ValueError(
                f"after {S} pooling stages the {H}x{W} image is {H >> S}x{W >> S}; the reference needs 3-16 "
                "pixels: give cnn_mults with more or fewer stages"
            )
        c0 = self.cnn_depth * self.cnn_mults[-1]
        if c0 % self.dec_blocks or self.deter % self.dec_blocks:
            raise ValueError(
                f"the image decoder splits h ({self.deter}) and the last CNN depth "
                f"({self.cnn_depth} * {self.cnn_mults[-1]} = {c0}) into dec_blocks = {self.dec_blocks} "
                "groups: pick cnn_depth / cnn_mults so both divide"
            )

    @property
    def control_dim(self) -> int:
        return self.action_dim + self.input_dim

    @property
    def feat_dim(self) -> int:
        return self.deter + self.stoch * self.classes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WorldModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(
                f"unknown world-model config keys {sorted(unknown)}: the checkpoint was written by another wmcheck version"
            )
        return cls(**d)


REFERENCE_CNN_MULTS = [2, 3, 4, 4]


def _preset(deter: int, hidden: int, classes: int, cnn_depth: int, units: int, **kw) -> dict:
    return dict(deter=deter, hidden=hidden, classes=classes, cnn_depth=cnn_depth, units=units, **kw)


# Columns as in the reference's table: deter, hidden, classes, cnn depth, units. `debug` is ours; its
# cnn depth 8 keeps the last CNN stage divisible by the decoder's 8 groups at 16x16 (2 stages).
PRESETS: dict[str, dict] = {
    "debug": _preset(64, 32, 4, 8, 32, stoch=8, blocks=4),
    "size1m": _preset(512, 64, 4, 4, 64),
    "size12m": _preset(2048, 256, 16, 16, 256),
    "size25m": _preset(3072, 384, 24, 24, 384),
    "size50m": _preset(4096, 512, 32, 32, 512),
    "size100m": _preset(6144, 768, 48, 48, 768),
    "size200m": _preset(8192, 1024, 64, 64, 1024),
    "size400m": _preset(12288, 1536, 96, 96, 1536),
}


def preset(name: str, **overrides) -> WorldModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return WorldModelConfig(**{**PRESETS[name], **overrides})
