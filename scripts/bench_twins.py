"""Real-data twins benchmark: engineering simulators of a real wind turbine, with a measured truth.

The La Haute Borne SCADA logs (`../shared/data/la-haute-borne/`, four Senvion MM82 turbines,
2014-2015, 10-minute averages) are imported; a world model is trained on one turbine's weeks and
calibrated on its held-out weeks. The held-out weeks are then replayed, with their logged wind,
temperature and commands, through two independently built engineering models:
  heier-cp        the project's simulator (datasets/sims/wind_turbine.py: Heier's Cp(lambda, beta),
                  variable rotor speed, air density from temperature, cos^2 yaw loss);
  method-of-bins  the measured power curve of IEC 61400-12-1: mean power per 0.5 m/s bin of the
                  air-density-normalised wind speed, fitted on the training weeks (a deterministic
                  lookup, as a wind-farm analyst builds one).
Because each replay repeats a real week with its own inputs, the truth is measured directly from
the data: per wind-speed bin of the check's regime table, the median of (simulator - real twin)
power, with an episode-bootstrap 95 % interval. wmcheck's regime estimates are made without the
twin (the simulator's power against the model's prediction); the benchmark reports how often their
intervals cover the measured truth, raw and after removing the model's own error in the bin.
Unit to unit: weeks of the other three turbines' real logs are checked against the model of the
first (the field's "calibrate on the actual instrument" question).

    .venv/bin/python scripts/bench_twins.py --threads 1            # ~10 min on one CPU thread
    .venv/bin/python scripts/bench_twins.py --quick                # a smoke test (tiny training)

Writes OUT/bench_twins.json and OUT/bench_twins.md; skips (exit 0, says so) when the data are absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "la-haute-borne" / "la-haute-borne-data-2014-2015.csv.gz"
TRAIN_TURBINE = "R80721"
BIN_WIDTH = 0.5  # m/s, IEC 61400-12-1


class MethodOfBins:
    """The IEC measured power curve: mean power per bin of v * (rho / rho_ref)^(1/3)."""

    def __init__(self, names: dict[str, int], rho_ref: float = 1.225):
        self.names, self.rho_ref = names, rho_ref

    def _v_norm(self, ep) -> np.ndarray:
        from wmcheck.datasets.sims.wind_turbine import TurbineParams, air_density

        x = ep.input_array()  # (N, E) inputs acting on steps 1..N
        rho = air_density(x[:, self.names["Ot_avg"]], TurbineParams())
        return x[:, self.names["Ws_avg"]] * (rho / self.rho_ref) ** (1 / 3)

    def fit(self, episodes) -> MethodOfBins:
        v = np.concatenate([self._v_norm(e) for e in episodes])
        p = np.concatenate([e.observations[1:, 0] for e in episodes])
        self.edges = np.arange(0.0, v.max() + BIN_WIDTH, BIN_WIDTH)
        idx = np.clip(np.digitize(v, self.edges) - 1, 0, len(self.edges) - 2)
        self.curve = np.array([p[idx == j].mean() if (idx == j).any() else np.nan for j in range(len(self.edges) - 1)])
        ok = ~np.isnan(self.curve)  # empty bins: interpolate from their neighbours
        self.curve = np.interp(np.arange(len(self.curve)), np.flatnonzero(ok), self.curve[ok])
        return self

    def replay(self, ep):
        v = self._v_norm(ep)
        idx = np.clip(np.digitize(v, self.edges) - 1, 0, len(self.curve) - 1)
        obs = ep.observations.copy()
        obs[1:, 0] = self.curve[idx]  # row 0 is the logged starting power, as in the Heier-Cp replay
        return dataclasses.replace(ep, observations=obs.astype(np.float32))


def twin_truth(sim_eps, real_eps, names: dict[str, int], ranges, reps: int = 400, seed: int = 0) -> list[dict]:
    """Per wind-speed range: median (simulator - real twin) power and its episode-bootstrap 95 % interval."""
    rng = np.random.default_rng(seed)
    out = []
    for lo, hi in ranges:
        per_ep = []
        for s, r in zip(sim_eps, real_eps):
            v = r.input_array()[:, names["Ws_avg"]]
            m = (v >= lo) & (v < hi)
            per_ep.append((s.observations[1:, 0] - r.observations[1:, 0])[m])
        diffs = np.concatenate(per_ep)
        if not len(diffs):
            out.append({"range": [lo, hi], "steps": 0, "median": None, "ci": [None, None]})
            continue
        boots = []
        for _ in range(reps):
            pick = [per_ep[i] for i in rng.integers(0, len(per_ep), len(per_ep))]
            d = np.concatenate(pick)
            if len(d):
                boots.append(np.median(d))
        out.append(
            {
                "range": [lo, hi],
                "steps": int(len(diffs)),
                "median": float(np.median(diffs)),
                "ci": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))],
            }
        )
    return out


def twin_mean_truth(sim_eps, real_eps, names: dict[str, int], lo, hi, reps: int = 400, seed: int = 0) -> dict:
    """Mean over weeks of each week's mean (simulator - real twin) power on the steps with wind in
    [lo, hi) (all steps when lo is None), with a week-bootstrap 95 % interval: the truth the bias
    test's estimate (a difference of episode means) is compared with."""
    rng = np.random.default_rng(seed)
    per_ep = []
    for s, r in zip(sim_eps, real_eps):
        d = s.observations[1:, 0] - r.observations[1:, 0]
        if lo is not None:
            v = r.input_array()[:, names["Ws_avg"]]
            d = d[(v >= lo) & (v < hi)]
        if len(d) >= 3:
            per_ep.append(float(d.mean()))
    if len(per_ep) < 2:
        return {"mean": None, "ci": [None, None], "weeks": len(per_ep)}
    x = np.asarray(per_ep)
    boots = x[rng.integers(0, len(x), (reps, len(x)))].mean(1)
    return {
        "mean": float(x.mean()),
        "ci": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))],
        "weeks": len(x),
    }


