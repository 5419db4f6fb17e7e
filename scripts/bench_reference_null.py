"""Are the calibration's held-out real episodes exchangeable with new real episodes?

    python -m wmcheck.scripts.bench_reference_null --run RUNDIR [--env Pendulum-v1] [--policy hold:5]
        [--pool 300] [--reference 18] [--window 16] [--replicates 200] [--threads 1]

Every check and every monitor look compares new data with the held-out real episodes the
calibration scored, and their p-values are exact only if those episodes stand where a new real
episode stands. This benchmark records a pool of fresh real episodes (`--env`, `--policy`, a
faithful `checks.reality` profile) and scores them once through RUNDIR's model. Then, per
replicate, it draws `--reference` of them as a calibration would hold them out, fits the conformal
spread scale and the 99 % support bound on them, and draws a disjoint window of `--window` new
episodes, scored with that scale and bound. The reference's features (drift.episode_features)
are computed two ways: in-sample (scored with the scale and bound fitted on them, as the
calibration did before version 11) and left out (each episode with the scale and bound fitted
without it: conformal.left_out_scales, Calibration.left_out_support_bounds). For each it prints
  - the mean log divergence of the reference minus the window's (0 under exchangeability), with
    its standard error over replicates;
  - the share of replicates whose window test (drift.window_test, every feature) has p < 0.05
    and p < 0.01 (0.05 and 0.01 under exchangeability);
  - per feature, the share with its max-t adjusted p < 0.05.
The replicates share one model and one pool, so the rates are those of this model. `main`
returns {way: {gap, gap_se, p05}}.
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--policy", default="hold:5")
    p.add_argument("--steps", type=int, default=200, help="steps per pool episode")
    p.add_argument("--pool", type=int, default=300)
    p.add_argument("--reference", type=int, default=18)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--replicates", type=int, default=200)
    p.add_argument("--seed", type=int, default=20_000, help="first reset seed of the pool")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.reference + args.window > args.pool:
        p.error("--reference + --window must not exceed --pool")

    import torch

    torch.set_num_threads(args.threads)
    from pathlib import Path

    from wmcheck.checks.blocks import make_blocks
    from wmcheck.checks.calibration import load_calibrated
    from wmcheck.checks.drift import episode_features, window_test
    from wmcheck.checks.reality import RealityProfile, record_reality
    from wmcheck.checks.scoring import score_blocks, with_spread_scale
    from wmcheck.checks.stats import left_out_quantiles
    from wmcheck.datasets.normalize import Normalizer
    from wmcheck.training.conformal import fit_spread_scale, left_out_scales

    bundle, cal = load_calibrated(Path(args.run))
    cfg, norm = cal.config, Normalizer.from_dict(bundle.normalizer)
    names = list(bundle.channels.get("observation_names", []))
    eps = record_reality(
        args.env, RealityProfile(), args.policy, episodes=args.pool, max_steps=args.steps, seed=args.seed
    )
    for i, e in enumerate(eps):
        e.id = i
    blocks = make_blocks(eps, norm, cfg.context, cfg.horizon)
    raw = score_blocks(bundle.model, blocks, cfg.samples, cal.support_ref, cal.support_scale, seed=cfg.seed)
    ep = blocks.episode
    ids = np.unique(ep)
    print(
        f"pool: {len(ids)} episodes, {len(blocks)} blocks of {blocks.length} steps; reference {args.reference}, "
        f"window {args.window}, {args.replicates} replicates"
    )

    def features(episodes, scale, bound):
        rows = np.flatnonzero(np.isin(ep, episodes))
        b = bound if np.ndim(bound) == 0 else bound[rows]
        return episode_features(with_spread_scale(raw.subset(rows), scale), ep[rows], b, names)

    rng = np.random.default_rng(0)
    ways = ("in-sample", "left out")
    gap = {w: [] for w in ways}
    pv = {w: [] for w in ways}
    fp = {w: [] for w in ways}
    for _ in range(args.replicates):
        pick = rng.permutation(ids)
        ref, new = pick[: args.reference], pick[args.reference : args.reference + args.window]
        rows = np.flatnonzero(np.isin(ep, ref))
        r = np.abs(raw.z_steps[rows])  # (n_ref_blocks, H, D)
        scale = fit_spread_scale(r)
        steps = raw.support_steps[rows]
        bound = float(np.quantile(steps, 0.99))
        window = features(new, scale, bound)
        per_block = np.empty(len(ep))  # left-out bounds, indexed by pool block
        per_block[rows] = left_out_quantiles(steps, ep[rows], 0.99)
        ref_feats = {
            "in-sample": features(ref, scale, bound),
            "left out": features(ref, left_out_scales(r, ep[rows]), per_block),  # (n_ref_blocks, H, D) scales
        }
        for w in ways:
            t = window_test(window.values, ref_feats[w].values, window.two_sided, rng, 2000)
            gap[w].append(ref_feats[w].values[:, 0].mean() - window.values[:, 0].mean())
            pv[w].append(t.p_value)
            fp[w].append(t.feature_p)
    out = {}
    for w in ways:
        g, pw, f = np.array(gap[w]), np.array(pv[w]), np.array(fp[w])
        out[w] = {"gap": float(g.mean()), "gap_se": float(g.std() / np.sqrt(len(g))), "p05": float((pw < 0.05).mean())}
        per = ", ".join(f"{n} {v:.2f}" for n, v in zip(window.names, (f < 0.05).mean(0)))
        print(
            f"{w:>10}: reference - window mean log divergence {g.mean():+.3f} (se {g.std() / np.sqrt(len(g)):.3f}); "
            f"P(p < 0.05) {(pw < 0.05).mean():.3f}, P(p < 0.01) {(pw < 0.01).mean():.3f}; per feature P(p < 0.05): {per}"
        )

    return out


if __name__ == "__main__":
    main()
