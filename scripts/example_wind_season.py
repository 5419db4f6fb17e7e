"""Worked example of the after-release tools on real wind-turbine logs (docs/after-release.md).

    python -m wmcheck.scripts.example_wind_season --run wmcheck-demo/run \
        --data la-haute-borne-data-2014-2015.csv.gz --out wind-season [--turbine R80721] [--threads 1]

RUN is the world model `wmcheck demo` trains on the embedded La Haute Borne subset (turbine R80721,
March to June 2014). The full open-data file (ENGIE's La Haute Borne SCADA export, 2014-2015) is
imported with the same mapping. Then:
  1. monitor: the same turbine's weeks after the training period, a look per calendar week
     (`wmcheck monitor --period 7d`): a season of real weeks against what the model learned in spring;
  2. shadow: on the first season weeks, the yaw/pitch rule policy designed in the simulator
     (`datasets/sims/wind_policy.py`) proposes a pitch and a heading at every 10-minute row from the
     last interval's measurements, next to what the turbine's own controller did; `wmcheck shadow
     --objective P_avg` predicts the energy difference of following it.
Prints both results; the reports are in OUT/monitor and OUT/shadow.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def season_log(data: Path, run: Path, turbine: str, out: Path) -> tuple[Path, float]:
    """The turbine's episodes that start after the training log's last timestamp: (log, that time)."""
    from wmcheck.checks.calibration import training_log
    from wmcheck.datasets.embedded import embedded_mapping_path
    from wmcheck.datasets.importers import build_mapping, import_to_log
    from wmcheck.datasets.logformat import open_log, write_log

    with open_log(training_log(run)) as log:
        trained_until = max(float(log.read(i, groups=False).timestamps[-1]) for i in log.episode_ids)
    full = out / "all.h5"
    import_to_log(data, full, mapping=build_mapping(embedded_mapping_path()))
    with open_log(full) as log:
        meta = log.meta
        eps = [
            e
            for e in log.episodes(groups=False)
            if (turbine == "all" or e.name == turbine) and e.timestamps[0] > trained_until
        ]
    eps.sort(key=lambda e: float(e.timestamps[0]))
    for i, e in enumerate(eps):
        e.id = i
    path = out / f"{turbine}-season.h5"
    write_log(path, eps, meta)
    return path, trained_until


def shadow_log(season: Path, out: Path, weeks: int) -> Path:
    """The first `weeks` season episodes with the rule policy's proposals: at row t it sees the last
    interval (power of row t, wind / relative direction / temperature of step t-1, heading t-1)."""
    from wmcheck.datasets.logformat import open_log, write_log
    from wmcheck.datasets.sims.wind_policy import YawPitchPolicy

    policy = YawPitchPolicy()
    with open_log(season) as log:
        meta = log.meta
        eps = [log.read(i, groups=False) for i in log.episode_ids[:weeks]]
    for e in eps:
        prop = np.empty_like(e.actions)
        for t in range(e.num_steps):
            k = max(t - 1, 0)
            wind, rel, temp = e.inputs[k]
            prop[t] = policy([e.observations[t, 0], wind, rel, temp, e.actions[k, 1]])
        e.proposed_actions = prop
    path = out / "shadow.h5"
    write_log(path, eps, meta)
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--turbine", default="R80721", help="the turbine to monitor, or `all` (the site's four)")
    p.add_argument("--shadow-weeks", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from wmcheck.checks.monitor import MonitorSettings, monitor
    from wmcheck.checks.monitor_report import write_monitor_outputs
    from wmcheck.checks.shadow import ShadowConfig, shadow_report
    from wmcheck.checks.shadow_html import write_shadow_outputs

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    season, until = season_log(args.data, args.run, args.turbine, args.out)
    print(
        f"season log {season} (episodes after {time.strftime('%Y-%m-%d', time.gmtime(until))}), {time.perf_counter() - t0:.0f} s"
    )
    rep = monitor(args.run, [season], args.out / "monitor", MonitorSettings(period="7d"), "example_wind_season")
    write_monitor_outputs(rep, args.out / "monitor")
    print(f"monitor: {rep['guarantee']}; reference {rep['reference']['episodes']} held-out weeks")
    for lk in rep["looks"]:
        w = lk["windows"]
        ps = ", ".join(f"p{k} {v['p_value']:.2g}" for k, v in w.items())
        print(
            f"  look {lk['look']:>2} {lk['label']}: {lk['verdict']:<12} ({lk['episodes']} episodes; {ps}) {lk['sentence'][:160]}"
        )
    sh = shadow_report(
        args.run, shadow_log(season, args.out, args.shadow_weeks), ShadowConfig(objective="P_avg"), "example"
    )
    write_shadow_outputs(sh, args.out / "shadow")
    print(f"shadow: {sh['verdict']}: {sh['message']}")
    for c in sh["over_the_horizon"]:
        print(f"  {c['name']}: {c['mean_difference']:+.4g} {c['unit'] or ''} on average over the horizon")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
