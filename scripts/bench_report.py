"""What every benchmark script records about the machine it ran on, and how it writes its results.

Owns `machine_info` (date, versions, CPU count, torch threads, load average at the start: these
machines are shared, so every figure is read next to the load it ran under), `finish` (load
average at the end, total seconds) and `write_results` (OUT/<stem>.json and OUT/<stem>.md, each
written to a temporary name and renamed). Used by bench_detection.py, bench_worldmodel.py and
bench_train.py.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from wmcheck.datasets.atomic import write_text_atomic


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages, or None where the platform has none."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def machine_info(**extra) -> dict:
    """Date, Python / torch versions, platform, CPUs, torch threads, start load average, plus `extra`."""
    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **extra,
    }
    load = load_average()
    if load is not None:
        info["loadavg_start"] = load
    return info


def finish(info: dict, started: float) -> dict:
    """Add the end load average and the seconds since `started` (time.perf_counter) to `info`."""
    load = load_average()
    if load is not None:
        info["loadavg_end"] = load
    info["total_seconds"] = time.perf_counter() - started
    return info


def write_results(out: Path, stem: str, payload: dict, md: str) -> None:
    """OUT/<stem>.json (payload) and OUT/<stem>.md, atomically, and say where they went."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{stem}.json", json.dumps(payload, indent=2))
    write_text_atomic(out / f"{stem}.md", md)
    took = payload.get("machine", {}).get("total_seconds")
    print(
        f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}" + (f" ({took:.0f} s)" if took is not None else ""),
        flush=True,
    )
