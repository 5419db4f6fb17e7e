"""Open-loop video of camera frames for TensorBoard: true / predicted / error rows, context marked.

Owns the reference's report video (reference section 7): observe `context` frames, imagine the rest
under the logged controls, and show per time step one grid with a row of true frames, a row of
predicted frames (posterior reconstructions during the context, prior predictions after it) and a
row of errors (pred - true + 255) / 2 (mid-grey = no error), one column per sequence. Context frames
get a green border, imagined frames a red one. Videos are written as animated GIF image summaries
(what TensorBoard shows in its Images tab), encoded with Pillow; no video library is needed.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from wmcheck.worldmodel.rssm import State

GREEN, RED = (0, 200, 0), (220, 0, 0)


@torch.no_grad()
def openloop_frames(model, seq, context: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({key: true (B, T, H, W, c) uint8}, {key: predicted (B, T, H, W, c) uint8}) for a sequence of
    whole windows; predictions are reconstructions for t < context and open-loop for t >= context."""
    from wmcheck.worldmodel.model import _Slice

    was_training = model.training
    model.eval()
    try:
        obsd, last = model.observe(_Slice(seq, 0, context), sample=False)
        recon = model.decode_images(obsd.state)  # {key: (B, C, H, W, c)}
        states = model.imagine(
            State(last.deter, last.stoch),
            seq.prev_action[:, context:].float(),
            seq.prev_input[:, context:].float(),
            sample=True,
        )
        imagined = model.decode_images(states)  # {key: (B, T - C, H, W, c)}
    finally:
        model.train(was_training)
    truth = {k: seq.images[k].cpu().numpy() for k in recon}
    pred = {
        k: (torch.cat([recon[k], imagined[k]], 1).clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
        for k in recon
    }
    return truth, pred


def video_grid(truth: np.ndarray, pred: np.ndarray, context: int, border: int = 1) -> np.ndarray:
    """truth, pred (B, T, H, W, c) uint8 -> (T, 3 * (H + 2b), B * (W + 2b), 3) uint8 frames."""
    assert truth.shape == pred.shape and truth.ndim == 5, (
        f"truth {truth.shape} / pred {pred.shape} must be (B, T, H, W, c)"
    )
    B, T, H, W, c = truth.shape
    error = ((pred.astype(np.int16) - truth.astype(np.int16) + 255) // 2).astype(np.uint8)  # (B, T, H, W, c)
    rows = np.stack([truth, pred, error], 0)  # (3, B, T, H, W, c)
    if c == 1:
        rows = np.repeat(rows, 3, -1)
    elif c != 3:
        rows = np.repeat(rows[..., :1], 3, -1)  # stacked multi-camera frames: first channel as grey
    b = border
    out = np.zeros((T, 3, B, H + 2 * b, W + 2 * b, 3), np.uint8)
    for t in range(T):
        out[t, :, :] = GREEN if t < context else RED
    out[:, :, :, b : b + H, b : b + W] = rows.transpose(2, 0, 1, 3, 4, 5)  # (T, 3, B, H, W, 3)
    return out.transpose(0, 1, 3, 2, 4, 5).reshape(T, 3 * (H + 2 * b), B * (W + 2 * b), 3)


def gif_bytes(frames: np.ndarray, fps: float = 8.0, scale: int = 2) -> bytes:
    """(T, H, W, 3) uint8 -> an animated GIF (pixels repeated `scale` times, so small frames stay visible)."""
    from PIL import Image

    frames = frames.repeat(scale, 1).repeat(scale, 2)
    images = [Image.fromarray(f) for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buf.getvalue()


def log_video(writer, tag: str, frames: np.ndarray, step: int, fps: float = 8.0) -> None:
    """Write (T, H, W, 3) uint8 frames as an animated-GIF image summary to a torch SummaryWriter."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    data = gif_bytes(frames, fps)
    img = Summary.Image(height=frames.shape[1] * 2, width=frames.shape[2] * 2, colorspace=3, encoded_image_string=data)
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=img)]), step)


def log_openloop_videos(
    writer, model, seq, context: int, step: int, prefix: str = "openloop/video", sequences: int = 6
) -> list[str]:
    """Log one video per image key for the first `sequences` windows of `seq`; returns the tags."""
    from wmcheck.training.datamodule import batch_to

    if not getattr(model.cfg, "image_keys", None) or writer is None or not hasattr(writer, "file_writer"):
        return []
    sub = batch_to(seq.map(lambda x: x[:sequences]), next(model.parameters()).device)
    truth, pred = openloop_frames(model, sub, context)
    tags = []
    for key in truth:
        tag = f"{prefix}/{key}"
        log_video(writer, tag, video_grid(truth[key], pred[key], context), step)
        tags.append(tag)
    return tags
