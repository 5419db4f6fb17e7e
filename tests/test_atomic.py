"""Atomic writes (datasets/atomic.py) and the atomic checkpoint writer, with faults injected."""

from __future__ import annotations

import os

import pytest
import torch

from wmcheck.datasets.atomic import atomic_path, remove_stale_temporaries, write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.training import checkpoint as ckpt_module


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """A write that dies half-way (here: torch.save writes half its bytes, then fails) leaves the
    previous checkpoint loadable at the final path and no temporary file behind."""
    io = ckpt_module.atomic_checkpoint_io()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 40, "w": torch.ones(1000)}, path)
    real_save = torch.save

    def dying_save(obj, f):
        real_save(obj, f)
        with open(f, "r+b") as fh:  # cut the file in half, as a kill during the write would
            fh.truncate(os.path.getsize(f) // 2)
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt_module.torch, "save", dying_save)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"global_step": 60, "w": torch.zeros(1000)}, path)
    monkeypatch.setattr(ckpt_module.torch, "save", real_save)
    assert torch.load(path, weights_only=True)["global_step"] == 40
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_the_temporary_file_is_beside_the_target_and_stale_ones_are_cleaned(tmp_path):
    target = tmp_path / "last.ckpt"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent  # same folder: the rename is never a copy
        tmp.write_bytes(b"x")
    # a kill between creating the temporary and the rename leaves one like this
    stale = tmp_path / ".last.ckpt.abc123.tmp"
    stale.write_bytes(b"half")
    assert remove_stale_temporaries(tmp_path, "last.ckpt") == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_device_or_a_folder_is_never_replaced(tmp_path):
    (tmp_path / "folder").mkdir()
    for target in (tmp_path / "folder", "/dev/null"):
        if not os.path.exists(target):
            continue
        with pytest.raises(UserError, match="not a regular file"):
            write_text_atomic(target, "report")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
