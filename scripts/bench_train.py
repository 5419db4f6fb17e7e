"""Training-speed benchmark: env-steps trained per second by one world-model optimiser step.

One step = forward of `WorldModel.loss` on a (B, T) batch + backward + one `LaProp` step, the work
of one Lightning training step without Lightning (this script needs only torch and wmcheck, so it
runs as is on a GPU machine). Data are random: vector observations with 17 channels and 6 actions
(HalfCheetah's shapes), no exogenous inputs. On CUDA the forward and backward run under
`torch.autocast("cuda", dtype=torch.bfloat16)`, as training does (precision "bf16-mixed").

For each (preset, B, T): `--warmup` untimed steps, then `--steps` timed steps (fewer if
`--max-seconds` for that configuration runs out; at least 2); we report the median seconds per step
and env-steps/s = B*T / median, next to the reference port's figures from the issue:

    2-core CPU (these machines), B=16, T=64:  size1m ~0.27 s/step (~3,800 env-steps/s)
                                              size12m ~3.4 s/step (~300 env-steps/s)
    one H200:                                 ~0.28 s/step at every batch size (launch-bound)

ratio = our env-steps/s / the reference's env-steps/s in the same setting (> 1: we are faster).
The issue gives CPU reference figures at B=16 only, so CPU rows at other batch sizes are compared
with the reference's B=16 throughput (marked "B=16 ref").

    .venv/bin/python scripts/bench_train.py                   # CPU, 1 thread: size1m and size12m, B=16 and 256 (~4 min)
    .venv/bin/python scripts/bench_train.py --threads 2       # both cores (only meaningful on an idle machine)
    .venv/bin/python scripts/bench_train.py --device cuda     # GPU: bf16 autocast, B up to 256
    .venv/bin/python scripts/bench_train.py --quick           # seconds: a smoke test of the script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from wmcheck.scripts.bench_report import load_average, machine_info, write_results
from wmcheck.training.optim import LaProp
from wmcheck.worldmodel import WorldModel, preset

OBS_DIM, ACTION_DIM = 17, 6

# Reference port (from the issue): seconds per optimiser step.
REF_CPU_B16 = {"size1m": 0.27, "size12m": 3.4}  # 2-core CPU, B=16, T=64
REF_GPU = 0.28  # one H200, every batch size (launch-bound)


@dataclass
class SeqBatch:
    """The attributes WorldModel.loss reads, (B, T, ...)."""

    obs: torch.Tensor  # (B, T, 17)
    prev_action: torch.Tensor  # (B, T, 6)
    prev_input: torch.Tensor  # (B, T, 0)
    reward: torch.Tensor  # (B, T)
    is_first: torch.Tensor  # (B, T) bool
    is_last: torch.Tensor  # (B, T) bool
    is_terminal: torch.Tensor  # (B, T) bool


def random_batch(B: int, T: int, device, seed: int = 0) -> SeqBatch:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T, OBS_DIM, generator=g)
    act = torch.rand(B, T, ACTION_DIM, generator=g) * 2 - 1
    act[:, 0] = 0.0  # the window's first step carries no previous action
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    batch = SeqBatch(
        obs,
        act,
        torch.zeros(B, T, 0),
        torch.randn(B, T, generator=g),
        first,
        torch.zeros(B, T, dtype=torch.bool),
        torch.zeros(B, T, dtype=torch.bool),
    )
    return SeqBatch(*(getattr(batch, f).to(device) for f in batch.__dataclass_fields__))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_config(
    name: str, B: int, T: int, device: torch.device, warmup: int, steps: int, max_seconds: float, seed: int = 0
) -> dict:
    """Median seconds per optimiser step of preset `name` at (B, T)."""
    torch.manual_seed(seed)
    cfg = preset(name, obs_dim=OBS_DIM, action_dim=ACTION_DIM, input_dim=0)
    model = WorldModel(cfg).to(device).train()
    opt = LaProp(model.parameters(), lr=4e-5, warmup=1000)  # the reference's optimiser and schedule
    batch = random_batch(B, T, device, seed)
    use_bf16 = device.type == "cuda"

    def step() -> float:
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            out = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        _sync(device)
        return time.perf_counter() - t0

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_start = time.perf_counter()
    for _ in range(warmup):
        step()
    times = []
    while len(times) < steps:
        times.append(step())
        if len(times) >= 2 and time.perf_counter() - t_start > max_seconds:
            break
    med = statistics.median(times)
    row = {
        "preset": name,
        "B": B,
        "T": T,
        "device": str(device),
        "precision": "bf16-autocast" if use_bf16 else "fp32",
        "params": sum(p.numel() for p in model.parameters()),
        "warmup_steps": warmup,
        "timed_steps": len(times),
        "s_per_step": med,
        "s_per_step_min": min(times),
        "s_per_step_max": max(times),
        "env_steps_per_s": B * T / med,
    }
    if device.type == "cuda":
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    ref = reference(name, B, T, device)
    row.update(ref)
    if ref["ref_env_steps_per_s"] is not None:
        row["ratio"] = row["env_steps_per_s"] / ref["ref_env_steps_per_s"]
    else:
        row["ratio"] = None
    model = opt = batch = None  # release them before empty_cache (step() is not called again)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def reference(name: str, B: int, T: int, device: torch.device) -> dict:
    """The reference port's figure for this setting (env-steps/s), or None where the issue has none."""
    if device.type == "cuda":
        return {"ref_s_per_step": REF_GPU, "ref_env_steps_per_s": B * T / REF_GPU, "ref_note": "H200"}
    if name not in REF_CPU_B16:
        return {"ref_s_per_step": None, "ref_env_steps_per_s": None, "ref_note": "none"}
    ref_eps = 16 * 64 / REF_CPU_B16[name]
    same = (B, T) == (16, 64)
    return {
        "ref_s_per_step": REF_CPU_B16[name] if same else None,
        "ref_env_steps_per_s": ref_eps,
        "ref_note": "2-core CPU" if same else "B=16 ref",
    }


