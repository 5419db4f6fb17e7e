"""The visual gap: how far checked camera frames are from real ones, and which image statistics say why.

Owns the `visual` row of the report's gaps, its calibration file and the photometric statistics.

Frames are compared in the world model's own image-encoder embedding e(frame), at trajectory steps
t = 0, s, 2s, ... (s = `stride`), against a reference set R of real frames (a subsample of the
model's training episodes):

    d_step(f) = min || e(f) - e(r) || over r in R at the same trajectory step   (matching steps)
    d_set(f)  = min || e(f) - e(r) || over all r in R                           (the whole set)
    d(f)      = (d_step(f) / m_step + d_set(f) / m_set) / 2, m = the held-out frames' median of each
    segment score = mean of d over `segment` consecutive compared frames of one episode

Segments are the statistical units. Frames of one episode share its scene (target, start state), so
distances are correlated within an episode; a segment is long (64 compared frames by default),
and a short episode is one segment: in practice the units are episodes, or long stretches of them.

Calibration (real vs real, `calibrate_visual`, RUNDIR/visual_calibration.npz): the same distances
for the frames of held-out real episodes, which the model never trained on, exactly like the
checked frames: a faithful simulator's segments are exchangeable with these. The reference frames
and the held-out frames are stored with it, so a check needs neither the training log nor CLIP at
calibration time.

Check (`visual_gap`): checked segment scores against the held-out ones, one-sided Mann-Whitney (exact
by permutation for few segments); present when p < alpha, evidence alpha / p (as for the distribution
row). With m held-out and n checked segments the smallest attainable p is 1 / C(n + m, m): a check
needs several held-out real episodes (5 and 5 reach 0.004). Reported sizes: the ratio of median frame
distances (checked / held-out real) for each distance, and the whole-set distance between the mean
embeddings of checked and held-out frames, over the held-out frames' median d_set.

Photometric statistics explain the distance in terms a person can fix: mean luminance (Rec. 601
luma, grey levels), contrast (std / mean of luma within a frame), the share of each colour channel
in the summed channel means (colour balance) and sharpness (mean absolute luma gradient / mean luma).
All but luminance are invariant to a pure brightness change, so a brighter simulator reads as
"brighter", not also as redder or more contrasted. A statistic "explains" the gap when the checked
frames' mean differs from the real frames' mean by more than twice the spread between real episodes
and by more than 3% of the real value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from math import comb
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.stats import mann_whitney_greater
from wmcheck.datasets.atomic import atomic_path
from wmcheck.datasets.errors import UserError

VISUAL_CALIBRATION_VERSION = 1
FILE = "visual_calibration.npz"
_LUMA = np.array([0.299, 0.587, 0.114])
STATS = ("luminance", "contrast", "red", "green", "blue", "sharpness")
STAT_WORDS = {
    "luminance": ("brighter", "darker"),
    "contrast": ("more contrasted", "less contrasted"),
    "red": ("redder", "less red"),
    "green": ("greener", "less green"),
    "blue": ("bluer", "less blue"),
    "sharpness": ("sharper (more edges or noise)", "blurrier"),
}


@dataclass
class VisualConfig:
    stride: int = 1
    """Steps between compared frames (raised automatically so at most `max_frames` real frames are kept)."""
    segment: int = 64
    """Compared frames per segment, the statistical unit of the test (module docstring)."""
    max_frames: int = 2048
    """Real held-out frames kept for comparison (per image key)."""

    def __post_init__(self) -> None:
        if self.stride < 1 or self.segment < 1 or self.max_frames < self.segment:
            raise ValueError("visual check: stride and segment must be >= 1 and max_frames >= segment")


# ---------------------------------------------------------------------------------------- statistics


def photometric(frames: np.ndarray) -> np.ndarray:
    """(n, H, W, C) uint8 -> (n, 6) per-frame statistics in the order of STATS (module docstring):
    luminance in grey levels, the others dimensionless. Grey frames (C = 1) count as R = G = B."""
    x = frames.astype(np.float64)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, -1)
    rgb = x[..., :3]  # (n, H, W, 3)
    luma = rgb @ _LUMA  # (n, H, W)
    mean = luma.mean((1, 2))  # (n,)
    safe = np.maximum(mean, 1e-6)
    gy, gx = np.abs(np.diff(luma, axis=1)).mean((1, 2)), np.abs(np.diff(luma, axis=2)).mean((1, 2))
    channels = rgb.mean((1, 2))  # (n, 3)
    shares = channels / np.maximum(channels.sum(1, keepdims=True), 1e-6)
    return np.stack([mean, luma.std((1, 2)) / safe, *shares.T, 0.5 * (gx + gy) / safe], 1)


@torch.no_grad()
def embed(model, frames: dict[str, np.ndarray], chunk: int = 256) -> np.ndarray:
    """World-model encoder embedding of frames {key: (n, H, W, C) uint8} -> (n, E) float32."""
    n = len(next(iter(frames.values())))
    device = next(model.parameters()).device
    out = []
    for s in range(0, n, chunk):
        part = {k: torch.as_tensor(v[s : s + chunk], device=device)[None] for k, v in frames.items()}  # (1, c, H, W, C)
        out.append(model.embed_images(part)[0].cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def _segments(d: np.ndarray, ep: np.ndarray, size: int) -> np.ndarray:
    """Mean of `size` consecutive frame distances within each episode (a shorter tail is kept if it
    has at least half a segment): (n,) -> (segments,)."""
    out = []
    for e in np.unique(ep):
        v = d[ep == e]
        for s in range(0, len(v), size):
            if len(v[s : s + size]) >= max(1, size // 2):
                out.append(v[s : s + size].mean())
    return np.asarray(out)


def _nearest(
    emb: np.ndarray, steps: np.ndarray, ref: np.ndarray, ref_steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(d_step, d_set): distances of frames (n, E) to their nearest reference frame (m, E) at the same
    trajectory step (the nearest step the reference has, for steps beyond it) and in the whole set."""
    dist = torch.cdist(torch.from_numpy(emb).double(), torch.from_numpy(ref).double()).numpy()  # (n, m)
    d_set = dist.min(1)
    avail = np.unique(ref_steps)
    match = avail[np.abs(avail[None, :] - steps[:, None]).argmin(1)]  # (n,) nearest available step
    same = ref_steps[None, :] == match[:, None]  # (n, m)
    d_step = np.where(same, dist, np.inf).min(1)
    return d_step, d_set


