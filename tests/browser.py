"""A real headless browser for the HTML tests: `dom(html_path, tmp_path)` is the page's DOM after
rendering (Chromium `--dump-dom`), `fragment` opens the page at `#fragment` and `window` sets the
window size; `layout(html_path, tmp_path)` measures every image as the browser lays it out. The test
is skipped where no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def dom(html: Path, tmp_path: Path, fragment: str | None = None, window: tuple[int, int] = (1280, 900)) -> str:
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
            f"--window-size={window[0]},{window[1]}",
            "--force-device-scale-factor=1",
            "--dump-dom",
            Path(html).resolve().as_uri() + (f"#{fragment}" if fragment else ""),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.stdout.strip(), out.stderr[-2000:]
    return out.stdout


MEASURE_JS = """<script>window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('details').forEach(function (d) { d.open = true; });
  document.querySelectorAll('img').forEach(function (im) {
    out.push([im.alt, im.getBoundingClientRect().width, im.naturalWidth, im.naturalHeight]);
  });
  var p = document.createElement('pre'); p.id = 'layout'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});</script>"""


def layout(html: Path, tmp_path: Path, window: tuple[int, int] = (1280, 900)) -> list[tuple[str, float, int, int]]:
    """Every <img> of the page as Chromium lays it out with all sections open: (alt, displayed CSS
    width, natural pixel width, natural pixel height). Measured on a copy with a measuring script."""
    import json
    import re

    copy = tmp_path / "measured.html"
    copy.write_text(Path(html).read_text().replace("</body>", MEASURE_JS + "</body>"))
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom(copy, tmp_path, window=window), re.S)
    assert found, "the measuring script did not run"
    return [tuple(x) for x in json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))]
