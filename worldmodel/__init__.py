"""wmcheck.worldmodel: the DreamerV3 world model in pure PyTorch (no files, Lightning or reports).

The model classes are imported on first use (PEP 562), so that reading a config
(`wmcheck.worldmodel.config`, e.g. for `wmcheck --help`) does not import torch.
"""

from wmcheck.worldmodel.config import PRESETS, WorldModelConfig, preset

__all__ = ["PRESETS", "WorldModelConfig", "preset", "WorldModel", "LossOut", "Observed", "State"]

_LAZY = {"WorldModel": "model", "LossOut": "model", "Observed": "rssm", "State": "rssm"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"wmcheck.worldmodel.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'wmcheck.worldmodel' has no attribute {name!r}")
