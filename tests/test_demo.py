"""The README's main-job command, with a tiny training budget: real data in, a trained model out."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "wmcheck.scripts.cli", "--threads", "1", "demo", "--out", str(out),
                           "--max-steps", "20", "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "episodes         5 produced" in proc.stdout  # the embedded subset's import summary
    assert "findings: 0 error(s)" in proc.stdout
    assert (out / "run" / "model.pt").exists() and (out / "la-haute-borne-R80721.h5").exists()
    assert "tensorboard --logdir" in proc.stdout
