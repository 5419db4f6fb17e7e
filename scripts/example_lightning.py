"""Train wmcheck's world model with your own Lightning `Trainer`, then reload it from the checkpoint.

`wmcheck train` does all of this for you (early stopping, the best checkpoint, resume, model.pt, the
quality card); this script shows the two Lightning pieces on their own, for a training script of
your own (other callbacks, loggers, devices, schedules):

  LogDataModule(log, TrainConfig(...))     random training windows of a wmcheck log, a fixed
                                           validation set and the held-out open-loop windows
  WorldModelModule.from_datamodule(dm)     the world model sized for the log (channels, cameras),
                                           with its normaliser and the log's data hash
  WorldModelModule.load_from_checkpoint(p) the module again from the checkpoint alone (its
                                           hyper-parameters are plain values: weights_only=True works)

    python -m wmcheck.scripts.example_lightning LOG.h5 --out example_run --max-steps 200
    tensorboard --logdir example_run      # train/*, val/*, openloop/*, and the HParams tab

Training is one endless epoch of random windows, so count it in steps (`max_steps`). Lightning
validates at the end of an epoch by default, which never comes: pass `val_check_interval=K,
check_val_every_n_epoch=None` to validate every K steps. Without it (as below) the module evaluates
once when training ends, so `val/*` and `openloop/*` are there either way.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, help="a wmcheck log (.h5) of the real system")
    p.add_argument("--out", type=Path, default=Path("example_run"), help="output folder (default example_run)")
    p.add_argument("--max-steps", type=int, default=200, help="optimiser steps (default 200)")
    p.add_argument("--preset", default="debug", help="world-model size preset (default debug)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default 16)")
    p.add_argument("--seq-len", type=int, default=32, help="steps per window (default 32)")
    args = p.parse_args(argv)

    import lightning as L
    import numpy as np
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    from wmcheck.training.config import TrainConfig
    from wmcheck.training.datamodule import LogDataModule
    from wmcheck.training.module import WorldModelModule
    from wmcheck.training.openloop import evaluate_openloop
    from wmcheck.training.progress import training_progress

    L.seed_everything(0, verbose=False)
    # The data side: batch size, window length, the held-out split, the learning rate and the
    # open-loop protocol all live in TrainConfig (wmcheck.training.config).
    cfg = TrainConfig(
        preset=args.preset,
        max_steps=args.max_steps,  # recorded with the hyper-parameters; the Trainer's max_steps is what counts
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        warmup=min(100, args.max_steps),
        log_every=max(1, min(25, args.max_steps // 4)),
    )
    dm = LogDataModule(args.log, cfg)
    module = WorldModelModule.from_datamodule(dm)  # validates and splits the log, fits the normaliser

    # Your Trainer: any logger, callbacks or devices. training_progress() shows "step k/N" on a
    # terminal (Lightning's own bar would show "Epoch 0/-2") and sparse lines in a log file.
    trainer = L.Trainer(
        max_steps=cfg.max_steps,
        log_every_n_steps=cfg.log_every,
        logger=TensorBoardLogger(save_dir=str(args.out), name="", version="tb", default_hp_metric=False),
        callbacks=[training_progress()],
        enable_checkpointing=False,  # this script saves one checkpoint itself, below
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    ckpt = args.out / "world_model.ckpt"
    trainer.save_checkpoint(ckpt, weights_only=False)  # here: keep the optimiser state too (resumable)

    # Reload from the checkpoint alone: no constructor arguments, no pickled objects.
    reloaded = WorldModelModule.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
    reloaded_dm = LogDataModule.load_from_checkpoint(ckpt, weights_only=True)  # the same log and TrainConfig
    reloaded_dm.prepare()  # the same split and normaliser (both are deterministic)

    # Predict: observe 16 steps of held-out windows, imagine the next ones under the logged controls.
    t = reloaded.run_config.train
    seq = reloaded_dm.openloop_sequence()
    result = None
    if seq is not None:
        torch.manual_seed(0)
        result = evaluate_openloop(reloaded.model, seq, t.openloop_context, t.openloop_horizons)
        for h, row in zip(result.horizons, result.nrmse):
            if not np.isnan(row).all():  # NaN: the windows are shorter than this horizon
                print(f"open-loop NRMSE {h:>3} steps ahead: {np.nanmean(row):.3f}")
    print(f"checkpoint: {ckpt}\ninspect: tensorboard --logdir {args.out}")
    return {"trainer": trainer, "module": module, "reloaded": reloaded, "checkpoint": ckpt, "openloop": result}


if __name__ == "__main__":
    main()
