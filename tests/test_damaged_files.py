"""Damaged or unsafe model and checkpoint files: a clean error that names the file, never a
traceback and never the advice to load a file unsafely (training/checkpoint.py)."""

from __future__ import annotations

import pytest
import torch

from wmcheck.datasets.errors import UserError
from wmcheck.training.checkpoint import load_model, read_checkpoint


def test_an_empty_model_file_is_named_and_called_damaged(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(UserError) as err:
        load_model(tmp_path)
    assert "model.pt" in err.value.problem and "empty or cut short" in err.value.problem


def test_a_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"global_step": 3, "state_dict": {"w": torch.zeros(100)}}, path)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(UserError) as err:
        read_checkpoint(path, "delete it and start afresh")
    assert str(path) in err.value.problem and err.value.fix == "delete it and start afresh"


class Payload:
    """An arbitrary Python object: unpickling one can run code, so a safe load refuses it."""


def test_pickled_objects_are_refused_without_advice_to_load_them_unsafely(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"payload": Payload()}, path)
    with pytest.raises(UserError) as err:
        load_model(path)
    text = f"{err.value.problem} {err.value.fix}"
    assert "pickled Python objects" in text
    assert "weights_only" not in text and "unsafe" not in text.lower() and "trust" not in text.lower()
