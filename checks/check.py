"""`wmcheck check` as a function: checked trajectories in, a versioned report dict and a verdict out.

Owns the verdict logic (see product.md):
  - a block is outside competence when the median of its steps' latent distances to the training
    support exceeds the (1 - competence_alpha) quantile of held-out real steps' distances, or its
    ensemble disagreement has a conformal p-value below competence_alpha;
  - an episode is `unverifiable` when any of its blocks is outside competence or its blocks'
    support/disagreement are significantly above a new real episode's (the random-effects
    prediction test stats.episode_outlier_p, alpha / (2 * episodes)), unless its competent blocks
    already show it divergent; unverifiable is never a pass;
  - an episode is `divergent` when, on its competent blocks, any score (open-loop divergence,
    one-step NLL, KL surprise) is significantly above a new real episode's (the same prediction
    test) at alpha / (2 * 3 * episodes);
  - the run additionally gets a pooled test over all competent blocks at alpha / (2 * 3);
  - a gap the attribution tests find present (latency, actuator, sensor_noise, dynamics) fails the
    run too, unless the gate tolerates it: the verdict never says `pass` next to a red gap row.
  The false-alarm budget alpha is split in half: alpha / 2 for the divergence tests above (the
  per-episode and pooled levels use alpha / 2 in place of alpha) and alpha / 2 for the four gap
  tests (alpha / 8 each).
  Blocks of one episode are dependent: an episode is tested as one unit against the real
  episodes, and the pooled test is Welch's t of the episode means of the (log) scores
  (stats.episode_t_greater): episodes are the units. When the checked blocks replay held-out
  real blocks' logged exogenous inputs (a simulator driven by logged weather / load), the pooled
  test is paired instead: each block against its real twin (stats.paired_episode_t_greater).
  Residual gaps (sensor_noise, dynamics) on data whose visited states differ from the logs'
  (distribution present) make the run `unverifiable`, not `fail`: residual levels depend on the
  states. The union bound keeps the false-alarm rate of a faithful run at or below alpha (plus
  the competence tests' share for `unverifiable`); a model with cameras adds the visual test
  (checks/visual.py) at alpha, so its bound is 2 alpha.
Then attribution (attribution.py), the distribution test, the power table, and the report.
With a policy (`PolicyRun`), the closed-loop policy check and its gate (policy_check.py) add the
report's `policy` section; a failed policy gate fails the check.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

from wmcheck.checks import attribution as attr
from wmcheck.checks.blocks import block_controls, block_states, make_blocks
from wmcheck.checks.calibration import Calibration, power_table
from wmcheck.checks.config import COMPETENCE, DYNAMICS_GAPS, SCORES, Gate, split_alpha
from wmcheck.checks.policy_check import EpisodeBlocks, PolicyRun, policy_section
from wmcheck.checks.regimes import find_regimes
from wmcheck.checks.scoring import latent_features, score_blocks
from wmcheck.checks.stats import (block_mmd_test, cluster_bootstrap, conformal_p, episode_outlier_p, episode_t_greater,
                                  log_pair, paired_episode_t_greater, rank_auc)
from wmcheck.checks.transforms import actuator_correction, shift_actions
from wmcheck.checks.visual import VisualCalibration, checked_video, require_frames, visual_gap
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.scripts.errors import UserError
from wmcheck.training.checkpoint import file_sha256, load_model

REPORT_VERSION = 2  # 2: adds the `policy` and `regimes` sections
NEXT_STEPS = {
    "latency": "add the estimated action delay to the simulator's control loop (or model the measured loop timing) and re-check",
    "actuator": "calibrate the simulated actuator: apply the estimated gain / offset / deadband to the commands, then re-check",
    "sensor_noise": "match the simulated sensor model to the real residuals: noise level, bias, drift; re-check",
    "dynamics": "revisit the simulator's physics (friction, damping, mass, contact) on the channels and horizons listed; system-identify them from the real logs",
    "distribution": "collect real logs in the states the checked episodes visit, or restrict the task / initial-state distribution to what the logs cover",
    "visual": "match the simulator's rendering to the camera (lighting, exposure, colour, textures, blur, noise) as the "
              "photometric statistics say, or widen visual domain randomisation over them; re-check",
}


def _read_checked(path: Path, channels: dict):
    if not Path(path).exists():
        raise UserError(f"rollout log {path} does not exist", "record one with `wmcheck record` or import it with `wmcheck import`")
    with open_log(path) as log:
        meta = log.meta
        eps = list(log)
    problems = []
    for kind, mine in (("observation", meta.observation_names), ("action", meta.action_names), ("input", meta.input_names)):
        theirs = channels.get(f"{kind}_names", [])
        if len(mine) != len(theirs):
            problems.append(f"{len(mine)} {kind} channels {mine} but the model has {len(theirs)} {theirs}")
        elif mine != theirs and not all(n.startswith(("obs_", "act_", "action_", "input_")) for n in mine):
            problems.append(f"{kind} channels {mine} differ from the model's {theirs}")
    if problems:
        raise UserError(f"{path} does not fit the model: " + "; ".join(problems),
                        "record/import the rollouts with the same channels, in the same order, as the real training log")
    return meta, eps


def run_check(run_dir: str | Path, rollouts: str | Path, gate: Gate | None = None, command: str | None = None,
              seed: int = 0, policy: PolicyRun | None = None, clip_model: str | Path | None = None) -> dict:
    """Check the rollouts in `rollouts` against the model in `run_dir`; with `policy` (the policy and
    env that recorded them), also the closed-loop policy check; with `clip_model` (local CLIP
    weights), also CLIP image-embedding distances for camera logs."""
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    gate = gate or Gate()
    bundle = load_model(run_dir)
    cal = Calibration.load(run_dir)
    cfg = cal.config
    if cal.info.get("model_sha256") not in (None, bundle.file_hash):
        raise UserError(f"{run_dir}/calibration.json belongs to another model.pt", f"re-run `wmcheck calibrate {run_dir}`")
    alpha = float(gate.alpha or cfg.alpha)
    model, norm = bundle.model, Normalizer.from_dict(bundle.normalizer)
    meta, episodes = _read_checked(Path(rollouts), bundle.channels)
    require_frames(model, episodes, rollouts)
    try:
        blocks = make_blocks(episodes, norm, cfg.context, cfg.horizon)
    except ValueError as exc:
        raise UserError(f"{rollouts}: {exc}", f"check episodes of at least {cfg.context + cfg.horizon + 1} steps") from None
    checked_eps = [e for e in episodes if e.id not in blocks.skipped]
    sc = score_blocks(model, blocks, cfg.samples, cal.support_ref, cal.support_scale, seed=seed)
    real = cal.real
    rng = np.random.default_rng(seed)
    real_ep = cal.real_episode  # (m,) the clusters of the real blocks

    def test(x_idx, s):  # checked blocks x_idx against the real blocks, score s, episodes as the units
        return episode_t_greater(getattr(sc, s)[x_idx], blocks.episode[x_idx], getattr(real, s), real_ep, log=(s != "nll"))

    def episode_test(x_idx, s):  # one episode against new real episodes (random-effects prediction test)
        return episode_outlier_p(getattr(sc, s)[x_idx], getattr(real, s), real_ep, log=(s != "nll"))

    # ---- competence per block
    # Support: the calibrated bound is the (1 - competence_alpha) quantile of held-out real steps'
    # latent distances; a block is outside competence when most of its steps (the median) lie beyond
    # it. Disagreement (K > 1): conformal p of the block mean against real blocks.
    comp_alpha = float(gate.score_alpha.get("support", cfg.competence_alpha))
    support_bound = float(np.quantile(real.support_steps, 1 - comp_alpha))
    p_dis = conformal_p(sc.disagreement, real.disagreement) if real.disagreement.max() > 0 else np.ones(len(blocks))
    competent = (np.median(sc.support_steps, 1) <= support_bound) & \
                (p_dis >= float(gate.score_alpha.get("disagreement", cfg.competence_alpha)))
    real_step_q = float(np.quantile(real.support_steps, 0.99))
    coverage = float((sc.support_steps <= real_step_q).mean())

    # ---- per-episode verdicts
    ep_ids = [e.id for e in checked_eps]
    n_ep = len(ep_ids)
    a_div, a_gap = split_alpha(alpha)  # the divergence tests' level; each gap test's level
    a_ep = a_div / (2 * len(SCORES) * n_ep)
    a_comp = alpha / (2 * n_ep)
    div_q = np.quantile(real.div_curve, 1 - alpha, axis=0)  # (H,) per-horizon threshold for the onset
    ep_entries = []
    # The first competent block that a score flags: conformal p below alpha, or (with few
    # calibration blocks, where p cannot go below 1/(m+1)) a score above every real block.
    p_floor = max(alpha, 1.0 / (len(real.divergence) + 1))
    block_p = np.min(np.stack([conformal_p(getattr(sc, s), getattr(real, s)) for s in SCORES]), 0)  # (n_blocks,)
    flagged_block = competent & (block_p <= p_floor)
    for ep in checked_eps:
        idx = np.flatnonzero(blocks.episode == ep.id)
        cidx = idx[competent[idx]]
        comp_p = {s: episode_test(idx, s) for s in COMPETENCE if getattr(real, s).max() > 0 or s == "support"}
        div_p = {s: (episode_test(cidx, s) if len(cidx) else float("nan")) for s in SCORES}
        # Divergent where the model is competent; otherwise any block beyond the competence bounds
        # (or a significant shift of the episode's support / disagreement) makes it unverifiable.
        unverifiable = any(p < a_comp for p in comp_p.values()) or len(cidx) < len(idx)
        divergent = any(p < a_ep for p in div_p.values() if not math.isnan(p))
        verdict = "divergent" if divergent else ("unverifiable" if unverifiable else "consistent")
        onset = None
        for b in cidx:
            if flagged_block[b]:
                div_flag = conformal_p(sc.divergence[b], real.divergence)[0] <= p_floor
                over = np.flatnonzero(sc.div_curve[b] > div_q) if div_flag else np.array([], int)
                onset = int(blocks.start[b] + cfg.context + (over[0] if len(over) else 0))
                break
        score = max(rank_auc(getattr(sc, s)[idx], getattr(real, s)) for s in SCORES)
        ep_entries.append({
            "id": int(ep.id), "name": ep.name, "steps": int(ep.num_steps), "blocks": int(len(idx)),
            "verdict": verdict, "score": round(float(score), 4),
            "divergence_onset_step": onset if verdict == "divergent" else None,
            "divergence_onset_seconds": (onset * meta.dt if (onset is not None and meta.dt and verdict == "divergent") else None),
            "p_values": {k: _r(v) for k, v in {**div_p, **comp_p}.items()},
            "outside_competence_fraction": round(float(1 - competent[idx].mean()), 4),
            "scores": {s: round(float(getattr(sc, s)[idx].mean()), 4) for s in SCORES + COMPETENCE},
        })

    # ---- pooled test over competent blocks
    comp_idx = np.flatnonzero(competent)
    # Replays of logged conditions (the checked blocks' exogenous inputs equal held-out real
    # blocks'): the pooled test compares each block with its real counterpart (paired).
    twin = _real_twins(blocks, cal, len(bundle.channels.get("action_names", [])))  # (n,) real block or -1
    paired_idx = comp_idx[twin[comp_idx] >= 0]
    paired = len(comp_idx) > 0 and len(paired_idx) >= 0.5 * len(comp_idx) and len(np.unique(blocks.episode[paired_idx])) >= 2

    def paired_test(s):
        x, y = getattr(sc, s)[paired_idx], getattr(real, s)[twin[paired_idx]]
        if s != "nll":
            x, y = log_pair(x, y)
        return paired_episode_t_greater(x - y, blocks.episode[paired_idx])

    pooled_p = {s: ((paired_test(s) if paired else test(comp_idx, s)) if len(comp_idx) else float("nan")) for s in SCORES}
    pooled_reject = any(p < a_div / (2 * len(SCORES)) for p in pooled_p.values() if not math.isnan(p))

    # ---- attribution on competent blocks
    gaps, top_gap, confounded = _attribute(model, norm, cal, sc, checked_eps, blocks, comp_idx, a_gap, gate, meta, rng, seed)
    gaps["visual"] = _visual(model, run_dir, checked_eps, alpha, clip_model, gate.tolerances.get("visual"))

    # ---- distribution
    mmd, p_mmd = block_mmd_test(list(block_states(blocks)), list(cal.real_states), rng,
                                x_groups=blocks.episode, y_groups=real_ep)
    dist_ev = (alpha / max(p_mmd, 1e-12))
    min_cov = gate.tolerances.get("distribution", {}).get("min_coverage")
    dist_present = p_mmd < alpha or (min_cov is not None and coverage < min_cov)
    gaps["distribution"] = {
        "verdict": "present" if dist_present else "absent", "evidence": round(float(dist_ev), 3),
        "estimate": {"mmd2": round(mmd, 5), "p_value": _r(p_mmd), "coverage": round(coverage, 4),
                     "outside_competence_fraction": round(float(1 - competent.mean()), 4)},
        "ci": None,
        "explanation": (f"{coverage:.0%} of checked steps lie inside the real data's support "
                        f"(latent distance within the 99% range of held-out real steps); MMD two-sample test of the visited "
                        f"states, permuting whole episodes: p = {p_mmd:.3g}"),
    }
    if top_gap == "none" and not confounded and dist_present and not pooled_reject:
        top_gap = "distribution"

    # ---- verdict
    n_div = sum(e["verdict"] == "divergent" for e in ep_entries)
    n_unv = sum(e["verdict"] == "unverifiable" for e in ep_entries)
    visual_present = gaps["visual"]["verdict"] == "present"
    if top_gap == "none" and not confounded and visual_present:
        top_gap = "visual"
    gap_present = [g for g in DYNAMICS_GAPS if gaps[g]["verdict"] == "present"]
    # The residual tests (sensor_noise, dynamics) compare residual levels with the real blocks',
    # which depend on the states visited: when the visited states differ too (distribution), a
    # residual difference alone cannot be told from the shift, so it makes the run unverifiable,
    # not failed. The searches (latency, actuator) are paired on the checked blocks themselves.
    shift_confounded = [g for g in gap_present if g in ("sensor_noise", "dynamics")] if dist_present else []
    failing = n_div > 0 or pooled_reject or visual_present or any(g not in shift_confounded for g in gap_present)
    tolerated = failing and _all_tolerated(gaps)
    if failing and not tolerated:
        verdict = "fail"
    elif n_unv > 0 or shift_confounded:
        verdict = "unverifiable"
    else:
        verdict = "pass"
    # ---- policy: closed loop in the model vs the simulator, and the policy gate
    pol, main_verdict = None, verdict
    if policy is not None:
        ep_blocks = EpisodeBlocks(
            flagged={int(e.id): bool(flagged_block[blocks.episode == e.id].any()) for e in checked_eps},
            coverage={int(e.id): float((sc.support_steps[blocks.episode == e.id] <= real_step_q).mean()) for e in checked_eps},
            support_steps={int(e.id): int(sc.support_steps[blocks.episode == e.id].size) for e in checked_eps})
        pol = policy_section(model, norm, episodes, policy, ep_blocks, gate.policy, alpha, div_q, cfg.context,
                             meta.dt or bundle.channels.get("dt"), norm.names["obs"], cal.info, rng, seed)
        if not pol["gate"]["passed"]:
            verdict = "fail"
    exit_code = 0 if verdict == "pass" or (verdict == "unverifiable" and gate.allow_unverifiable) else 1
    score = max(rank_auc(getattr(sc, s)[comp_idx if len(comp_idx) else slice(None)], getattr(real, s)) for s in SCORES)
    power = power_table(cal, max(len(comp_idx), 1), alpha, cfg.power_target, seed=seed)
    dt = meta.dt or bundle.channels.get("dt")
    report = {
        "report_version": REPORT_VERSION,
        "verdict": verdict,
        "exit_code": exit_code,
        "summary": {
            "score": round(float(score), 4),
            "score_meaning": "largest over scores of P(a checked block scores worse than a held-out real block); 0.5 = like reality, 1 = every block worse",
            "top_gap": top_gap, "confounded": confounded,
            "episodes": n_ep, "consistent": n_ep - n_div - n_unv, "divergent": n_div, "unverifiable": n_unv,
            "skipped_short_episodes": {str(k): v for k, v in blocks.skipped.items()},
            "blocks": int(len(blocks)), "competent_blocks": int(len(comp_idx)),
            "pooled_p_values": {k: _r(v) for k, v in pooled_p.items()},
            "pooled_test": ("paired: the checked blocks replay held-out real blocks' logged inputs; each is compared with its "
                            f"real twin, episodes as the units ({len(paired_idx)} of {len(comp_idx)} competent blocks paired)"
                            if paired else "unpaired: Welch's t of the checked vs the held-out real episodes' mean (log) scores"),
            "alpha": alpha, "tolerated_by_gate": bool(tolerated),
            "message": _message(verdict, top_gap, confounded, gaps, n_ep, n_div, n_unv, power, tolerated, pol, main_verdict, alpha,
                                shift_confounded, pooled_reject),
        },
        "episodes": ep_entries,
        "gaps": gaps,
        "divergence_curve": {
            "horizon_steps": list(range(1, cfg.horizon + 1)),
            "checked_mean": _rl(sc.div_curve[comp_idx].mean(0) if len(comp_idx) else sc.div_curve.mean(0)),
            "real_mean": _rl(real.div_curve.mean(0)), "real_q": _rl(div_q), "real_q_level": 1 - alpha,
        },
        "channels": _channels(sc, real, bundle.channels, comp_idx),
        "regimes": _regimes(sc, blocks, competent, cal, norm, bundle.channels, meta, alpha, seed),
        "power": {"n_blocks": int(max(len(comp_idx), 1)), "target": cfg.power_target, "alpha": alpha, "gaps": power},
        "thresholds": {"source": gate.source if gate.source != "defaults" else "calibration",
                       "alpha": alpha, "competence_alpha": comp_alpha, "support_bound": support_bound, "episode_alpha": a_ep,
                       "pooled_alpha": a_div / (2 * len(SCORES)), "gap_alpha": a_gap,
                       "calibration_blocks": int(len(real.divergence)),
                       "calibration_warning": cal.info.get("warning")},
        "provenance": {
            "wmcheck_version": _version(), "command": command or " ".join(sys.argv),
            "model_sha256": bundle.file_hash, "training_data_sha256": bundle.data_hash,
            "rollouts": str(rollouts), "rollouts_sha256": file_sha256(rollouts), "rollouts_source": meta.source,
            "dt": dt, "seconds": round(time.perf_counter() - t0, 1),
        },
        "policy": None if pol is None else {k: v for k, v in pol.items() if not k.startswith("_")},
        "_policy_plots": None if pol is None else pol["_plots"],
        "_plots": _plot_data(sc, blocks, comp_idx, norm, bundle.channels, cfg),
        "_embedding": _embedding(model, blocks, cal, rng),
        "_video": checked_video(model, blocks, np.argsort(-sc.divergence)[:6], cfg.context),
    }
    return report


def _visual(model, run_dir, episodes, alpha, clip_model, tolerance) -> dict:
    """The visual gap row (checks/visual.py); CLIP distances when --clip-model points at local weights.
    It is tested at alpha on its own: for a model with cameras the false-alarm bound of a faithful
    simulator is alpha (the dynamics-family tests above) plus alpha (the visual test)."""
    clip = None
    if clip_model is not None:
        from wmcheck.checks.clip_embedding import ClipEmbedder

        clip = ClipEmbedder.load(clip_model)
    return visual_gap(model, VisualCalibration.load(run_dir), episodes, alpha, clip, tolerance)


def _embedding(model, blocks, cal, rng, per_side: int = 500) -> dict:
    """Latent states h of checked steps and of training steps (the support reference), for the
    TensorBoard embedding projector."""
    checked = latent_features(model, blocks).reshape(-1, model.cfg.deter)
    checked = checked[rng.choice(len(checked), size=min(per_side, len(checked)), replace=False)]
    real = cal.support_ref[rng.choice(len(cal.support_ref), size=min(per_side, len(cal.support_ref)), replace=False)]
    return {"features": np.concatenate([real, checked]).astype(np.float32),
            "labels": ["real (training)"] * len(real) + ["checked"] * len(checked)}


def _attribute(model, norm, cal, sc, eps, blocks, comp_idx, alpha, gate, meta, rng, seed):
    """The gap rows and the top gap; alpha is the level of each gap test (config.split_alpha)."""
    cfg = cal.config
    gaps: dict[str, dict] = {"visual": {"verdict": "not_checked", "evidence": None, "estimate": None, "ci": None,
                                        "explanation": "the logs have no image observations"}}
    if len(comp_idx) == 0:
        for g in DYNAMICS_GAPS:
            gaps[g] = {"verdict": "not_checked", "evidence": None, "estimate": None, "ci": None,
                       "explanation": "no block lies inside the model's competence"}
        return gaps, "none", []
    astd = norm.std["action"].astype(float)
    lat_search = attr.search_matrices(model, eps, norm, cfg, astd, actuator=False)  # the actuator searches follow it
    ck_ep, real_ep = blocks.episode[comp_idx], cal.real_episode  # the clusters: episodes
    boot_idx = cluster_bootstrap(rng, ck_ep, cfg.bootstrap)  # resample checked episodes, not blocks
    reps = cfg.bootstrap
    dt = meta.dt
    # latency
    delays = lat_search.delays
    lat = attr.evaluate_search(lat_search.latency[:, comp_idx], cal.real_search.latency, delays, int(np.flatnonzero(delays == 0)[0]),
                               alpha, rng, reps, boot_idx, real_ep)
    d_best, d_ci = attr.registered_delay(lat_search.latency[:, comp_idx], cal.real_search.latency, delays, boot_idx)
    tol = gate.tolerances.get("latency", {}).get("max_steps")
    gaps["latency"] = _gap(lat.evidence, {"steps": d_best, "seconds": (d_best * dt if dt else None),
                                          "direction": f"the simulator lacks ~{d_best} step(s) of latency (responds earlier than reality)" if d_best > 0 else
                                          (f"the simulator has ~{-d_best} step(s) too much latency (responds later than reality)" if d_best < 0 else "none")},
                           list(d_ci), tolerated=(tol is not None and abs(d_best) <= tol),
                           explanation=f"shifting the checked commands by {int(delays[lat.best])} step(s) lowers the one-step NLL by "
                                       f"{lat.improvement:.3g} (paired t = {lat.evidence * lat.threshold:.3g}; "
                                       f"the same search on real blocks stays below {lat.threshold:.3g}); the checked NLL curve "
                                       f"over delays is the real blocks' curve shifted by {d_best} step(s)",
                           curve={"delays": delays.tolist(), "mean_log_score": _rl(lat.curve),
                                  "real_mean_log_score": _rl(cal.real_search.latency.mean(1))})
    # actuator: one factor at a time per channel, on the commands with the latency found already
    # corrected (a delay looks partly like a weaker gain); Bonferroni over the searches
    # The model knows reality only inside the training logs' command range: a candidate that moves
    # more of a channel's commands outside it than the checked commands already are (and more than
    # competence_alpha) cannot be judged, and is left out of the search (a physics gap could
    # otherwise masquerade as a correction the model only extrapolates to).
    act_eps = eps
    if gaps["latency"]["verdict"] in ("present", "tolerated") and d_best != 0:
        act_eps = [shift_actions(e, d_best) for e in eps]
    chk = attr.search_matrices(model, eps, norm, cfg, astd, latency=False, actuator_episodes=act_eps)
    names = norm.names["action"]
    n_search = max(1, len(chk.actuator))
    results, untested = {}, {}
    for key, mat in chk.actuator.items():
        kind, c = key.split(":")
        grid = chk.act_values[kind]
        ident = int(np.flatnonzero(grid == (1.0 if kind == "gain" else 0.0))[0])
        unit = 1.0 if kind == "gain" else float(astd[int(c)])
        allowed = attr.allowed_corrections(norm, act_eps, int(c), kind, grid, unit, cfg.competence_alpha)  # (G,)
        if not allowed.all():
            untested.setdefault(names[int(c)], {})[kind] = [float(v * unit) for v in grid[~allowed]]
        results[key] = attr.evaluate_search(mat[:, comp_idx], cal.real_search.actuator[key], grid, ident,
                                            alpha / n_search, rng, reps, boot_idx, real_ep, allowed)
    if results:
        # The gap's evidence is the strongest search; its estimate is the significant correction
        # that explains the most (largest mean log-score gain), since gain, offset and deadband
        # can all partly mimic one another.
        significant = [k for k in results if results[k].evidence >= 1.0] or list(results)
        best_key = max(significant, key=lambda k: results[k].improvement)
        evidence = max(res.evidence for res in results.values())
        kind, c = best_key.split(":")
        r = results[best_key]
        value = float(chk.act_values[kind][r.best])
        per_channel = {}
        for key, res in results.items():
            k2, c2 = key.split(":")
            v = float(chk.act_values[k2][res.best])
            scale = 1.0 if k2 == "gain" else float(astd[int(c2)])
            per_channel.setdefault(names[int(c2)], {})[k2] = {"estimate": v * scale, "ci": [res.interval[0] * scale, res.interval[1] * scale],
                                                               "evidence": round(res.evidence, 3)}
        scale = 1.0 if kind == "gain" else float(astd[int(c)])
        tol_gain = gate.tolerances.get("actuator", {}).get("max_gain_error")
        tol_off = gate.tolerances.get("actuator", {}).get("max_offset")
        tolerated = (kind == "gain" and tol_gain is not None and abs(value - 1) <= tol_gain) or \
                    (kind == "offset" and tol_off is not None and abs(value * scale) <= tol_off)
        # Share of the corrected commands outside the training range (at most what the checked
        # commands already had, or competence_alpha: larger corrections were not tested).
        extrap = attr.outside_training_share(norm, [actuator_correction(e, int(c), kind, value * scale) for e in act_eps], int(c))
        caution = (f"; caution: {extrap:.0%} of the corrected {names[int(c)]} commands lie outside the training logs' "
                   f"range, where the model extrapolates" if extrap > cfg.competence_alpha else "")
        if untested:
            caution += ("; not tested, because they would move commands outside the training logs' range where the model "
                        "cannot judge them: " + "; ".join(f"{k} {', '.join(f'{v:.3g}' for v in vs)} on {ch}"
                                                         for ch, kinds in untested.items() for k, vs in kinds.items()))
        gaps["actuator"] = _gap(evidence, {"channel": names[int(c)], "kind": kind, "value": value * scale,
                                             "per_channel": per_channel, "extrapolated_share": round(extrap, 4),
                                             "untested": untested},
                                [r.interval[0] * scale, r.interval[1] * scale], tolerated=tolerated,
                                explanation=f"{kind} {value * scale:.3g} on {names[int(c)]} lowers the predictive log-score by {r.improvement:.3g} "
                                            f"(paired t = {r.evidence * r.threshold:.3g}; real blocks stay below {r.threshold:.3g}){caution}")
        act_boot = np.max(np.stack([res.boot_evidence for res in results.values()]), 0)
    else:
        gaps["actuator"] = _gap(0.0, None, None, explanation="no command channels")
        act_boot = np.zeros(reps)
    # corrections found above, applied before the residual (sensor) and dynamics tests
    corrected = eps
    applied = []
    if gaps["latency"]["verdict"] in ("present", "tolerated") and d_best != 0:
        corrected = [shift_actions(e, d_best) for e in corrected]
        applied.append(f"delay {d_best} steps")
    if gaps["actuator"]["verdict"] in ("present", "tolerated"):
        est = gaps["actuator"]["estimate"]
        c = names.index(est["channel"])
        corrected = [actuator_correction(e, c, est["kind"], est["value"]) for e in corrected]
        applied.append(f"{est['kind']} {est['value']:.3g} on {est['channel']}")
    sc_corr = sc if not applied else score_blocks(model, make_blocks(corrected, norm, cfg.context, cfg.horizon), cfg.samples,
                                                  cal.support_ref, cal.support_scale, seed=seed)
    # sensor noise and dynamics: the residual level / bias / whiteness tests (attribution.residual_evidence)
    sens = attr.residual_evidence(sc_corr.resid_std[comp_idx], cal.real.resid_std, sc_corr.resid_mean[comp_idx], cal.real.resid_mean,
                                  sc_corr.resid_ac1[comp_idx], cal.real.resid_ac1, alpha, rng, reps, boot_idx, (ck_ep, real_ep))
    obs_names = norm.names["obs"]
    std_obs = norm.std["obs"].astype(float)
    ac1_c, ac1_r = sc_corr.resid_ac1[comp_idx].mean(0), cal.real.resid_ac1.mean(0)
    worst = int(np.argmax(sens["evidence_per_channel"]))
    tol = gate.tolerances.get("sensor_noise", {})
    ratio = float(sens["ratio"][worst])
    tolerated = ("max_ratio" in tol and max(ratio, 1 / max(ratio, 1e-9)) <= tol["max_ratio"])
    coloured = [obs_names[d] for d in np.flatnonzero(sens["coloured"])]
    gaps["sensor_noise"] = _gap(sens["evidence"], {
        "channel": obs_names[worst], "noise_ratio": ratio, "bias": float(sens["bias"][worst] * std_obs[worst]),
        "per_channel": {obs_names[d]: {"noise_ratio": float(sens["ratio"][d]),
                                       "noise_ratio_ci": [float(sens["ratio_interval"][0][d]), float(sens["ratio_interval"][1][d])],
                                       "bias": float(sens["bias"][d] * std_obs[d]),
                                       "residual_ac1": float(ac1_c[d]), "real_residual_ac1": float(ac1_r[d]),
                                       "evidence": round(float(sens["evidence_per_channel"][d]), 3)} for d in range(len(obs_names))}},
        [float(sens["ratio_interval"][0][worst]), float(sens["ratio_interval"][1][worst])], tolerated=tolerated,
        explanation=f"one-step residuals of {obs_names[worst]}: noise level {ratio:.2f}x reality's, bias "
                    f"{sens['bias'][worst] * std_obs[worst]:.3g}; lag-1 autocorrelation {ac1_c[worst]:.2f} (real {ac1_r[worst]:.2f}: "
                    f"{'whiter' if ac1_c[worst] < ac1_r[worst] else 'more coloured'} than reality)"
                    + (f"; not counted on {', '.join(coloured)}, whose larger residuals are more coloured than reality's "
                       f"(dynamics, not sensor noise)" if coloured else ""))
    # dynamics: what the corrections leave, as larger and more coloured residuals; the open-loop
    # error ratio per channel and per horizon says where and how fast it grows.
    dw = int(np.argmax(sens["dynamics_per_channel"]))
    per_ch = sc_corr.div_channel[comp_idx].mean(0) / np.maximum(cal.real.div_channel.mean(0), 1e-9)
    per_h = sc_corr.div_curve[comp_idx].mean(0) / np.maximum(cal.real.div_curve.mean(0), 1e-9)
    H = len(per_h)
    gaps["dynamics"] = _gap(sens["dynamics_evidence"], {
        "channel": obs_names[dw], "residual_ratio": float(sens["ratio"][dw]),
        "residual_ac1": float(ac1_c[dw]), "real_residual_ac1": float(ac1_r[dw]),
        "per_channel_ratio": {obs_names[d]: round(float(per_ch[d]), 3) for d in range(len(obs_names))},
        "after_corrections": applied, "per_horizon_ratio": _rl(per_h)},
        None, explanation=f"after {', '.join(applied) or 'no correction'}, one-step residuals of {obs_names[dw]} are "
                          f"{sens['ratio'][dw]:.2f}x reality's and {'more' if ac1_c[dw] > ac1_r[dw] else 'less'} coloured (lag-1 "
                          f"autocorrelation {ac1_c[dw]:.2f} vs real {ac1_r[dw]:.2f})"
                          + (": an error that persists from step to step is physics, not sensor noise"
                             if sens["dynamics_evidence"] >= 1 else ": not both significantly")
                          + f"; open-loop error vs reality's: x{per_h[: max(1, H // 4)].mean():.2g} over "
                          f"horizon steps 1-{max(1, H // 4)}, x{per_h[H // 2 :].mean():.2g} over {H // 2 + 1}-{H}")
    boot = {"latency": lat.boot_evidence, "actuator": act_boot, "sensor_noise": sens["boot_evidence"],
            "dynamics": sens["dynamics_boot_evidence"]}
    present = [g for g in DYNAMICS_GAPS if gaps[g]["verdict"] in ("present", "tolerated")]
    top, confounded = attr.separate_top(boot, present)
    for g in confounded:
        gaps[g]["confounded_with"] = [o for o in confounded if o != g]
    return gaps, top, confounded


def _real_twins(blocks, cal, n_actions: int, tol: float = 1e-4) -> np.ndarray:
    """For every checked block, the held-out real block whose exogenous inputs (normalised, every
    horizon step) it repeats, or -1: (n,). A simulator replaying logged periods with their logged
    weather / load / setpoints has twins; one driven by its own scenarios has none. Models without
    exogenous inputs never pair (commands alone do not identify a period)."""
    n = len(blocks)
    ctrl_r = cal.real_controls
    ctrl_c = block_controls(blocks)
    if ctrl_r is None or ctrl_c.shape[-1] <= n_actions or ctrl_r.shape[1:] != ctrl_c.shape[1:]:
        return np.full(n, -1)
    inp_c, inp_r = ctrl_c[..., n_actions:], ctrl_r[..., n_actions:]  # (n, H, E), (m, H, E)
    out = np.full(n, -1)
    for s in range(0, n, 64):  # (64, m, H, E) at a time: many checked blocks x many real ones
        dist = np.abs(inp_c[s : s + 64, None] - inp_r[None]).max(axis=(2, 3))  # (k, m) largest input difference
        best = dist.argmin(1)
        out[s : s + 64] = np.where(dist[np.arange(len(best)), best] <= tol, best, -1)
    return out


def _gap(evidence, estimate, ci, tolerated=False, explanation="", **extra) -> dict:
    present = evidence is not None and evidence >= 1.0
    verdict = ("tolerated" if tolerated else "present") if present else "absent"
    out = {"verdict": verdict, "evidence": None if evidence is None else round(float(evidence), 3),
           "estimate": estimate, "ci": ci, "explanation": explanation}
    out.update(extra)
    return out


def _all_tolerated(gaps: dict) -> bool:
    present = [g for g, e in gaps.items() if e["verdict"] in ("present", "tolerated") and g != "distribution"]
    return bool(present) and all(gaps[g]["verdict"] == "tolerated" for g in present) and gaps["dynamics"]["verdict"] != "present"


def _message(verdict, top, confounded, gaps, n_ep, n_div, n_unv, power, tolerated, pol=None, main_verdict=None,
             alpha: float = 0.05, shift_confounded=(), pooled: bool = False) -> str:
    if pol is not None and not pol["gate"]["passed"]:
        head = "FAIL: the policy gate is not met: " + "; ".join(pol["gate"]["reasons"]) + "."
        rest = _message(main_verdict, top, confounded, gaps, n_ep, n_div, n_unv, power, tolerated, alpha=alpha,
                        shift_confounded=shift_confounded, pooled=pooled)
        return head + " " + (rest if main_verdict == "fail" else "Consistency check: " + rest)
    parts = []
    if verdict == "pass":
        parts.append(f"PASS: {n_ep} episode(s) consistent with reality as the model knows it" + (" (gaps within gate tolerances)" if tolerated else "") + ".")
        worth = [f"{g} >= {p['smallest_detected']} {p['units']}" for g, p in power.items() if p["smallest_detected"] is not None]
        undetectable = [g for g, p in power.items() if p["smallest_detected"] is None]
        if not power:
            parts.append("Its power was not measured: calibration needs at least 2 held-out real episodes to inject gaps into.")
        elif not all(p.get("reliable", True) for p in power.values()):
            rate = next(p["control_detection"] for p in power.values())
            parts.append(f"Its power could not be measured reliably: with no gap injected, the held-out real episodes already "
                         f"differ among themselves ({rate:.0%} detected); hold out more real episodes.")
        else:
            rate = next(iter(power.values())).get("control_detection")
            parts.append("This pass would have caught: " + (", ".join(worth) or "none of the injected gap sizes") + "."
                         + (f" Not detectable at the tested sizes: {', '.join(undetectable)}." if undetectable else "")
                         + (f" (With no gap injected, {rate:.0%} of the power draws are flagged, above alpha: these sizes "
                            f"are optimistic.)" if rate is not None and rate > alpha else ""))
    elif verdict == "fail" and n_div > 0:
        parts.append(f"FAIL: {n_div} of {n_ep} episode(s) diverge from reality.")
    elif verdict == "fail" and gaps["visual"]["verdict"] == "present":
        parts.append("FAIL: the checked camera frames differ from the real camera's (visual gap).")
    elif verdict == "fail" and not pooled and any(gaps[g]["verdict"] == "present" for g in DYNAMICS_GAPS):
        found = [g for g in DYNAMICS_GAPS if gaps[g]["verdict"] == "present"]
        parts.append(f"FAIL: the gap tests find {', '.join(found)} (no single episode and not the pooled divergence test "
                     f"flags it: the gap is small but systematic).")
    elif verdict == "fail":
        parts.append("FAIL: the pooled test over all blocks finds the checked episodes worse than reality.")
    elif n_unv:
        parts.append(f"UNVERIFIABLE: {n_unv} of {n_ep} episode(s) visit states where the model is not competent; this is not a pass.")
    else:
        parts.append(f"UNVERIFIABLE: the residual tests find {', '.join(shift_confounded)}, but the checked episodes visit "
                     f"states in other proportions than the real logs (distribution gap), and residuals differ between "
                     f"states anyway; this is not a pass: collect real logs in the states the simulator visits.")
    if top != "none":
        e = gaps[top]
        parts.append(f"Top gap: {top} ({e['explanation']}).")
    elif confounded:
        parts.append(f"The evidence does not separate {', '.join(confounded)}: they are confounded.")
    return " ".join(parts)


def _channels(sc, real, channels, comp_idx) -> list[dict]:
    idx = comp_idx if len(comp_idx) else slice(None)
    names = channels.get("observation_names", [])
    units = channels.get("units", {})
    return [{"name": n, "unit": units.get(n), "nll_checked": round(float(sc.nll_channel[idx, d].mean()), 4),
             "nll_real": round(float(real.nll_channel[:, d].mean()), 4),
             "divergence_checked": round(float(sc.div_channel[idx, d].mean()), 4),
             "divergence_real": round(float(real.div_channel[:, d].mean()), 4)} for d, n in enumerate(names)]


def _regimes(sc, blocks, competent, cal, norm, channels, meta, alpha, seed) -> dict | None:
    """Operating regimes (command and input ranges) where the checked data diverge; None when the
    calibration predates the per-step errors (re-run `wmcheck calibrate`)."""
    real = cal.real
    if cal.real_controls is None or real.z_steps.ndim != 3:
        return None
    names = list(channels.get("action_names", [])) + list(channels.get("input_names", []))
    A = len(channels.get("action_names", []))

    def physical(ctrl):  # (n, H, A + E) normalised -> physical units
        return np.concatenate([norm.denorm_action(ctrl[..., :A]), norm.denorm_input(ctrl[..., A:])], -1)

    std = norm.std["obs"]
    units = {**channels.get("units", {}), **(meta.units or {})}
    train_range = None
    if norm.range["action"] is not None and (norm.dim("input") == 0 or norm.range["input"] is not None):
        parts = [norm.range["action"]] + ([norm.range["input"]] if norm.dim("input") else [])
        train_range = np.stack([np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])], 1)  # (K, 2)
    return find_regimes(sc.z_steps, sc.err_steps * std, physical(block_controls(blocks)), competent,
                        real.z_steps, real.err_steps * std, physical(cal.real_controls), names,
                        list(channels.get("observation_names", [])), units, alpha, seed=seed, training_range=train_range,
                        checked_episode=blocks.episode, real_episode=cal.real_episode)


def _plot_data(sc, blocks, comp_idx, norm, channels, cfg) -> dict:
    """Worst blocks' overlays (raw units) for the HTML report; not part of the JSON schema."""
    order = np.argsort(-sc.divergence)
    worst = [int(i) for i in order[:3]]
    mean, std = norm.mean["obs"], norm.std["obs"]
    out = []
    for b in worst:
        out.append({"episode": int(blocks.episode[b]), "start": int(blocks.start[b]), "context": cfg.context,
                    "truth": (blocks.batch.obs[b] * std + mean).tolist(),
                    "pred": (sc.pred_mean[b] * std + mean).tolist(), "lo": (sc.pred_lo[b] * std + mean).tolist(),
                    "hi": (sc.pred_hi[b] * std + mean).tolist()})
    return {"worst_blocks": out, "names": channels.get("observation_names", [])}


def _r(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(f"{x:.4g}")


def _rl(a) -> list:
    return [float(f"{v:.4g}") for v in np.asarray(a, float).ravel()]


def _version() -> str:
    from wmcheck.scripts.cli import version

    return version()
