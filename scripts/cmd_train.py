"""`wmcheck train`: train the world model on a log; writes RUNDIR (see wmcheck.training.run)."""
from __future__ import annotations

import argparse
from pathlib import Path

from wmcheck.scripts.errors import UserError


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
    p.add_argument("log", type=Path, help="training log (wmcheck HDF5 log format)")
    p.add_argument("--out", type=Path, required=True, help="run directory (created; an existing run there is resumed)")
    p.add_argument("--preset", default="debug", help="model size: debug, size1m, size12m, size25m, size50m, ... (default debug)")
    p.add_argument("--max-steps", type=int, default=2000, help="optimiser steps (default 2000)")
    p.add_argument("--ensemble", type=int, default=1, help="K prior heads for epistemic uncertainty (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.2, help="held-out episode fraction (default 0.2)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per batch B (default 16)")
    p.add_argument("--seq-len", type=int, default=64, help="steps per sequence T (default 64)")
    p.add_argument("--lr", type=float, default=4e-5, help="learning rate (reference 4e-5)")
    p.add_argument("--warmup", type=int, default=1000, help="learning-rate warm-up steps (default 1000)")
    p.add_argument("--val-every", type=int, default=500, help="steps between val/openloop evaluations")
    p.add_argument("--ckpt-every", type=int, default=200, help="steps between resumable checkpoints")
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    p.add_argument("--devices", default="auto", help="Lightning devices: auto, N, or a list like 0,1")
    p.add_argument("--strategy", default="auto", help="Lightning strategy: auto, ddp, ...")
    p.add_argument("--precision", default="auto", help="auto (bf16-mixed on GPUs, 32-true on CPU) or a Lightning precision")
    p.add_argument("--no-resume", action="store_true", help="start afresh even if RUNDIR holds a checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-images", action="store_true", help="ignore the log's camera frames (train on the vector channels only)")
    p.add_argument("--no-calibrate", action="store_true", help="skip calibration (run `wmcheck calibrate RUNDIR` later)")
    from wmcheck.scripts.cmd_calibrate import add_check_geometry

    add_check_geometry(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    if not args.log.exists():
        raise UserError(f"log file {args.log} does not exist", "check the path; create logs with `wmcheck import` or `wmcheck record`")
    try:
        tcfg = TrainConfig(
            preset=args.preset, max_steps=args.max_steps, batch_size=args.batch_size, seq_len=args.seq_len,
            lr=args.lr, warmup=args.warmup, seed=args.seed, val_fraction=args.val_fraction,
            val_every=args.val_every, ckpt_every=args.ckpt_every, accelerator=args.accelerator,
            devices=args.devices, strategy=args.strategy, precision=args.precision,
            progress_bar=not args.no_progress, images=not args.no_images,
        )
        rc = build_run_config(tcfg, ensemble=args.ensemble)
    except ValueError as exc:
        raise UserError(f"bad training option: {exc}", "see `wmcheck train --help`") from None
    result = train(args.log, args.out, rc, resume=not args.no_resume)
    print(f"trained {result.steps} steps; model: {result.model_path}")
    if not args.no_calibrate and args.val_fraction > 0:
        from wmcheck.checks.calibration import calibrate
        from wmcheck.checks.config import CheckConfig

        try:
            ccfg = CheckConfig(alpha=args.alpha, context=args.context, horizon=args.horizon, max_delay=args.max_delay)
        except ValueError as exc:
            raise UserError(f"bad calibration option: {exc}", "see `wmcheck train --help`") from None
        calibrate(args.out, args.log, ccfg)
    print(f"inspect: tensorboard --logdir {result.run_dir}")
    return 0