def compare_bias(report: dict, sim_eps, real_eps, names: dict[str, int]) -> dict:
    """The dynamics row's open-loop bias cells of P_avg (overall and significant Ws_avg regimes)
    against the measured twin truth in the same cell."""
    est = (report["gaps"].get("dynamics") or {}).get("estimate") or {}
    cells = (est.get("bias") or {}).get("cells") or []
    rows, response = [], []
    for c in cells:
        w = c["where"]
        if c.get("kind") == "response":  # a slope factor, not a level: no twin mean to compare with
            if c["channel"] == "P_avg":
                response.append({"factor": c["response_factor"], "ci": c["response_factor_ci95"]})
            continue
        if c["channel"] != "P_avg" or (w is not None and (w["control"] != "Ws_avg" or not c["significant"])):
            continue
        lo, hi = (None, None) if w is None else w["range"]
        t = twin_mean_truth(sim_eps, real_eps, names, lo, hi)
        ok = t["mean"] is not None and None not in c["ci95"]
        rows.append(
            {
                "range": None if w is None else [lo, hi],
                "significant": c["significant"],
                "estimate": c["difference"],
                "ci": c["ci95"],
                "relative": c["relative"],
                "truth": t["mean"],
                "truth_ci": t["ci"],
                "covered": bool(ok and c["ci95"][0] <= t["mean"] <= c["ci95"][1]),
            }
        )
    regimes = [r for r in rows if r["range"] is not None]
    return {
        "cells": rows,
        "response": response,
        "paired": (est.get("bias") or {}).get("paired"),
        "significant_regime_cells": len(regimes),
        "coverage_significant": (sum(r["covered"] for r in regimes) / len(regimes)) if regimes else None,
    }


def compare(report: dict, truth: list[dict]) -> dict:
    """wmcheck's per-bin estimates (Ws_avg regime bins) against the measured twin truth."""
    ch = next(c for c in report["regimes"]["channels"] if c["name"] == "Ws_avg")
    rows = []
    for b, t in zip(ch["bins"], truth):
        e = b["effect"]["P_avg"]
        est, ci, own = e["checked_median_error"], e["ci"], e["real_median_error"] or 0.0
        ok = t["median"] is not None and est is not None and None not in ci
        rows.append(
            {
                "range": b["range"],
                "flagged": b["flagged"],
                "truth": t["median"],
                "truth_ci": t["ci"],
                "estimate": est,
                "ci": ci,
                "model_own_error": own,
                "covered": bool(ok and ci[0] <= t["median"] <= ci[1]),
                "covered_after_model_error": bool(ok and ci[0] - own <= t["median"] <= ci[1] - own),
                "abs_error": (abs(est - t["median"]) if ok else None),
            }
        )
    flagged = [r for r in rows if r["flagged"]]

    def share(rs, key):
        return (sum(r[key] for r in rs) / len(rs)) if rs else None

    return {
        "bins": rows,
        "coverage_all": share(rows, "covered"),
        "coverage_flagged": share(flagged, "covered"),
        "coverage_all_after_model_error": share(rows, "covered_after_model_error"),
        "coverage_flagged_after_model_error": share(flagged, "covered_after_model_error"),
        "flagged_bins": len(flagged),
    }


