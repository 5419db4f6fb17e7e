"""How long the HTML report takes to render, and how big it is, for one report.json.

    python scripts/bench_render.py REPORTDIR/report.json [--against REV] [--repeats 3]

Renders the report with this checkout's `checks/report_html.py` and, with --against, with the
version of that file at git revision REV (loaded beside it from `git show`), in one run, so the
ratio is measured on the same machine state. Prints the median render time, the page size and
the number of figures of each.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_at(rev: str, folder: Path):
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:checks/report_html.py"], capture_output=True, text=True, check=True
    ).stdout
    path = folder / "report_html_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("report_html_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(render, report: dict, repeats: int) -> tuple[float, int, int]:
    times, page = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        page = render(report)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(page.encode()), page.count("<img ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="a report.json written by `wmcheck check`")
    ap.add_argument("--against", metavar="REV", help="also render with checks/report_html.py at this git revision")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from wmcheck.checks import report_html

    report = json.loads(args.report.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        versions = [("this checkout", report_html)]
        if args.against:
            versions.insert(0, (args.against, _module_at(args.against, Path(tmp))))
        for name, module in versions:
            seconds, size, figures = measure(module.render_html, report, args.repeats)
            print(f"{name}: {seconds:.2f} s (median of {args.repeats}), {size / 1024:.0f} KiB, {figures} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
