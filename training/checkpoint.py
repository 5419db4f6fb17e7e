"""Model export and loading: what a checked model is made of, loaded without pickle.

Owns the `model.pt` format, a dict of tensors and strings that `torch.load(weights_only=True)`
reads: the world model's weights, the resolved config (JSON), the normalisation statistics (JSON),
the channel names / units / dt of the training log (JSON) and a SHA-256 of the training data.
`load_model(path)` rebuilds the model from that file alone; a file of another format or version,
or weights that do not fit the config, are errors naming the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from wmcheck.datasets.atomic import atomic_path
from wmcheck.datasets.errors import UserError
from wmcheck.worldmodel import WorldModel, WorldModelConfig

MODEL_FORMAT = "wmcheck-model"
MODEL_VERSION = 1


@dataclass
class ModelBundle:
    """A world model with everything needed to apply it to new data."""

    model: WorldModel
    run_config: dict  # the resolved RunConfig as a dict
    normalizer: dict  # Normalizer.to_dict()
    channels: dict  # {"observation_names", "action_names", "input_names", "units", "dt"}
    data_hash: str
    file_hash: str = ""


def atomic_checkpoint_io():
    """Lightning's checkpoint writer with our atomic write: the temporary file beside the target
    (Lightning's own goes through the system temp folder, so on another filesystem its rename is a
    copy that a kill leaves half-written), fsynced, then renamed; the previous checkpoint stays in
    place until the new one is complete."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
            with atomic_path(path) as tmp:
                torch.save(checkpoint, tmp)

    return AtomicCheckpointIO()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def export_payload(model: WorldModel, run_config: dict, normalizer: dict, channels: dict, data_hash: str) -> dict:
    return {
        "format": MODEL_FORMAT,
        "format_version": MODEL_VERSION,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config_json": json.dumps(run_config, sort_keys=True),
        "normalizer_json": json.dumps(normalizer, sort_keys=True),
        "channels_json": json.dumps(channels, sort_keys=True),
        "data_hash": data_hash,
    }


def save_model(
    path: str | Path, model: WorldModel, run_config: dict, normalizer: dict, channels: dict, data_hash: str
) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(export_payload(model, run_config, normalizer, channels, data_hash), tmp)
    return path


def bundle_from_payload(payload: dict, source: str = "checkpoint") -> ModelBundle:
    if payload.get("format") != MODEL_FORMAT:
        raise UserError(
            f"{source} is not a wmcheck model (format {payload.get('format')!r})",
            "pass RUNDIR/model.pt written by `wmcheck train`",
        )
    if int(payload.get("format_version", 0)) > MODEL_VERSION:
        raise UserError(
            f"{source} has model format version {payload['format_version']}, newer than this wmcheck ({MODEL_VERSION})",
            "upgrade wmcheck",
        )
    run_config = json.loads(payload["config_json"])
    try:
        cfg = WorldModelConfig.from_dict(run_config["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{source}: stored world-model config is invalid: {exc}", "retrain with this wmcheck version"
        ) from None
    model = WorldModel(cfg)
    missing, unexpected = model.load_state_dict(payload["state_dict"], strict=False)
    if missing or unexpected:
        raise UserError(
            f"{source}: weights do not match the stored config (missing {missing[:3]}, unexpected {unexpected[:3]})",
            "the file is corrupted or from another wmcheck version; retrain",
        )
    model.eval()
    return ModelBundle(
        model,
        run_config,
        json.loads(payload["normalizer_json"]),
        json.loads(payload["channels_json"]),
        payload["data_hash"],
    )


def load_failure(exc: BaseException) -> str:
    """Why a file could not be read, in one line for the user: never torch's advice to load it
    unsafely (weights_only=False runs arbitrary code from the file), and something even when the
    exception has no message (an empty file raises a bare EOFError)."""
    text = str(exc).strip()
    if "weights only" in text.lower() or "weights_only" in text:
        return "it holds pickled Python objects, which wmcheck never loads (only tensors and plain values)"
    first = text.splitlines()[0][:200] if text else ""
    if isinstance(exc, EOFError) or not first:
        return f"{type(exc).__name__} (the file is empty or cut short)"
    return f"{type(exc).__name__}: {first}"


def read_checkpoint(path: str | Path, fix: str, map_location: str = "cpu") -> dict:
    """torch.load(weights_only=True) of a checkpoint, a damaged or unsafe file a UserError that names it."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated, empty, not a torch file, or pickled objects
        raise UserError(f"cannot read {path}: {load_failure(exc)}", fix) from None


def load_model(path: str | Path, map_location: str = "cpu") -> ModelBundle:
    """Load RUNDIR/model.pt (or a RUNDIR) with weights_only=True."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise UserError(f"no model at {path}", "train one with `wmcheck train LOG.h5 --out RUNDIR` and pass RUNDIR")
    payload = read_checkpoint(
        path, "the file is damaged or not a wmcheck model; re-export it with `wmcheck train`", map_location
    )
    bundle = bundle_from_payload(payload, str(path))
    bundle.file_hash = file_sha256(path)
    return bundle