def run(args) -> dict:
    from wmcheck.checks.calibration import calibrate
    from wmcheck.checks.check import run_check
    from wmcheck.datasets.embedded import embedded_mapping_path
    from wmcheck.datasets.importers import build_mapping, import_to_log
    from wmcheck.datasets.logformat import open_log, write_log
    from wmcheck.datasets.sims.wind_turbine import replay_log
    from wmcheck.datasets.split import split_episodes
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config, train

    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    full = work / "lhb-all.h5"
    if not full.exists():
        print(f"importing {args.data}", flush=True)
        import_to_log(args.data, full, mapping=build_mapping(embedded_mapping_path()))
    with open_log(full) as log:
        meta, eps = log.meta, list(log)
    names = {n: i for i, n in enumerate(meta.input_names)}
    by_turbine: dict[str, list] = {}
    for e in eps:
        by_turbine.setdefault(e.name or "?", []).append(e)
    mine = by_turbine[TRAIN_TURBINE][: args.weeks]
    for i, e in enumerate(mine):  # ids 0..n-1 for the model's split
        mine[i] = dataclasses.replace(e, id=i)
    real = work / f"lhb-{TRAIN_TURBINE}.h5"
    write_log(real, mine, meta)
    cfg = TrainConfig(
        preset="debug",
        max_steps=args.steps,
        lr=1e-3,
        warmup=min(100, args.steps),
        val_fraction=0.3,
        val_every=args.steps,
        ckpt_every=args.steps,
        progress_bar=False,
        seed=0,
    )
    t1 = time.perf_counter()
    print(f"training on {len(mine)} weeks of {TRAIN_TURBINE} ({args.steps} steps)", flush=True)
    result = train(real, work / "run", build_run_config(cfg))
    calibrate(result.run_dir, real, verbose=False)
    t_train = time.perf_counter() - t1
    with open_log(real) as log:
        train_ids, held_ids = split_episodes(log.episode_ids, cfg.val_fraction, cfg.seed)
        held, train_eps = list(log.episodes(held_ids)), list(log.episodes(train_ids))
    sims = {}
    replay_log(real, work / "heier-cp.h5", held_ids)
    with open_log(work / "heier-cp.h5") as log:
        sims["heier-cp"] = list(log)
    mob = MethodOfBins(names).fit(train_eps)
    sims["method-of-bins"] = [mob.replay(e) for e in held]
    write_log(work / "method-of-bins.h5", sims["method-of-bins"], dataclasses.replace(meta, source="sim"))
    models = {}
    for name in sims:
        print(f"checking {name}", flush=True)
        report = run_check(result.run_dir, work / f"{name}.h5", seed=0)
        ch = next(c for c in report["regimes"]["channels"] if c["name"] == "Ws_avg")
        truth = twin_truth(sims[name], held, names, [b["range"] for b in ch["bins"]])
        models[name] = {
            "verdict": report["verdict"],
            "top_gap": report["summary"]["top_gap"],
            "failing": report["summary"].get("failing", []),
            "message": report["summary"]["message"],
            "gaps": {g: r["verdict"] for g, r in report["gaps"].items()},
            "overall_truth_kw": float(
                np.mean(
                    np.concatenate([s.observations[1:, 0] - r.observations[1:, 0] for s, r in zip(sims[name], held)])
                )
            ),
            "comparison": compare(report, truth),
            "bias": compare_bias(report, sims[name], held, names),
        }
    units = {}
    for turbine, weeks in sorted(by_turbine.items()):
        if turbine == TRAIN_TURBINE:
            continue
        sel = [dataclasses.replace(e, id=i) for i, e in enumerate(weeks[: args.unit_weeks])]
        path = work / f"unit-{turbine}.h5"
        write_log(path, sel, dataclasses.replace(meta, source="real"))
        print(f"checking turbine {turbine}'s real weeks against {TRAIN_TURBINE}'s model", flush=True)
        r = run_check(result.run_dir, path, seed=0)
        units[turbine] = {
            "verdict": r["verdict"],
            "top_gap": r["summary"]["top_gap"],
            "weeks": len(sel),
            "failing": r["summary"].get("failing", []),
            "message": r["summary"]["message"],
        }
    return {
        "train_turbine": TRAIN_TURBINE,
        "weeks": len(mine),
        "held_out_weeks": len(held),
        "steps": args.steps,
        "models": models,
        "unit_to_unit": units,
        "seconds": {"train_and_calibrate": t_train, "total": time.perf_counter() - t0},
    }


