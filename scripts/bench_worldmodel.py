"""Model-quality benchmark: open-loop NRMSE vs horizon of the world model against two baselines.

For each system:
  pendulum     Pendulum-v1 recorded under "hold:K" random actions (an exciting input)
  halfcheetah  HalfCheetah-v5 recorded the same way (needs gymnasium[mujoco])
  lhb          the embedded La Haute Borne subset imported with its mapping: power P_avg is the
               observation, pitch and yaw the actions, wind speed / direction / temperature inputs
  lhb-full     (only when asked for with --systems) the full four-turbine file from
               /work/shared/data/la-haute-borne/, skipped when it is absent
we train the world model with `wmcheck.training.run.train` up to three times on the same log, in
one run:
  fixed              the budget the benchmarks used before the defaults changed (size1m, lr 1e-3,
                     warm-up 100, a fixed number of steps, no early stopping);
  defaults           `TrainConfig()` as `wmcheck train LOG --out RUN` uses it without a flag (early
                     stopping on the validation loss, the best checkpoint exported);
  defaults-openloop  the defaults with `--stop-on openloop`: early stopping and the best checkpoint
                     on the held-out open-loop NRMSE (its own windows, not the card's);
  defaults-share0    (only when asked for with --configs) the defaults with `--min-improvement 0`:
                     the stopping rule before the share (no new best in --patience validations);
and compare the quality cards `train` writes (training/quality.py): on held-out windows of the
validation episodes, after `context` observed steps, under the logged controls, the world model
(mean of 16 sampled rollouts) against persistence and ARX(p, q) fitted on the training episodes
(orders chosen by open-loop error on an inner split of them), and the coverage of the model's 90%
interval raw and conformally calibrated (cross-fitted by held-out episode). NRMSE is RMSE in
normalised units (RMSE / training std), averaged over observation channels.

    .venv/bin/python scripts/bench_worldmodel.py                     # all three systems, both configurations
    .venv/bin/python scripts/bench_worldmodel.py --systems halfcheetah --steps 3000
    .venv/bin/python scripts/bench_worldmodel.py --quick             # seconds: a smoke test of the script

Writes OUT/bench_worldmodel.json and .md; logs and runs go to OUT/work/<system>/ (`--reuse` keeps
the logs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.config import TrainConfig
from wmcheck.training.run import build_run_config, train

CONTEXT = 16
HORIZONS = (1, 4, 16, 64)
CONFIGS = ("fixed", "defaults", "defaults-openloop", "defaults-share0")


@dataclass
class SystemSpec:
    """How one system's log is made and its world model trained."""

    name: str
    kind: str  # "gym" | "lhb" (embedded subset) | "lhb_full" (the full file, when present)
    env_id: str = ""
    policy: str = ""
    episodes: int = 0
    max_steps: int = 0
    preset: str = "size1m"
    steps: int = 2000
    lr: float = 1e-3
    warmup: int = 100
    batch_size: int = 16
    seq_len: int = 64


# Budgets fit ~15-18 minutes in all on a shared 2-core CPU (size1m at B=16, T=64: 0.22-0.28 s/step, 1 thread).
# HalfCheetah gets the most: it is the system the world model must win on at horizons >= 4.
SYSTEMS = {
    "pendulum": SystemSpec(
        "pendulum", "gym", "Pendulum-v1", "hold:5", episodes=60, max_steps=200, preset="size1m", steps=600
    ),
    "halfcheetah": SystemSpec(
        "halfcheetah", "gym", "HalfCheetah-v5", "hold:5", episodes=60, max_steps=500, preset="size1m", steps=2500
    ),
    "lhb": SystemSpec("lhb", "lhb", preset="size1m", steps=400),
    # Not in the default set: the full file (~35x the subset) when it is present, skipped otherwise.
    "lhb-full": SystemSpec("lhb-full", "lhb_full", preset="size1m", steps=1000),
}
LHB_FULL = Path("/work/shared/data/la-haute-borne/la-haute-borne-data-2014-2015.csv.gz")


def quick(spec: SystemSpec) -> SystemSpec:
    """A seconds-long version of a spec (smoke tests): tiny log, debug preset, a few steps."""
    return dataclasses.replace(
        spec,
        episodes=min(spec.episodes, 6),
        max_steps=min(spec.max_steps, 60),
        preset="debug",
        steps=4,
        warmup=2,
        batch_size=4,
        seq_len=16,
    )


