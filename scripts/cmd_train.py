"""`wmcheck train`: train the world model on a log; writes RUNDIR (see wmcheck.training.run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from wmcheck.scripts.cmd_calibrate import check_config
from wmcheck.scripts.config_args import add_options, config_kwargs

STOPS = {
    "max_steps": "the --max-steps cap",
    "early_stopping": "early stopping: the last --patience validations improved the validation metric "
    "(--stop-on) by at most --min-improvement of its total improvement",
    "time_budget": "the --max-minutes budget",
}

MONITORED = {"val/openloop_nrmse": "held-out open-loop NRMSE", "val/loss/total": "validation loss"}

TRAIN_OPTIONS = [
    "preset",
    "max_steps",
    "seed",
    "val_fraction",
    "folds",
    "batch_size",
    "seq_len",
    "lr",
    "warmup",
    "val_every",
    "patience",
    "min_improvement",
    "stop_on",
    "max_minutes",
    "ckpt_every",
    "accelerator",
    "devices",
    "strategy",
    "precision",
]
"""The TrainConfig fields `train` exposes (defaults and help come from the dataclass)."""


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train the DreamerV3 world model on a (real) log",
        description=(
            "Train the DreamerV3 world model on LOG.h5 (import real logs first with `wmcheck import`). "
            "Writes RUNDIR/config.json, RUNDIR/checkpoints/last.ckpt (resumable: run the same command "
            "again after a kill), a TensorBoard run in RUNDIR/tb (`tensorboard --logdir RUNDIR`) and "
            "RUNDIR/model.pt, the model that `wmcheck check` uses."
        ),
    )
    p.add_argument(
        "log",
        type=Path,
        help="training log (wmcheck HDF5 log format), or a Minari dataset folder or id (local Minari root)",
    )
    p.add_argument("--out", type=Path, required=True, help="run directory (created; an existing run there is resumed)")
    from wmcheck.training.config import TrainConfig
    from wmcheck.worldmodel.config import WorldModelConfig

    add_options(
        p, TrainConfig, TRAIN_OPTIONS[:1], {"preset": "model size: debug, size1m, size12m, size25m, size50m, ..."}
    )
    add_options(p, TrainConfig, TRAIN_OPTIONS[1:])
    add_options(p, WorldModelConfig, ["ensemble"])
    p.add_argument("--no-resume", action="store_true", help="start afresh even if RUNDIR holds a checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-images", action="store_true", help="ignore the log's camera frames (train on the vector channels only)"
    )
    p.add_argument(
        "--no-calibrate", action="store_true", help="skip calibration (run `wmcheck calibrate RUNDIR` later)"
    )
    from wmcheck.scripts.cmd_calibrate import add_check_geometry

    add_check_geometry(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import wmcheck
    from wmcheck.scripts.cmd_calibrate import CHECK_OPTIONS

    check_options = config_kwargs(args, CHECK_OPTIONS)
    horizon = check_config(args, "train").horizon  # a bad --alpha / --horizon is refused before training

    def summary(result) -> None:  # printed before calibration starts
        print(f"trained {result.steps} steps ({STOPS[result.stop_reason]}); model: {result.model_path}", end="")
        print(
            f" (weights of step {result.best_step}, the best {MONITORED[result.monitor]})"
            if result.best_step is not None
            else ""
        )
        if result.quality is not None:
            print("\n".join(result.quality.lines(check_horizon=horizon)))
        else:
            print("no held-out real episode long enough for a quality card: pass a larger --val-fraction")

    result = wmcheck.train(
        args.log,
        args.out,
        resume=not args.no_resume,
        calibrate=not args.no_calibrate,
        ensemble=args.ensemble,
        check_options=check_options,
        on_trained=summary,
        notes=lambda note: print(f"warning: {note}"),
        **config_kwargs(args, TRAIN_OPTIONS),
        progress_bar=not args.no_progress,
        images=not args.no_images,
    )
    if result.global_zero and result.folds:
        print(f"cross-fitted: {len(result.folds)} fold models, every real episode held out once")
        if result.quality is not None:
            print("\n".join(result.quality.lines(check_horizon=horizon)))
    if result.global_zero:  # another process of a multi-device run: rank 0 reports and calibrates
        print(f"inspect: tensorboard --logdir {result.run_dir}")
    return 0
