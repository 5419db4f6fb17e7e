"""Logs read against a trained model: the channels must be the model's.

Owns the one rule every command that feeds a log to a trained model applies (check's rollouts,
calibrate's extra real logs), and the episode fingerprint that tells whether two logs share an
episode (content, not ids: the same episode re-imported gets another id).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log


def episode_fingerprint(ep) -> str:
    """SHA-256 of an episode's observations, actions and inputs (float32 bytes, shapes included)."""
    h = hashlib.sha256()
    for arr in (ep.observations, ep.actions, ep.input_array()):
        a = np.ascontiguousarray(np.asarray(arr, np.float32))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def read_log_for_model(path: Path, channels: dict, role: str = "rollout log"):
    """(meta, episodes) of a log whose channels must be the model's (names and order; generic
    names like obs_0 match by count); a missing file or other channels is a UserError."""
    if not Path(path).exists():
        raise UserError(
            f"{role} {path} does not exist", "record one with `wmcheck record` or import it with `wmcheck import`"
        )
    with open_log(path) as log:
        meta = log.meta
        eps = list(log)
    problems = []
    for kind, mine in (
        ("observation", meta.observation_names),
        ("action", meta.action_names),
        ("input", meta.input_names),
    ):
        theirs = channels.get(f"{kind}_names", [])
        if len(mine) != len(theirs):
            problems.append(f"{len(mine)} {kind} channels {mine} but the model has {len(theirs)} {theirs}")
        elif mine != theirs and not all(n.startswith(("obs_", "act_", "action_", "input_")) for n in mine):
            problems.append(f"{kind} channels {mine} differ from the model's {theirs}")
    if problems:
        raise UserError(
            f"{path} does not fit the model: " + "; ".join(problems),
            "record/import it with the same channels, in the same order, as the real training log",
        )
    return meta, eps
