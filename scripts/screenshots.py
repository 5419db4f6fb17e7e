"""Screenshots of a demo's report.html and its TensorBoard for the README (headless chromium).

    python scripts/screenshots.py wmcheck-demo --out scripts/screenshots

Takes `DEMO/report-simulator/report.html` (full page, then cropped to the top) and TensorBoard
serving DEMO (scalars page) and writes small PNGs (`report.png`, `tensorboard.png`). Needs
chromium (scripts/setup.sh installs it as root) and the tensorboard package.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        sys.exit("chromium not found: run scripts/setup.sh as root, or install chromium")
    return exe


def shoot(url: str, png: Path, width: int, height: int, wait_ms: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--virtual-time-budget={wait_ms}",
                f"--screenshot={png}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )


def shrink(png: Path, max_width: int = 760, max_height: int = 1100, colors: int = 32) -> None:
    """Downscale, crop to the top and palette-quantise so the committed PNG stays small."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    if img.width > max_width:
        img = img.resize((max_width, round(img.height * max_width / img.width)), Image.LANCZOS)
    img = img.crop((0, 0, img.width, min(img.height, max_height)))
    img.quantize(colors=colors).save(png, optimize=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("demo", type=Path, help="a `wmcheck demo --out` folder")
    ap.add_argument("--out", type=Path, default=Path("scripts/screenshots"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = (args.demo / "report-simulator" / "report.html").resolve()
    shoot(report.as_uri(), args.out / "report.png", 1150, 1900, 3000)
    shrink(args.out / "report.png")
    port = _free_port()
    tb = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(args.demo),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(8)  # TensorBoard reads the event files before it serves them
        shoot(f"http://127.0.0.1:{port}/?darkMode=false#timeseries", args.out / "tensorboard.png", 1300, 900, 15000)
        shrink(args.out / "tensorboard.png")
    finally:
        tb.terminate()
        tb.wait(timeout=30)
    for name in ("report.png", "tensorboard.png"):
        print(f"{args.out / name}: {(args.out / name).stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