def parse_batches(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, _, t = part.strip().lower().partition("x")
        out.append((int(b), int(t)))
    return out


def device_info(device: torch.device) -> dict:
    """The machine (bench_report.machine_info) with the device, and the GPU's name on CUDA."""
    return machine_info(
        device=str(device), **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})
    )


def markdown(rows: list[dict], info: dict) -> str:
    lines = [
        f"# Training speed ({info['date']})",
        "",
        f"device {info['device']}{' (' + info['gpu'] + ')' if 'gpu' in info else ''}, torch {info['torch']}, "
        f"{info['cpu_count']} CPUs, {info['torch_threads']} torch threads, load average at start "
        f"{info.get('loadavg_start')}",
        "",
        "| preset | B x T | precision | s/step (median) | env-steps/s | ref s/step | ref env-steps/s | ratio | timed steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref_s = f"{r['ref_s_per_step']:.2f}" if r["ref_s_per_step"] is not None else "-"
        ref_e = f"{r['ref_env_steps_per_s']:.0f} ({r['ref_note']})" if r["ref_env_steps_per_s"] is not None else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['preset']} | {r['B']} x {r['T']} | {r['precision']} | {r['s_per_step']:.3f} | "
            f"{r['env_steps_per_s']:.0f} | {ref_s} | {ref_e} | {ratio} | {r['timed_steps']} |"
        )
    lines += [
        "",
        "ratio = our env-steps/s / the reference port's env-steps/s (> 1: faster). "
        '"B=16 ref": the issue gives CPU figures at B=16, T=64 only. '
        "Target: ratio >= 2 (twice the reference's throughput).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto (cuda when available)")
    p.add_argument("--presets", default="size1m,size12m")
    p.add_argument(
        "--batches",
        default=None,
        help="comma list of BxT; default 16x64,256x64 on CPU (size12m at B=256 is tens of seconds "
        "a step, so --max-seconds caps it), 16x64,64x64,256x64 on CUDA",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration (median reported)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="stop timing a configuration after this long (at least 2 timed steps)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default on CPU: 1. With 2 OpenMP threads on a 2-core machine that another "
        "process is using, every small op waits for a descheduled thread: we measured size1m at "
        "16 s/step instead of 0.22. Pass --threads 2 on an idle machine.)",
    )
    p.add_argument("--quick", action="store_true", help="debug preset, tiny batches, 1+2 steps: a smoke test")
    p.add_argument("--out", default="bench-results", help="folder for bench_train.json / .md")
    args = p.parse_args(argv)

    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    threads = args.threads or (1 if dev == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    device = torch.device(dev)
    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    if args.batches:
        batches = parse_batches(args.batches)
    else:
        batches = [(16, 64), (256, 64)] if device.type == "cpu" else [(16, 64), (64, 64), (256, 64)]
    warmup, steps, max_s = args.warmup, args.steps, args.max_seconds
    if args.quick:
        presets, batches, warmup, steps, max_s = ["debug"], [(4, 8), (8, 8)], 1, 2, 5.0

    info = device_info(device)
    print(
        f"training speed on {device} ({info['torch_threads']} torch threads, load {info.get('loadavg_start')})",
        flush=True,
    )
    rows = []
    for name in presets:
        for B, T in batches:
            r = time_config(name, B, T, device, warmup, steps, max_s)
            rows.append(r)
            print(
                f"  {name:8s} B={B:<4d} T={T:<3d} {r['s_per_step']:.3f} s/step  {r['env_steps_per_s']:8.0f} env-steps/s"
                + (f"  ratio {r['ratio']:.2f}x" if r["ratio"] is not None else ""),
                flush=True,
            )
    load = load_average()
    if load is not None:
        info["loadavg_end"] = load
    md = markdown(rows, info)
    print()
    print(md)
    write_results(
        Path(args.out),
        "bench_train",
        {"benchmark": "train_speed", "version": 1, "machine": info, "quick": args.quick, "rows": rows},
        md,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