# ---------------------------------------------------------------------------------------- calibration


@dataclass
class VisualCalibration:
    config: VisualConfig
    keys: list[str]
    reference: dict[str, np.ndarray]  # {key: (m, H, W, C) uint8} training real frames (the reference set R)
    ref_step: np.ndarray  # (m,) trajectory step of each reference frame
    frames: dict[str, np.ndarray]  # {key: (n, H, W, C) uint8} held-out real frames
    episode: np.ndarray  # (n,) held-out episode id of each frame
    step: np.ndarray  # (n,) trajectory step of each held-out frame
    null: np.ndarray  # (segments,) held-out segment scores of d
    frame_step: np.ndarray  # (n,) held-out frame distances d_step
    frame_set: np.ndarray  # (n,) held-out frame distances d_set

    _ARRAYS = ("ref_step", "episode", "step", "null", "frame_step", "frame_set")

    def save(self, run_dir: Path) -> None:
        arrays = {f"reference_{k}": v for k, v in self.reference.items()}
        arrays.update({f"frames_{k}": v for k, v in self.frames.items()})
        arrays.update({a: getattr(self, a) for a in self._ARRAYS})
        arrays["meta"] = np.array(
            json.dumps({"version": VISUAL_CALIBRATION_VERSION, "keys": self.keys, "config": asdict(self.config)})
        )
        with atomic_path(Path(run_dir) / FILE, suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)

    @classmethod
    def load(cls, run_dir: str | Path) -> VisualCalibration | None:
        path = Path(run_dir) / FILE
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("version") != VISUAL_CALIBRATION_VERSION:
                raise UserError(
                    f"{path} has visual calibration version {meta.get('version')}",
                    f"re-run `wmcheck calibrate {run_dir}`",
                )
            keys = meta["keys"]
            arrays = {a: z[a] for a in cls._ARRAYS}
            return cls(
                VisualConfig(**meta["config"]),
                keys,
                {k: z[f"reference_{k}"] for k in keys},
                arrays["ref_step"],
                {k: z[f"frames_{k}"] for k in keys},
                arrays["episode"],
                arrays["step"],
                arrays["null"],
                arrays["frame_step"],
                arrays["frame_set"],
            )

    @property
    def real_scale(self) -> float:
        """Median nearest-reference distance of held-out real frames (the unit of the reported ratios)."""
        return max(float(np.median(self.frame_set)), 1e-12)

    def combined(self, d_step: np.ndarray, d_set: np.ndarray) -> np.ndarray:
        """d = (d_step / m_step + d_set / m_set) / 2 (module docstring)."""
        return 0.5 * (d_step / max(float(np.median(self.frame_step)), 1e-12) + d_set / self.real_scale)


