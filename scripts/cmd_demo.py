"""`wmcheck demo`: the main job end to end on the embedded real data (La Haute Borne SCADA).

Imports the embedded wind-turbine subset with its mapping, validates it, trains a small world model
on it and, once a check target is available, checks it; prints where everything is.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole job on the embedded real wind-turbine data",
        description=(
            "Run wmcheck end to end on the embedded real data (one La Haute Borne turbine, "
            "March-June 2014, 10-minute SCADA; source: ENGIE, La Haute Borne open data): import with "
            "the shipped mapping, validate, train a small world model on a CPU, and print where the "
            "log, the model and the TensorBoard run are. Takes a few minutes on a 2-core CPU."
        ),
    )
    p.add_argument("--out", type=Path, default=Path("wmcheck-demo"), help="output folder (default ./wmcheck-demo)")
    p.add_argument("--max-steps", type=int, default=800, help="training steps (default 800)")
    p.add_argument("--preset", default="debug", help="world-model preset (default debug)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _stage(n: int, total: int, text: str) -> float:
    print(f"[{n}/{total}] {text}", flush=True)
    return time.perf_counter()


def run(args: argparse.Namespace) -> int:
    from wmcheck.datasets.embedded import embedded_data_path, embedded_mapping_path
    from wmcheck.datasets.importers import build_mapping, import_to_log
    from wmcheck.datasets.validate import validate_log
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "la-haute-borne-R80721.h5"
    total = 3
    t0 = _stage(1, total, f"importing the embedded SCADA subset {embedded_data_path().name}")
    summary = import_to_log(embedded_data_path(), log, mapping=build_mapping(embedded_mapping_path()))
    print(summary.format_text())
    _stage(2, total, f"validating {log}")
    report = validate_log(log)
    print(report.format_text())
    if not report.ok:
        return 2
    _stage(3, total, f"training a '{args.preset}' world model for {args.max_steps} steps (CPU)")
    cfg = TrainConfig(preset=args.preset, max_steps=args.max_steps, lr=1e-3, warmup=min(100, args.max_steps),
                      val_every=max(1, min(400, args.max_steps)), ckpt_every=max(1, min(200, args.max_steps)),
                      progress_bar=not args.no_progress)
    result = train(log, out / "run", build_run_config(cfg))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")
    print(f"  log:         {log}")
    print(f"  model:       {result.model_path}")
    print(f"  TensorBoard: tensorboard --logdir {result.run_dir}")
    return 0
