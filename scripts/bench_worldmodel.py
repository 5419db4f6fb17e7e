"""Model-quality benchmark: open-loop NRMSE vs horizon of the world model against two baselines.

For each system:
  pendulum     Pendulum-v1 recorded under "hold:K" random actions (an exciting input)
  halfcheetah  HalfCheetah-v5 recorded the same way (needs gymnasium[mujoco])
  lhb          the embedded La Haute Borne subset imported with its mapping: power P_avg is the
               observation, pitch and yaw the actions, wind speed / direction / temperature inputs
  lhb-full     (only when asked for with --systems) the full four-turbine file from
               /work/shared/data/la-haute-borne/, skipped when it is absent
we train the world model with `wmcheck.training.run.train` (offline, small data: lr 1e-3 with a
short warm-up instead of the reference's 4e-5 / 1000), take held-out windows from the validation
episodes of the data module's episode-level split (`LogDataModule.openloop_sequence`), and compare
on exactly those windows, after the same `context` observed steps, under the logged controls:
  - the world model (`evaluate_openloop`: mean of 16 sampled rollouts; its 90% interval's coverage);
  - persistence (the last context value);
  - ARX(p, q) fitted on the same training episodes, orders chosen by open-loop error on an inner
    split of the training episodes (scripts/baselines_openloop.py); ARX(2, 2) also in the JSON.
NRMSE is RMSE in normalised units (RMSE / training std), averaged over observation channels.

    .venv/bin/python scripts/bench_worldmodel.py                     # all three systems (~15-18 min on a shared 2-core CPU)
    .venv/bin/python scripts/bench_worldmodel.py --systems halfcheetah --steps 3000
    .venv/bin/python scripts/bench_worldmodel.py --quick             # seconds: a smoke test of the script

Writes OUT/bench_worldmodel.json and .md; logs and runs go to OUT/work/<system>/ (`--reuse` keeps
them: a finished run is then evaluated again without retraining).
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

import numpy as np
import torch

from wmcheck.datasets.split import split_episodes
from wmcheck.datasets.windows import WindowSampler
from wmcheck.scripts.baselines_openloop import ARX, persistence, select_arx, step_seqs_from_batches
from wmcheck.scripts.bench_report import finish, machine_info, write_results
from wmcheck.training.checkpoint import load_model
from wmcheck.training.config import TrainConfig
from wmcheck.training.datamodule import LogDataModule
from wmcheck.training.openloop import evaluate_openloop, horizon_metrics
from wmcheck.training.run import build_run_config, train

CONTEXT = 16
HORIZONS = (1, 4, 16, 64)
WINDOWS = 128  # held-out windows per system (cycling through the validation episodes)


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


def coverage_by_horizon(res, horizons) -> list[float | None]:
    """Fraction of true values inside the 90% interval at each horizon (all channels)."""
    truth = res.truth[:, res.context :]  # (B, H, D)
    inside = (truth >= res.lower) & (truth <= res.upper)  # (B, H, D)
    return [float(inside[:, h - 1].mean()) if h <= truth.shape[1] else None for h in horizons]


def _clean(x):
    """NaN -> None for JSON."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def run_system(spec: SystemSpec, work: Path, args) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    log_path, run_dir = work / "log.h5", work / "run"
    t0 = time.perf_counter()
    if not (args.reuse and log_path.exists()):
        for stale in (log_path, run_dir):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        data = make_log(spec, log_path)
        (work / "data.json").write_text(json.dumps(data))
    data = json.loads((work / "data.json").read_text())
    t_data = time.perf_counter() - t0

    cfg = TrainConfig(
        preset=spec.preset,
        max_steps=spec.steps,
        batch_size=spec.batch_size,
        seq_len=spec.seq_len,
        lr=spec.lr,
        warmup=spec.warmup,
        seed=0,
        val_every=spec.steps + 1,
        ckpt_every=max(spec.steps // 4, 1),
        log_every=max(spec.steps // 20, 1),
        openloop_context=CONTEXT,
        openloop_horizons=HORIZONS,
        progress_bar=False,
        accelerator="cpu" if args.device == "cpu" else "auto",
    )
    print(
        f"[{spec.name}] {data['source']}: {data['episodes']} episodes, {data['steps']} steps; training "
        f"{spec.preset} for {spec.steps} steps (B={spec.batch_size}, T={spec.seq_len}, lr={spec.lr:g}, "
        f"warmup={spec.warmup})",
        flush=True,
    )
    t1 = time.perf_counter()
    result = train(log_path, run_dir, build_run_config(cfg))
    t_train = time.perf_counter() - t1

    t2 = time.perf_counter()
    dm = LogDataModule(log_path, cfg)
    dm.prepare()
    seq = dm.openloop_sequence(windows=args.windows, length=CONTEXT + max(HORIZONS))
    if seq is None:
        raise RuntimeError(f"{spec.name}: no held-out episode long enough for a context of {CONTEXT}")
    T = seq.obs.shape[1]
    horizons = tuple(h for h in HORIZONS if h <= T - CONTEXT)
    obs = seq.obs.numpy().astype(np.float64)  # (B, T, D)
    ctrl = np.concatenate([seq.prev_action.numpy(), seq.prev_input.numpy()], -1).astype(np.float64)  # (B, T, U)
    truth = obs[:, CONTEXT:]  # (B, H, D)

    bundle = load_model(run_dir)
    torch.manual_seed(0)
    res = evaluate_openloop(bundle.model, seq, CONTEXT, horizons, samples=16)

    sampler = WindowSampler(log_path, dm.train_ids, dm.normalizer, 1)
    train_seqs = step_seqs_from_batches(sampler.episodes())
    inner_train_ids, inner_val_ids = split_episodes(dm.train_ids, 0.2, seed=1)
    by_id = dict(zip(dm.train_ids, train_seqs))
    sel = select_arx(
        [by_id[i] for i in inner_train_ids], [by_id[i] for i in inner_val_ids], context=CONTEXT, horizon=max(HORIZONS)
    )
    arx = ARX(sel.p, sel.q).fit(train_seqs)
    arx22 = ARX(2, 2).fit(train_seqs)
    preds = {
        "persistence": persistence(obs, CONTEXT),
        "arx": arx.openloop(obs, ctrl, CONTEXT),
        "arx22": arx22.openloop(obs, ctrl, CONTEXT),
    }
    t_eval = time.perf_counter() - t2

    methods = {"world_model": {"nrmse": res.nrmse}}
    for name, pred in preds.items():
        nrmse, _ = horizon_metrics(pred, truth, horizons)
        methods[name] = {"nrmse": nrmse}
    out_methods = {}
    for name, m in methods.items():
        out_methods[name] = {
            "nrmse_mean": _clean([float(np.mean(r)) for r in m["nrmse"]]),  # mean over channels per horizon
            "nrmse_per_channel": _clean(m["nrmse"]),
        }
    wm_mean, p_mean, a_mean = (
        np.array(out_methods[k]["nrmse_mean"], float) for k in ("world_model", "persistence", "arx")
    )
    beats = {f"h{h}": bool(wm_mean[i] < p_mean[i] and wm_mean[i] < a_mean[i]) for i, h in enumerate(horizons)}
    return {
        "system": spec.name,
        "data": data,
        "spec": dataclasses.asdict(spec),
        "split": {
            "train_episodes": len(dm.train_ids),
            "val_episodes": len(dm.val_ids),
            "train_ids": dm.train_ids,
            "val_ids": dm.val_ids,
        },
        "dims": dict(zip(("obs", "action", "input"), dm.dims)),
        "observation_names": dm.channels["observation_names"],
        "windows": int(seq.obs.shape[0]),
        "window_length": int(T),
        "context": CONTEXT,
        "horizons": list(horizons),
        "methods": out_methods,
        "world_model_coverage90": float(np.mean(res.coverage)),
        "world_model_coverage90_by_horizon": coverage_by_horizon(res, horizons),
        "world_model_coverage90_per_channel": _clean(res.coverage),
        "arx": {
            "p": sel.p,
            "q": sel.q,
            "criterion": sel.criterion,
            "selection_scores": _clean(sel.scores),
            "inner_train_episodes": sel.inner_train,
            "inner_val_episodes": sel.inner_val,
        },
        "world_model_beats_both": beats,
        "train": {"final_metrics": {k: v for k, v in result.metrics.items() if np.isfinite(v)}, "steps": result.steps},
        "seconds": {"data": t_data, "train": t_train, "eval": t_eval},
    }


def system_table(r: dict) -> str:
    m = r["methods"]
    lines = [
        f"### {r['system']}: {r['data']['source']}",
        "",
        f"{r['split']['train_episodes']} train / {r['split']['val_episodes']} held-out episodes, "
        f"{r['windows']} held-out windows of {r['window_length']} steps, context {r['context']}; "
        f"world model {r['spec']['preset']}, {r['spec']['steps']} steps, lr {r['spec']['lr']:g}, "
        f"warmup {r['spec']['warmup']}, B={r['spec']['batch_size']}, T={r['spec']['seq_len']} "
        f"(train {r['seconds']['train']:.0f} s); ARX orders p={r['arx']['p']}, q={r['arx']['q']}",
        "",
        "| horizon | world model | persistence | ARX | WM 90% coverage | WM beats both |",
        "|---|---|---|---|---|---|",
    ]
    for i, h in enumerate(r["horizons"]):

        def f(k, i=i):
            v = m[k]["nrmse_mean"][i]
            return "nan" if v is None else f"{v:.3f}"

        cov = r["world_model_coverage90_by_horizon"][i]
        lines.append(
            f"| {h} | {f('world_model')} | {f('persistence')} | {f('arx')} | "
            f"{cov:.2f} | {'yes' if r['world_model_beats_both'][f'h{h}'] else 'no'} |"
        )
    lines += ["", f"world-model 90% coverage over all horizons and channels: {r['world_model_coverage90']:.2f}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="pendulum,halfcheetah,lhb")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps for every system (default: per system)")
    p.add_argument("--preset", default=None, help="world-model preset for every system (default: per system)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--windows", type=int, default=WINDOWS, help="held-out windows per system")
    p.add_argument("--device", default="cpu", help="cpu (default) or auto (Lightning picks; bf16 on CUDA)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared 2-core machine two OpenMP threads slow small "
        "models down many times whenever another process holds a core)",
    )
    p.add_argument("--quick", action="store_true", help="tiny logs, debug preset, 4 steps: a smoke test")
    p.add_argument("--reuse", action="store_true", help="keep OUT/work logs and runs (a finished run is not retrained)")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    if args.quick:
        args.windows = min(args.windows, 8)
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
        {"benchmark": "worldmodel_openloop", "version": 1, "machine": info, "quick": args.quick, "systems": results},
        md,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