def _sample_frames(episodes, keys, stride: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    frames, eps, steps = {k: [] for k in keys}, [], []
    for ep in episodes:
        missing = [k for k in keys if k not in ep.obs_groups]
        if missing:
            raise UserError(
                f"episode {ep.id} has no camera frames {missing} (has {sorted(ep.obs_groups)})",
                "record the rollouts with the same cameras as the real log (wmcheck record --render WxH)",
            )
        idx = np.arange(0, len(ep.obs_groups[keys[0]]), stride)
        for k in keys:
            frames[k].append(np.asarray(ep.obs_groups[k])[idx])
        eps.append(np.full(len(idx), ep.id))
        steps.append(idx)
    return {k: np.concatenate(v) for k, v in frames.items()}, np.concatenate(eps), np.concatenate(steps)


def calibrate_visual(model, held_out, training, cfg: VisualConfig | None = None) -> VisualCalibration:
    """Reference set and real-vs-real null of the visual check (module docstring) from the model's
    training episodes and its held-out real episodes (Episodes with frames)."""
    cfg = cfg or VisualConfig()
    keys = list(model.cfg.image_keys)
    if not keys:
        raise ValueError("calibrate_visual needs a world model with image keys")
    if not held_out or not training:
        raise UserError(
            "the visual check needs held-out and training real episodes with frames",
            "train with --val-fraction > 0 on a log with camera frames",
        )
    rows = lambda eps: sum(len(ep.obs_groups[keys[0]]) for ep in eps if keys[0] in ep.obs_groups)  # noqa: E731
    stride = max(cfg.stride, int(np.ceil(max(rows(held_out), rows(training)) / cfg.max_frames)))
    cfg = VisualConfig(stride, cfg.segment, cfg.max_frames)
    ref, _, ref_steps = _sample_frames(training, keys, stride)
    frames, eps, steps = _sample_frames(held_out, keys, stride)
    d_step, d_set = _nearest(embed(model, frames), steps, embed(model, ref), ref_steps)
    cal = VisualCalibration(cfg, keys, ref, ref_steps, frames, eps, steps, np.zeros(0), d_step, d_set)
    cal.null = _segments(cal.combined(d_step, d_set), eps, cfg.segment)
    return cal


# ---------------------------------------------------------------------------------------- check


def visual_gap(model, cal: VisualCalibration | None, episodes, alpha: float, clip=None, tolerance=None) -> dict:
    """The report's `visual` gap entry for checked Episodes (with frames), see the module docstring.

    clip: optional `clip_embedding.ClipEmbedder`; adds the CLIP cosine distance with its practice bands.
    tolerance: the gate's `tolerances.visual`: {max_distance_ratio, max_clip_distance}; a present gap
    within every given bound is "tolerated"."""
    if cal is None:
        return {
            "verdict": "not_checked",
            "evidence": None,
            "estimate": None,
            "ci": None,
            "explanation": (
                "the logs have no image observations"
                if not getattr(model.cfg, "image_keys", None)
                else "no visual calibration: re-run `wmcheck calibrate RUNDIR`"
            ),
        }
    frames, eps, steps = _sample_frames(episodes, cal.keys, cal.config.stride)
    ref_emb, emb = embed(model, cal.reference), embed(model, frames)
    d_step, d_set = _nearest(emb, steps, ref_emb, cal.ref_step)
    scores = _segments(cal.combined(d_step, d_set), eps, cal.config.segment)
    p = mann_whitney_greater(scores, cal.null, np.random.default_rng(0))
    evidence = alpha / max(p, 1e-12)
    scale = cal.real_scale
    ratio_step = float(np.median(d_step) / max(np.median(cal.frame_step), 1e-12))
    ratio_set = float(np.median(d_set) / scale)
    set_distance = float(np.linalg.norm(emb.mean(0) - embed(model, cal.frames).mean(0)) / scale)
    per_episode = {str(int(e)): round(float(np.median(d_set[eps == e]) / scale), 3) for e in np.unique(eps)}
    photo = {k: _photometric_shift(frames[k], eps, cal.frames[k], cal.episode) for k in cal.keys}
    estimate = {
        "embedding": "world-model image encoder",
        "distance_ratio": round(ratio_set, 4),
        "distance_ratio_matching_steps": round(ratio_step, 4),
        "set_distance": round(set_distance, 4),
        "p_value": float(f"{p:.4g}"),
        "segments": int(len(scores)),
        "real_segments": int(len(cal.null)),
        "frame_stride": int(cal.config.stride),
        "per_episode_distance_ratio": per_episode,
        "photometric": photo,
        "clip": None,
    }
    explanation = (
        f"checked frames lie {ratio_set:.2f}x as far from the nearest real frame as held-out real frames do "
        f"({ratio_step:.2f}x at matching steps; world-model encoder; rank test p = {p:.3g}, "
        f"{len(scores)} checked vs {len(cal.null)} real segments)"
    )
    said = [s for k in cal.keys for s in photo[k]["explains"]]
    if said:
        explanation += "; " + ", ".join(said)
    if clip is not None:
        k = cal.keys[0]
        estimate["clip"] = clip.compare(frames[k], steps, cal.reference[k], cal.ref_step, cal.frames[k], cal.step)
        c = estimate["clip"]
        explanation += (
            f"; CLIP mean cosine distance {c['mean_cosine_distance']:.3f} (held-out real "
            f"{c['real_mean_cosine_distance']:.3f}): {c['practice']}"
        )
    verdict = "present" if evidence >= 1.0 else "absent"
    from wmcheck.checks.config import VisualTolerance

    tol = (
        tolerance
        if isinstance(tolerance, VisualTolerance)
        else VisualTolerance.from_dict(tolerance, "gate tolerances.visual")
    )
    clip_distance = estimate["clip"]["mean_cosine_distance"] if estimate["clip"] is not None else None
    if verdict == "present" and tol.covers(ratio_set, clip_distance):
        verdict = "tolerated"
    floor = 1.0 / comb(len(scores) + len(cal.null), len(cal.null))  # smallest p the rank test can give
    estimate["smallest_attainable_p"] = float(f"{floor:.4g}")
    if floor >= alpha:  # it could not have failed: say so instead of calling the gap absent
        verdict = "not_checked"
        explanation = (
            f"too few segments to test at alpha {alpha:g} ({len(scores)} checked, {len(cal.null)} held-out real: "
            f"the smallest attainable p is {floor:.3g}); check more episodes or hold out more real ones. " + explanation
        )
    return {
        "verdict": verdict,
        "evidence": round(float(evidence), 3),
        "estimate": estimate,
        "ci": None,
        "explanation": explanation,
    }


def _photometric_shift(frames: np.ndarray, eps: np.ndarray, real: np.ndarray, real_eps: np.ndarray) -> dict:
    """Checked vs real photometric statistics with the real between-episode spread; the ones beyond
    twice that spread are worded in `explains` (e.g. "simulated frames 32% brighter")."""
    c, r = photometric(frames), photometric(real)  # (n, 6), (m, 6)
    per_ep = np.stack([r[real_eps == e].mean(0) for e in np.unique(real_eps)])  # (episodes, 6)
    spread = per_ep.std(0, ddof=1) if len(per_ep) > 1 else np.zeros(len(STATS))
    cm, rm = c.mean(0), r.mean(0)
    out = {"checked": {}, "real": {}, "relative_change": {}, "real_spread": {}, "explains": []}
    order = np.argsort(-np.abs(cm - rm) / np.maximum(spread, 1e-6))
    for i, name in enumerate(STATS):
        rel = (cm[i] - rm[i]) / max(abs(rm[i]), 1e-6)
        out["checked"][name], out["real"][name] = round(float(cm[i]), 3), round(float(rm[i]), 3)
        out["relative_change"][name], out["real_spread"][name] = round(float(rel), 4), round(float(spread[i]), 3)
    for i in order:
        name = STATS[i]
        rel = (cm[i] - rm[i]) / max(abs(rm[i]), 1e-6)
        if abs(cm[i] - rm[i]) > 2 * spread[i] and abs(rel) > 0.03:
            word = STAT_WORDS[name][0 if rel > 0 else 1]
            what = (
                "mean luminance"
                if name == "luminance"
                else (f"{name} share" if name in ("red", "green", "blue") else name)
            )
            out["explains"].append(f"simulated frames {abs(rel):.0%} {word} ({what} {cm[i]:.3g} vs real {rm[i]:.3g})")
    return out


def require_frames(model, episodes, path) -> None:
    """UserError when a model that sees cameras is given episodes without (matching) frames."""
    keys = list(getattr(model.cfg, "image_keys", []) or [])
    if not keys:
        return
    H, W, _ = model.cfg.image_shape
    for ep in episodes:
        missing = [k for k in keys if k not in ep.obs_groups]
        if missing:
            raise UserError(
                f"{path}: episode {ep.id} has no camera frames {missing}; the model was trained on them",
                "record the rollouts with frames of the same size (wmcheck record --render "
                f"{W}x{H}) or check against a model trained with --no-images",
            )
        for k, c in zip(keys, model.cfg.image_key_channels):
            shape = tuple(np.asarray(ep.obs_groups[k]).shape[1:])
            if shape != (H, W, c):
                raise UserError(
                    f"{path}: episode {ep.id} frames {k!r} are {shape}, the model's are {(H, W, c)}",
                    f"record the rollouts with --render {W}x{H}",
                )


def checked_video(model, blocks, order, context: int) -> dict[str, np.ndarray]:
    """Open-loop video frames of the checked blocks `order` (worst first) for TensorBoard:
    {key: (T, rows, cols, 3) uint8}, true / predicted / error rows (training/openloop_video.py)."""
    if not getattr(model.cfg, "image_keys", None) or len(order) == 0:
        return {}
    from wmcheck.training.openloop_video import openloop_frames, video_grid

    seq = blocks.batch.map(lambda x: x[np.asarray(order)]).to_torch(next(model.parameters()).device)
    truth, pred = openloop_frames(model, seq, context)
    return {k: video_grid(truth[k], pred[k], context) for k in truth}
