"""wmcheck.worldmodel: the DreamerV3 world model in pure PyTorch (no files, Lightning or reports)."""

from wmcheck.worldmodel.config import PRESETS, WorldModelConfig, preset
from wmcheck.worldmodel.model import LossOut, WorldModel
from wmcheck.worldmodel.rssm import Observed, State

__all__ = ["PRESETS", "WorldModelConfig", "preset", "WorldModel", "LossOut", "Observed", "State"]
