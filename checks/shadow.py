"""`wmcheck shadow`: what would the candidate policy have done where the baseline controller acted?

A shadow log is a real log in which a baseline controller acts (`actions`) while the candidate
policy's proposal at every observation is logged beside it (`proposed_actions`; record one with
`wmcheck record ENV --policy BASELINE --shadow CANDIDATE`). Owns `shadow_report`:
  1. starts: every `stride` steps of every episode from row `context` on, while `horizon` steps
     remain; at each, the model observes the `context` logged rows before it;
  2. two imagined branches from the same latent state, with the same latent draws (common random
     numbers), `samples` rollouts each: under the logged baseline commands, and under the logged
     proposals, open loop for `horizon` steps (the proposals were made on the baseline's states,
     so the branch is "follow the proposals from this state", not a closed loop);
  3. per start: the predicted return of each branch (the reward head, or with `objective` the sum
     of one observation channel: energy for a turbine whose log has no rewards), their difference,
     the logged return (the baseline branch against it is the model's own resolution on this log),
     the predicted observations averaged over the horizon, and whether the proposal branch leaves the
     model's competence (median latent distance to the training latents above the held-out real
     steps' bound, as a check decides competence for a block);
  4. the predicted return difference per horizon window: per episode the mean over its competent
     starts, then the mean over episodes with a 95 % t interval (episodes as units).
Verdict: `worse` (the interval below 0: exit 1), `better` or `no difference` (exit 0), and
`unverifiable` (exit 3) when most proposal branches leave the model's competence or fewer than two
episodes have a competent start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.calibration import Calibration, load_calibrated
from wmcheck.checks.model_log import read_log_for_model
from wmcheck.checks.scoring import support_distance
from wmcheck.checks.stats import t_critical
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.version import version
from wmcheck.datasets.windows import Batch, episode_steps
from wmcheck.training.checkpoint import file_sha256
from wmcheck.worldmodel.rssm import State

EXIT = {"better": 0, "no difference": 0, "worse": 1, "unverifiable": 3}


@dataclass
class ShadowConfig:
    horizon: int = 8  # open loop under logged proposals drifts from what following them would do (see docs)
    stride: int | None = None  # None: the horizon (non-overlapping windows)
    samples: int = 8
    chunk: int = 64
    seed: int = 0
    objective: str | None = None  # None: the reward head; "CH" / "-CH": the sum of observation channel CH (or minus it)


@dataclass
class Starts:
    """Per start (n,): episode id, first imagined row, and the branches' outcomes."""

    episode: np.ndarray  # (n,)
    row: np.ndarray  # (n,)
    ret_base: np.ndarray  # (n,) predicted return under the logged baseline commands (mean over samples)
    ret_prop: np.ndarray  # (n,) predicted return under the proposals
    ret_logged: np.ndarray  # (n,) the logged return of the same steps
    mean_base: np.ndarray  # (n, D) predicted observations averaged over the horizon, raw units
    mean_prop: np.ndarray  # (n, D)
    leaves: np.ndarray  # (n,) bool: the proposal branch leaves the model's competence
    base_leaves: np.ndarray  # (n,) bool: the baseline branch does (the model is not competent on the log)


def _windows(steps, starts: list[int], C: int, H: int, proposed_norm: np.ndarray):
    """Context Batch (k, C) and the branches' controls (k, H, A) / inputs (k, H, E) for starts in one episode."""
    ctx = Batch(
        *(
            np.stack([getattr(steps, f)[s - C : s] for s in starts])
            for f in ("obs", "prev_action", "prev_input", "reward", "is_first", "is_last", "is_terminal")
        )
    ).start_from_initial_state()
    base = np.stack([steps.prev_action[s : s + H] for s in starts])  # rows s..s+H-1: a_{s-1}..a_{s+H-2}
    prop = np.stack([proposed_norm[s - 1 : s + H - 1] for s in starts])  # proposals at the same observations
    inp = np.stack([steps.prev_input[s : s + H] for s in starts])
    return ctx, base.astype(np.float32), prop.astype(np.float32), inp.astype(np.float32)


@torch.inference_mode()
def _branch(model, state: State, ctrl: np.ndarray, inp: np.ndarray, S: int, seed: int):
    """S sampled rollouts per start: rewards (k, S, H), decoded means (k, S, H, D), deter (k, S, H, deter)."""
    k = ctrl.shape[0]

    def rep(x):  # (k, ...) -> (k * S, ...), start-major
        return x.repeat_interleave(S, 0)

    torch.manual_seed(seed)
    st = State(rep(state.deter), rep(state.stoch))
    states = model.imagine(st, rep(torch.as_tensor(ctrl)), rep(torch.as_tensor(inp)), sample=True)
    feat = states.feat()
    reward = model.twohot.mean(model.reward(feat)).float().reshape(k, S, -1)
    mean, _ = model.decode(states)
    obs = model.to_obs(mean).float().reshape(k, S, *mean.shape[1:])
    deter = states.deter.float().reshape(k, S, *states.deter.shape[1:])
    return reward.numpy(), obs.numpy(), deter.numpy()


