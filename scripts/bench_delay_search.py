"""The delay-only fit: `sysid.delay_search` against L-BFGS, on a trained and calibrated run.

When the latency test fires, `sysid.fit` fits the delay alone: a forward-only scan of the whole
shifts, then a one-dimensional refinement. This script records simulators through
`wmcheck.checks.reality` profiles (8 episodes of 200 steps under hold:5 by default) and, for each,
runs the refinement both ways on the same blocks:
  search   `sysid.fit` as the check runs it (scan, then `delay_search`);
  L-BFGS   `sysid.fit(..., start=)` from the whole shift nearest the search's result (L-BFGS with
           a strong-Wolfe line search, the path `fit` takes for several free parameters).
It prints the model's evaluations of each (the identity's, given to both, counted once in each;
the search's also counts the scan's), the seconds (median of `--repeats`, after one untimed
warm-up of each), the delay and the difference of the penalised objectives (search - L-BFGS:
positive means L-BFGS ended lower).

    .venv/bin/python scripts/bench_delay_search.py RUN --env HalfCheetah-v5 \\
        --profiles '{"latency_steps": 0.5}' '{"latency_steps": 1.6}' --out /tmp/bds

Writes OUT/bench_delay_search.json and OUT/bench_delay_search.md (atomically).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks import sysid
from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.calibration import load_run
from wmcheck.checks.reality import RealityProfile, record_reality
from wmcheck.datasets.normalize import Normalizer
from wmcheck.scripts.bench_report import finish, machine_info, write_results


def _timed(f, repeats: int):
    f()  # warm-up (the first pass of a new batch shape is slower)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def compare(model, norm, eps, context: int, max_delay: int, repeats: int) -> dict:
    """Both refinements of the delay alone on the blocks of `eps`."""
    H = sysid.ATTRIBUTION_HORIZON
    layout = sysid.Layout.for_normalizer(norm, max_delay)
    blocks = make_blocks(eps, norm, context, H)
    data = sysid.FitData.of(eps, blocks, norm, layout)
    i_d = layout.index("delay")
    p = len(layout)
    lo, hi = np.zeros(p), np.zeros(p)
    lo[i_d], hi[i_d] = -max_delay, max_delay
    ident = sysid.evaluate(model, data, np.zeros(p), layout, context, H)
    search, t_search = _timed(lambda: sysid.fit(model, data, layout, [i_d], lo, hi, context, H, ident), repeats)
    start = np.zeros(p)
    start[i_d] = np.round(search.theta[i_d])
    lbfgs, t_lbfgs = _timed(
        lambda: sysid.fit(model, data, layout, [i_d], lo, hi, context, H, ident, start=start), repeats
    )

    def objective(f) -> float:
        return float(f.J1 + 0.5 * sysid.RIDGE * f.theta[i_d] ** 2)

    scans = 2 * max_delay  # the whole shifts but the identity
    return {
        "blocks": len(blocks),
        "search_delay": float(search.theta[i_d]),
        "search_evaluations": int(search.evaluations),
        "search_after_scan": int(search.evaluations) - scans,
        "search_seconds": t_search,
        "lbfgs_delay": float(lbfgs.theta[i_d]),
        "lbfgs_evaluations": int(lbfgs.evaluations),
        "lbfgs_seconds": t_lbfgs,
        "objective_difference": objective(search) - objective(lbfgs),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a trained and calibrated run directory")
    ap.add_argument("--env", required=True, help="the gymnasium environment of the run's reality")
    ap.add_argument("--profiles", nargs="+", default=['{"latency_steps": 1.6}'], help="RealityProfile JSONs")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--max-delay", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    info = machine_info(command="bench_delay_search", run=str(args.run), env=args.env)
    bundle = load_run(args.run)
    model, norm = bundle.model.eval(), Normalizer.from_dict(bundle.normalizer)
    rows = []
    for text in args.profiles:
        profile = json.loads(text)
        eps = record_reality(
            args.env,
            RealityProfile(**profile),
            "hold:5",
            episodes=args.episodes,
            max_steps=args.max_steps,
            seed=args.seed,
        )
        row = {"profile": profile, **compare(model, norm, eps, args.context, args.max_delay, args.repeats)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [
        f"# The delay-only fit: delay_search against L-BFGS ({info['date']})",
        "",
        f"{args.env}, run {args.run}, {args.episodes} episodes of {args.max_steps} steps per simulator; "
        f"evaluations include the identity's; the search's include the scan's {2 * args.max_delay} shifts.",
        "",
        "| simulator | search: delay | evaluations (after the scan) | s | L-BFGS: delay | evaluations | s "
        "| objective search - L-BFGS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {json.dumps(r['profile'])} | {r['search_delay']:.3f} | {r['search_evaluations']} "
            f"({r['search_after_scan']}) | {r['search_seconds']:.2f} | {r['lbfgs_delay']:.3f} | "
            f"{r['lbfgs_evaluations']} | {r['lbfgs_seconds']:.2f} | {r['objective_difference']:.1e} |"
        )
    write_results(
        args.out, "bench_delay_search", {"machine": finish(info, started), "rows": rows}, "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