def make_log(spec: SystemSpec, path: Path) -> dict:
    """Record or import the system's log to `path`; returns a description for the report."""
    if spec.kind == "gym":
        from wmcheck.datasets.record import record_to_log

        _, steps = record_to_log(
            path, spec.env_id, spec.policy, episodes=spec.episodes, max_steps=spec.max_steps, seed=0
        )
        return {"source": f"{spec.env_id} recorded under {spec.policy}", "episodes": spec.episodes, "steps": steps}
    from wmcheck.datasets.embedded import embedded_data_path, embedded_mapping_path
    from wmcheck.datasets.importers import build_mapping, import_to_log
    from wmcheck.datasets.logformat import open_log

    if spec.kind == "lhb":
        source, what = embedded_data_path(), "La Haute Borne R80721 2014-03..06 (embedded subset)"
    else:
        source, what = LHB_FULL, "La Haute Borne, 4 turbines, 2014-2015 (full file)"
    import_to_log(source, path, mapping=build_mapping(embedded_mapping_path()))
    with open_log(path) as log:
        ids = log.episode_ids
        steps = sum(log.num_steps(i) for i in ids)
    return {"source": what, "episodes": len(ids), "steps": steps}


def train_config(spec: SystemSpec, config: str, args) -> TrainConfig:
    """ "fixed": the spec's budget (lr, warm-up, steps, no early stopping) as the benchmarks ran
    before the defaults changed; "defaults": TrainConfig's defaults (preset, lr, early stopping,
    step cap) with only the evaluation protocol fixed; "defaults-openloop": the same, stopping on
    the held-out open-loop error instead of the validation loss."""
    protocol = dict(
        seed=0,
        openloop_context=CONTEXT,
        openloop_horizons=HORIZONS,
        openloop_windows=16,
        progress_bar=False,
        accelerator="cpu" if args.device == "cpu" else "auto",
    )
    if config.startswith("defaults"):
        stop_on = "openloop" if config == "defaults-openloop" else TrainConfig().stop_on
        share = {"min_improvement": 0.0} if config == "defaults-share0" else {}
        if args.quick:  # a seconds-long smoke test of the same path
            return TrainConfig(
                **protocol, **share, stop_on=stop_on, max_steps=8, val_every=4, warmup=2, batch_size=4, seq_len=16
            )
        return dataclasses.replace(TrainConfig(), stop_on=stop_on, **share, **protocol)
    return TrainConfig(
        preset=spec.preset,
        max_steps=spec.steps,
        batch_size=spec.batch_size,
        seq_len=spec.seq_len,
        lr=spec.lr,
        warmup=spec.warmup,
        val_every=spec.steps + 1,
        patience=0,
        ckpt_every=max(spec.steps // 4, 1),
        log_every=max(spec.steps // 20, 1),
        **protocol,
    )


def run_system(spec: SystemSpec, work: Path, args) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "log.h5"
    t0 = time.perf_counter()
    if not (args.reuse and log_path.exists()):
        for stale in [log_path] + [work / f"run-{c}" for c in CONFIGS]:
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        data = make_log(spec, log_path)
        (work / "data.json").write_text(json.dumps(data))
    data = json.loads((work / "data.json").read_text())
    t_data = time.perf_counter() - t0
    runs = {}
    for config in args.configs:
        cfg = train_config(spec, config, args)
        print(
            f"[{spec.name}/{config}] {data['source']}: {data['episodes']} episodes, {data['steps']} steps; "
            f"training {cfg.preset} (cap {cfg.max_steps} steps, patience {cfg.patience}, B={cfg.batch_size}, "
            f"T={cfg.seq_len}, lr={cfg.lr:g}, warmup={cfg.warmup})",
            flush=True,
        )
        t1 = time.perf_counter()
        result = train(log_path, work / f"run-{config}", build_run_config(cfg))
        seconds = time.perf_counter() - t1
        card = result.quality
        if card is None:
            raise RuntimeError(f"{spec.name}: no held-out episode long enough for a context of {CONTEXT}")
        runs[config] = {
            "train": dataclasses.asdict(cfg),
            "steps": result.steps,
            "stop_reason": result.stop_reason,
            "exported_step": result.best_step if result.best_step is not None else result.steps,
            "seconds_train": seconds,
            "card": card.to_dict(),
        }
    any_card = next(iter(runs.values()))["card"]
    horizons = [h for h in HORIZONS if h <= len(any_card["coverage_raw"])]
    return {
        "system": spec.name,
        "data": data,
        "observation_names": any_card["observation_names"],
        "heldout_episodes": any_card["heldout_episodes"],
        "train_episodes": any_card["train_episodes"],
        "windows": any_card["windows"],
        "context": CONTEXT,
        "horizons": horizons,
        "runs": runs,
        "seconds_data": t_data,
    }


def system_table(r: dict) -> str:
    lines = [
        f"### {r['system']}: {r['data']['source']}",
        "",
        f"{r['train_episodes']} train / {r['heldout_episodes']} held-out episodes, {r['windows']} held-out "
        f"windows, context {r['context']}. NRMSE per imagined step (mean over channels); ARX fitted on "
        "the training episodes; coverage of the 90% interval raw / calibrated (cross-fitted).",
        "",
        "| training | steps (stop) | train s | horizon | world model | ARX | persistence | coverage raw / cal. | WM beats both |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for config, run in r["runs"].items():
        c = run["card"]
        t = run["train"]
        label = f"{config}: {t['preset']}, lr {t['lr']:g}"
        for i, h in enumerate(r["horizons"]):
            wm, arx, per = (c["nrmse"][k][h - 1] for k in ("world_model", "arx", "persistence"))
            beats = wm is not None and (arx is None or wm < arx) and (per is None or wm < per)
            f = lambda v: "nan" if v is None else f"{v:.3f}"  # noqa: E731
            cov = f"{f(c['coverage_raw'][h - 1])} / {f(c['coverage_calibrated'][h - 1])}"
            head = (
                [
                    label,
                    f"{run['steps']} ({run['stop_reason']}, best {run['exported_step']})",
                    f"{run['seconds_train']:.0f}",
                ]
                if i == 0
                else ["", "", ""]
            )
            lines.append(
                "| " + " | ".join(head + [str(h), f(wm), f(arx), f(per), cov, "yes" if beats else "no"]) + " |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="pendulum,halfcheetah,lhb")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps for every system (default: per system)")
    p.add_argument("--preset", default=None, help="world-model preset for every system (default: per system)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--device", default="cpu", help="cpu (default) or auto (Lightning picks; bf16 on CUDA)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared 2-core machine two OpenMP threads slow small "
        "models down many times whenever another process holds a core)",
    )
    p.add_argument(
        "--configs",
        default="fixed,defaults,defaults-openloop",
        help="training configurations compared: fixed (each system's benchmark budget), defaults (`wmcheck "
        "train` without a flag), defaults-openloop (the defaults stopping on the open-loop NRMSE) and/or "
        "defaults-share0 (the defaults with --min-improvement 0, the stopping rule before the share)",
    )
    p.add_argument("--quick", action="store_true", help="tiny logs, debug preset, 4 steps: a smoke test")
    p.add_argument("--reuse", action="store_true", help="keep OUT/work logs and runs (a finished run is not retrained)")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or set(args.configs) - set(CONFIGS):
        p.error(f"--configs takes a comma list of {', '.join(CONFIGS)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    out = Path(args.out)
    started = time.perf_counter()
    info = machine_info(device=args.device)
    results = []
    for name in [s.strip() for s in args.systems.split(",") if s.strip()]:
        if name not in SYSTEMS:
            p.error(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
        spec = SYSTEMS[name]
        if spec.kind == "lhb_full" and not LHB_FULL.exists():
            print(f"[{name}] skipped: {LHB_FULL} is absent", flush=True)
            continue
        if args.quick:
            spec = quick(spec)
        overrides = {
            k: v for k, v in (("steps", args.steps), ("preset", args.preset), ("lr", args.lr)) if v is not None
        }
        spec = dataclasses.replace(spec, **overrides)
        r = run_system(spec, out / "work" / name, args)
        results.append(r)
        print(system_table(r), flush=True)
    finish(info, started)
    md = "\n".join(
        [
            f"# World-model open-loop benchmark ({info['date']})",
            "",
            f"NRMSE (RMSE / training std, mean over observation channels) on held-out windows; "
            f"{info['cpu_count']} CPUs, {info['torch_threads']} torch threads, device {info['device']}, "
            f"total {info['total_seconds']:.0f} s.",
            "",
        ]
        + [system_table(r) for r in results]
    )
    write_results(
        out,
        "bench_worldmodel",
        {"benchmark": "worldmodel_openloop", "version": 2, "machine": info, "quick": args.quick, "systems": results},
        md,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