def objective_channel(objective: str | None, names: list[str]) -> tuple[int, float] | None:
    """(channel index, sign) of an observation-channel objective, or None for the reward head."""
    if objective is None:
        return None
    sign, name = (-1.0, objective[1:]) if objective.startswith("-") else (1.0, objective)
    if name not in names:
        raise UserError(
            f"--objective {objective!r}: no observation channel {name!r}", f"one of {names}, or '-NAME' to minimise"
        )
    return names.index(name), sign


def shadow_starts(
    bundle, cal: Calibration, norm: Normalizer, episodes: list, cfg: ShadowConfig
) -> tuple[Starts, int, int]:
    model = bundle.model.eval()
    goal = objective_channel(cfg.objective, list(bundle.channels.get("observation_names", [])))
    C = cal.config.context
    H = int(cfg.horizon)
    stride = int(cfg.stride or H)
    bound = cal.support_bound(cal.config.competence_alpha)
    out: dict[str, list] = {f: [] for f in Starts.__dataclass_fields__}
    for e in episodes:
        rows = list(range(C, e.num_steps - H + 2, stride))  # imagined rows s..s+H-1 need actions up to s+H-2
        if not rows:
            continue
        steps = episode_steps(e, norm)
        proposed = norm.norm_action(e.proposed_actions).astype(np.float32)  # (N, A)
        rewards = e.reward_array()
        for c0 in range(0, len(rows), cfg.chunk):
            chunk = rows[c0 : c0 + cfg.chunk]
            ctx, base, prop, inp = _windows(steps, chunk, C, H, proposed)
            with torch.inference_mode():
                _, last = model.observe(ctx.to_torch(), sample=False)
            seed = cfg.seed + 7919 * int(e.id) + c0
            rb, ob, db = _branch(model, last, base, inp, cfg.samples, seed)
            rp, op, dp = _branch(model, last, prop, inp, cfg.samples, seed)
            out["episode"] += [int(e.id)] * len(chunk)
            out["row"] += chunk
            raw_b, raw_p = norm.denorm_obs(ob), norm.denorm_obs(op)  # (k, S, H, D) physical units
            if goal is None:
                out["ret_base"].append(rb.sum(2).mean(1))
                out["ret_prop"].append(rp.sum(2).mean(1))
                out["ret_logged"].append(np.array([rewards[s - 1 : s + H - 1].sum() for s in chunk]))
            else:
                d, sign = goal
                out["ret_base"].append(sign * raw_b[..., d].sum(2).mean(1))
                out["ret_prop"].append(sign * raw_p[..., d].sum(2).mean(1))
                out["ret_logged"].append(np.array([sign * e.observations[s : s + H, d].sum() for s in chunk]))
            out["mean_base"].append(raw_b.mean((1, 2)))
            out["mean_prop"].append(raw_p.mean((1, 2)))
            for key, d in (("leaves", dp), ("base_leaves", db)):
                k, S, Hh, F = d.shape
                dist = support_distance(d.reshape(-1, F), cal.support_ref, cal.support_scale).reshape(k, S, Hh)
                out[key].append(np.median(dist.mean(1), axis=1) > bound)
    if not out["row"]:
        raise UserError(
            f"no episode of the shadow log has the {C + H - 1} steps a start needs (context {C} + horizon {H})",
            "log longer episodes, or give a shorter --horizon",
        )
    arrays = {k: np.asarray(v) if k in ("episode", "row") else np.concatenate(v) for k, v in out.items()}
    return Starts(**arrays), H, stride


def _episode_interval(diff: np.ndarray, episode: np.ndarray, keep: np.ndarray) -> tuple[float, list | None, int]:
    """Mean over episodes of each episode's mean difference over its kept starts, and its 95 % t interval."""
    per = np.array([diff[(episode == e) & keep].mean() for e in np.unique(episode[keep])])
    if len(per) < 2:
        return (float(per.mean()) if len(per) else float("nan")), None, len(per)
    half = t_critical(0.025, len(per) - 1) * per.std(ddof=1) / math.sqrt(len(per))
    return float(per.mean()), [float(per.mean() - half), float(per.mean() + half)], len(per)


