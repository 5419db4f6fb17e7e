"""A real headless browser for the HTML tests: `dom(html_path, tmp_path)` is the page's DOM after
rendering (Chromium `--dump-dom`); the test is skipped where no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def dom(html: Path, tmp_path: Path) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("chromium not installed (scripts/setup.sh installs it)")
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chrome'}",
            "--virtual-time-budget=3000",
            "--dump-dom",
            Path(html).resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.stdout.strip(), out.stderr[-2000:]
    return out.stdout