def markdown(res: dict, info: dict) -> str:
    lines = [
        f"# Real-data twins benchmark ({info['date']})",
        "",
        f"La Haute Borne SCADA: a `debug` model trained {res['steps']} steps on {res['weeks']} weeks of "
        f"{res['train_turbine']}, calibrated on {res['held_out_weeks']} held-out weeks; the held-out weeks "
        f"replayed through two engineering models. Total {res['seconds']['total']:.0f} s.",
        "",
    ]
    for name, m in res["models"].items():
        c = m["comparison"]
        lines += [
            f"## {name}: {m['verdict']} (top gap {m['top_gap']}; failing: {', '.join(m['failing']) or '-'})",
            "",
            f"Mean (simulator - real twin) power over the held-out weeks: {m['overall_truth_kw']:+.1f} kW. "
            f"Interval coverage of the measured truth: {_pct(c['coverage_all'])} of bins "
            f"({_pct(c['coverage_all_after_model_error'])} after removing the model's own error), "
            f"flagged bins: {c['flagged_bins']} ({_pct(c['coverage_flagged'])} covered).",
            "",
            "| wind (m/s) | flagged | truth: sim - twin (kW) [95% CI] | wmcheck estimate (kW) [95% CI] | model's own error | covered |",
            "|---|---|---|---|---|---|",
        ]
        for b in c["bins"]:
            lines.append(
                f"| {b['range'][0]:.3g}-{b['range'][1]:.3g} | {'yes' if b['flagged'] else 'no'} | "
                f"{_kw(b['truth'])} [{_kw(b['truth_ci'][0])}, {_kw(b['truth_ci'][1])}] | {_kw(b['estimate'])} "
                f"[{_kw(b['ci'][0])}, {_kw(b['ci'][1])}] | {_kw(b['model_own_error'])} | "
                f"{'yes' if b['covered'] else 'no'} / {'yes' if b['covered_after_model_error'] else 'no'} |"
            )
        lines.append("")
        bias = m.get("bias") or {}
        if bias.get("cells"):
            lines += [
                f"Open-loop bias test ({'paired with the twin weeks' if bias.get('paired') else 'unpaired'}; "
                f"dynamics row): {bias['significant_regime_cells']} significant wind cells, "
                f"{_pct(bias['coverage_significant'])} of their 95 % intervals cover the measured mean "
                "(simulator - twin).",
                "",
                "| wind (m/s) | significant | truth: mean sim - twin (kW) [95% CI] | estimate (kW) [95% CI] | relative | covered |",
                "|---|---|---|---|---|---|",
            ]
            for b in bias["cells"]:
                where = "all steps" if b["range"] is None else f"{b['range'][0]:.3g}-{b['range'][1]:.3g}"
                rel = "–" if b["relative"] is None else f"{b['relative']:+.0%}"
                lines.append(
                    f"| {where} | {'yes' if b['significant'] else 'no'} | {_kw(b['truth'])} [{_kw(b['truth_ci'][0])}, "
                    f"{_kw(b['truth_ci'][1])}] | {_kw(b['estimate'])} [{_kw(b['ci'][0])}, {_kw(b['ci'][1])}] | {rel} | "
                    f"{'yes' if b['covered'] else 'no'} |"
                )
            lines.append("")
        for r in bias.get("response") or []:
            lines += [
                f"Response cell of P_avg: follows the model's predicted swings {r['factor']:.2f}x as far as reality "
                f"does [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] (no twin truth to compare with).",
                "",
            ]
    lines += ["## Unit to unit (other turbines' real weeks against this model)", ""]
    for t, u in res["unit_to_unit"].items():
        lines.append(
            f"- {t} ({u['weeks']} weeks): {u['verdict']} (top gap {u['top_gap']}; failing: "
            f"{', '.join(u['failing']) or '-'})"
        )
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def _kw(x) -> str:
    return "–" if x is None else f"{x:+.0f}"


def main(argv=None) -> int:
    from wmcheck.scripts.bench_report import finish, machine_info, write_results

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--steps", type=int, default=1500, help="training steps")
    p.add_argument("--weeks", type=int, default=60, help="weeks of the training turbine to use")
    p.add_argument("--unit-weeks", type=int, default=8, help="weeks per other turbine in the unit-to-unit check")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny training, few weeks: a smoke test")
    args = p.parse_args(argv)
    if not args.data.exists():
        print(f"bench_twins: {args.data} not found; skipped (the La Haute Borne data live in ../shared/data)")
        return 0
    if args.quick:
        args.steps, args.weeks, args.unit_weeks = 30, 20, 3
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    info = machine_info(command=" ".join(["scripts/bench_twins.py", *(argv if argv is not None else sys.argv[1:])]))
    res = run(args)
    finish(info, started)
    md = markdown(res, info)
    print(md)
    write_results(
        Path(args.out),
        "bench_twins",
        {"benchmark": "twins", "version": 1, "machine": info, "quick": args.quick, **res},
        md,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