def shadow_report(
    run_dir: str | Path, log: str | Path, cfg: ShadowConfig | None = None, command: str | None = None
) -> dict:
    cfg = cfg or ShadowConfig()
    run_dir, log = Path(run_dir), Path(log)
    bundle, cal = load_calibrated(run_dir, one_model_for="`wmcheck shadow`")
    if bundle.model.cfg.image_keys:
        raise UserError(
            f"{run_dir}: shadow mode does not take camera models yet (the model reads {list(bundle.model.cfg.image_keys)})",
            "train the model with --no-images for shadow runs",
        )
    norm = Normalizer.from_dict(bundle.normalizer)
    _meta, episodes = read_log_for_model(log, bundle.channels, role="shadow log")
    without = [e.id for e in episodes if e.proposed_actions is None]
    if without:
        raise UserError(
            f"{log}: {len(without)} episode(s) have no proposed_actions (e.g. episode {without[0]})",
            "record the shadow run with `wmcheck record ENV --policy BASELINE --shadow CANDIDATE`, "
            "or write Episode(proposed_actions=...)",
        )
    st, H, stride = shadow_starts(bundle, cal, norm, episodes, cfg)
    diff = st.ret_prop - st.ret_base
    keep = ~st.leaves & ~st.base_leaves
    mean, ci, n_eps = _episode_interval(diff, st.episode, keep)
    resolution = float(np.mean(np.abs(st.ret_base - st.ret_logged)))
    share_out = float(st.leaves.mean())
    if share_out > 0.5 or ci is None:
        verdict = "unverifiable"
    elif ci[1] < 0:
        verdict = "worse"
    elif ci[0] > 0:
        verdict = "better"
    else:
        verdict = "no difference"
    names = list(bundle.channels.get("observation_names", []))
    units = dict(bundle.channels.get("units", {}))
    end_diff = (st.mean_prop - st.mean_base)[keep] if keep.any() else np.zeros((0, st.mean_base.shape[1]))
    channels = [
        {
            "name": n,
            "unit": units.get(n),
            "mean_difference": float(end_diff[:, d].mean()) if len(end_diff) else None,
            "mean_abs_difference": float(np.abs(end_diff[:, d]).mean()) if len(end_diff) else None,
        }
        for d, n in enumerate(names)
    ]
    leave_at = [{"episode": int(e), "row": int(r)} for e, r in zip(st.episode[st.leaves], st.row[st.leaves])][:20]
    dt = bundle.channels.get("dt")
    window = f"{H} steps" + (f" ({H * dt:g} s)" if dt else "")
    return {
        "shadow_version": 1,
        "verdict": verdict,
        "exit_code": EXIT[verdict],
        "message": _message(verdict, mean, ci, n_eps, share_out, resolution, window),
        "horizon": H,
        "stride": stride,
        "samples": cfg.samples,
        "episodes": len({int(e) for e in st.episode}),
        "starts": int(len(st.row)),
        "competent_starts": int(keep.sum()),
        "return_difference": {
            "per": f"{window} window",
            "mean": mean,
            "ci95": ci,
            "episodes": n_eps,
            "model_resolution": resolution,
            "within_resolution": bool(ci is not None and max(abs(ci[0]), abs(ci[1])) <= resolution),
        },
        "competence": {
            "proposals_leave": share_out,
            "baseline_leaves": float(st.base_leaves.mean()),
            "first_departures": leave_at,
        },
        "objective": cfg.objective or "reward",
        "over_the_horizon": channels,
        "per_start": {
            "episode": st.episode.tolist(),
            "row": st.row.tolist(),
            "difference": [float(x) for x in diff],
            "leaves": st.leaves.tolist(),
        },
        "provenance": {
            "wmcheck_version": version(),
            "command": command,
            "model_sha256": bundle.file_hash,
            "log": str(log),
            "log_sha256": file_sha256(log),
        },
    }


def _message(verdict, mean, ci, n_eps, share_out, resolution, window) -> str:
    out = f"{share_out:.0%} of the proposal branches leave the model's competence"
    if verdict == "unverifiable":
        why = (
            "most proposals take the system where the model cannot judge"
            if share_out > 0.5
            else (f"only {n_eps} episode(s) have a start the model can judge (an interval needs 2)")
        )
        return f"Unverifiable: {why}; {out}."
    words = {"better": "better than", "worse": "worse than", "no difference": "no different from"}[verdict]
    small = (
        " The whole interval is smaller than that error: the branches share the model's bias, so the sign "
        "can hold, but the size is below what this model resolves."
        if verdict != "no difference" and max(abs(ci[0]), abs(ci[1])) <= resolution
        else ""
    )
    return (
        f"Following the proposals is predicted {words} the baseline: return {mean:+.3g} per {window} "
        f"(95 % CI {ci[0]:+.3g} to {ci[1]:+.3g}, {n_eps} episodes; the model's own error on the logged "
        f"return is {resolution:.3g} per window); {out}.{small}"
    )
