"""CLIP image embeddings for the visual gap, from local weights only (`wmcheck check --clip-model PATH`).

Owns loading a CLIP vision tower and the CLIP distance of the visual row:
  - a folder written by `transformers` (`CLIPVisionModelWithProjection.save_pretrained`, or a full CLIP
    model folder such as a downloaded ViT-L/14): loaded with `local_files_only=True`;
  - an open_clip checkpoint file (`ViT-L-14` architecture unless the file name names another one,
    e.g. "ViT-B-32.pt"): loaded with `open_clip.create_model_and_transforms(arch, pretrained=FILE)`.
Nothing is downloaded at run time. Frames are resized to the tower's input size (bicubic) and
normalised with the folder's preprocessor statistics, or CLIP's published ones when it has none.

The distance: at matching trajectory steps, the cosine distance 1 - cos(e_checked, e_real) between
every checked frame and every reference real frame of the same step, averaged ("mean cosine
distance"); the same for held-out real frames is the real-vs-real reference, and 1 - cos(mean
embeddings) the whole-set distance. Documented field practice for the mean cosine
distance between simulated and real frames (not calibrated here, named as such in the report):
below 0.20 stable, above 0.25 needs intervention, above 0.30 expand visual randomisation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wmcheck.datasets.errors import UserError

# CLIP's published preprocessing statistics (RGB), used when the weights come without a preprocessor file.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PRACTICE = {"stable_below": 0.20, "intervention_above": 0.25, "randomise_above": 0.30}


def practice_band(distance: float) -> str:
    """The field-practice reading of a mean CLIP cosine distance (module docstring)."""
    if distance > PRACTICE["randomise_above"]:
        return "above 0.30 (field practice): expand visual domain randomisation"
    if distance > PRACTICE["intervention_above"]:
        return "above 0.25 (field practice): needs intervention"
    if distance >= PRACTICE["stable_below"]:
        return "between 0.20 and 0.25 (field practice): marginal, watch it"
    return "below 0.20 (field practice): stable"


class ClipEmbedder:
    def __init__(self, forward, image_size: int, mean, std, source: str):
        self._forward, self.image_size, self.source = forward, int(image_size), source
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    @classmethod
    def load(cls, path: str | Path) -> ClipEmbedder:
        path = Path(path)
        if not path.exists():
            raise UserError(
                f"--clip-model {path} does not exist",
                "point it at local CLIP weights: a transformers folder (config.json + weights) or an open_clip checkpoint",
            )
        if path.is_dir():
            return cls._load_transformers(path)
        return cls._load_open_clip(path)

    @classmethod
    def _load_transformers(cls, path: Path) -> ClipEmbedder:
        if not (path / "config.json").exists():
            raise UserError(
                f"{path} has no config.json: not a transformers model folder",
                "save the model with save_pretrained(), or pass an open_clip checkpoint file",
            )
        try:
            from transformers import CLIPVisionModelWithProjection
        except ImportError:
            raise UserError("--clip-model needs the transformers package", "pip install 'wmcheck[clip]'") from None
        try:
            model = CLIPVisionModelWithProjection.from_pretrained(str(path), local_files_only=True).eval()
        except (OSError, ValueError) as exc:
            raise UserError(
                f"cannot load CLIP vision weights from {path}: {exc}",
                "give a CLIPVisionModelWithProjection or CLIPModel folder saved with save_pretrained()",
            ) from None
        mean, std = CLIP_MEAN, CLIP_STD
        pre = path / "preprocessor_config.json"
        if pre.exists():
            d = json.loads(pre.read_text())
            mean, std = tuple(d.get("image_mean", mean)), tuple(d.get("image_std", std))

        def forward(x):
            return model(pixel_values=x).image_embeds  # (n, P)

        return cls(forward, model.config.image_size, mean, std, f"transformers:{path}")

    @classmethod
    def _load_open_clip(cls, path: Path) -> ClipEmbedder:
        try:
            import open_clip
        except ImportError:
            raise UserError(
                f"{path} is a file: reading it as an open_clip checkpoint needs open_clip",
                "pip install open_clip_torch, or pass a transformers model folder",
            ) from None
        names = [n for n in open_clip.list_models() if n.lower() in path.name.lower()]
        arch = max(names, key=len) if names else "ViT-L-14"
        try:
            model, _, _ = open_clip.create_model_and_transforms(arch, pretrained=str(path))
        except (RuntimeError, ValueError, OSError) as exc:
            raise UserError(
                f"cannot load {path} as an open_clip {arch} checkpoint: {exc}",
                "name the architecture in the file name (e.g. ViT-B-32.pt) or pass a transformers folder",
            ) from None
        model.eval()
        size = model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        mean = getattr(model.visual, "image_mean", None) or CLIP_MEAN
        std = getattr(model.visual, "image_std", None) or CLIP_STD
        return cls(model.encode_image, size, mean, std, f"open_clip:{arch}:{path}")

    @torch.no_grad()
    def embed(self, frames: np.ndarray, chunk: int = 64) -> np.ndarray:
        """(n, H, W, C) uint8 -> (n, P) unit-norm embeddings (grey frames repeat their channel)."""
        out = []
        for s in range(0, len(frames), chunk):
            x = torch.from_numpy(np.ascontiguousarray(frames[s : s + chunk])).float().div(255.0)  # (c, H, W, C)
            x = x.permute(0, 3, 1, 2)  # (c, C, H, W)
            x = x.repeat(1, 3, 1, 1) if x.shape[1] == 1 else x[:, :3]
            x = F.interpolate(
                x, size=(self.image_size, self.image_size), mode="bicubic", align_corners=False, antialias=True
            ).clamp(0, 1)
            out.append(F.normalize(self._forward((x - self.mean) / self.std).float(), dim=-1).numpy())
        return np.concatenate(out)

    def compare(self, frames, steps, ref, ref_steps, real, real_steps) -> dict:
        """CLIP distances of checked frames (n, H, W, C) and, as the real-vs-real reference, of held-out
        real frames, to the reference real frames at matching trajectory steps (module docstring)."""
        e, r, h = self.embed(frames), self.embed(ref), self.embed(real)

        def mean_distance(x, x_steps):
            d = [
                (1 - x[x_steps == t] @ r[ref_steps == t].T).ravel()
                for t in np.unique(x_steps)
                if (ref_steps == t).any()
            ]
            return float(np.concatenate(d).mean()) if d else float("nan")

        mean_d, real_mean = mean_distance(e, steps), mean_distance(h, real_steps)
        if np.isnan(mean_d):
            raise UserError(
                "no checked frame shares a trajectory step with the real frames",
                "record the rollouts from the same start (step 0) as the real episodes",
            )
        m_c, m_r = e.mean(0), r.mean(0)
        set_d = float(1 - m_c @ m_r / max(np.linalg.norm(m_c) * np.linalg.norm(m_r), 1e-12))
        return {
            "model": self.source,
            "mean_cosine_distance": round(mean_d, 4),
            "real_mean_cosine_distance": None if np.isnan(real_mean) else round(real_mean, 4),
            "set_cosine_distance": round(set_d, 4),
            "practice_thresholds": dict(PRACTICE),
            "practice": practice_band(mean_d),
        }
