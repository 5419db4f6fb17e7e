"""The closed-loop policy check: the policy in the simulator vs the same policy inside the world model.

Owns the report's `policy` section and the policy gate. Given the policy's simulator episodes (with
each episode's success, `datasets.record.Outcome`) and the model's closed-loop rollouts from the same
initial conditions (`policy_rollout.closed_loop`), it computes:

  returns       per episode, the simulator's return vs the mean of the model's S rollouts' returns
                (paired, same initial conditions); mean difference with a bootstrap interval over
                episodes; the model's resolution (the reward head's mean absolute error per step on
                held-out real data, from calibration, times the closed-loop steps): a two-sided
                sign-flip test of whether the difference exceeds it; the share of episodes whose
                simulator return falls inside the model rollouts' range ((S-1)/(S+1) expected when the
                simulator behaves like the model's reality)
  visitation    the states the policy visits in the simulator vs inside the model (block MMD test with
                episodes as blocks, per-channel quantiles)
  coverage      the share of the policy's simulator steps inside the real logs' support (the check's
                latent distance within the 99% range of held-out real steps), overall and on successes
  exploitation  does the policy's success rely on the simulator being kinder than reality? One-sided
                sign-flip test that simulator returns exceed the model's by more than its resolution
                (at the gate's alpha); the
                high-return episodes (successful ones, else the upper half of returns) whose simulator
                return lies above every model rollout and beyond the resolution, with the step where the two trajectories split
                (the closed-loop standardised error first above the calibrated per-horizon 1 - alpha
                quantile of real blocks' open-loop error) and the states there; and the share of
                high-return episodes that pass through blocks the check flags
  gate          policy.min_episodes, policy.min_success_rate (defaults 1000 / 0.85, field practice
                before hardware time) and the exploitation flag (`policy_gate`): a low success rate
                or the flag fails the check; success is "not evaluated" where no success signal
                exists; the episode minimum warns with the power the episodes buy, and fails only
                where the team's gate file sets it.
The exploitation test is one more test at alpha on top of the check's own budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wmcheck.checks.config import POLICY_GATE_DEFAULTS
from wmcheck.checks.policy_rollout import ClosedLoop, ClosedLoopConfig, closed_loop
from wmcheck.checks.stats import block_mmd_test, percentile_interval, sign_flip_test
from wmcheck.datasets.episode import Episode
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.record import (
    Outcome,
    SpaceCodec,
    env_name,
    episode_outcome,
    make_policy,
    make_success,
    opened_env,
)

EXCITATION_POLICIES = ("random",)  # and "hold:K": recording signals, not policies to ship


def is_policy(spec) -> bool:
    """True for a policy to check closed loop (a Python callable or SB3-like model, module:callable,
    an SB3 .zip or a TorchScript file); False for the recorder's excitation signals (random, hold:K)."""
    if not isinstance(spec, str):
        return spec is not None
    return spec not in EXCITATION_POLICIES and not spec.startswith("hold:")


@dataclass
class PolicyRun:
    """What `wmcheck check --env ID --policy P` recorded, enough to run the same policy in the model."""

    env_id: str | Any
    """A gymnasium id, "module:Class", or an `Env` instance (the caller's: never closed here)."""
    policy: str | Callable | Any
    env_kwargs: dict | None = None
    success: str | Callable | None = None
    """The success rule used while recording (None: the env's info)."""
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    """Episode id -> success, as the recorder saw it."""
    samples: int = 8
    """Model rollouts per simulator episode."""


@dataclass
class EpisodeBlocks:
    """What the block check found on each policy episode (from `run_check`)."""

    flagged: dict[int, bool]  # episode id -> passes through a competent block the check flags
    coverage: dict[int, float]  # episode id -> share of its checked steps inside the real support
    support_steps: dict[int, int]  # episode id -> number of checked steps


def policy_section(
    model,
    norm: Normalizer,
    episodes: list[Episode],
    run: PolicyRun,
    blocks: EpisodeBlocks,
    gate_policy: dict,
    alpha: float,
    div_q: np.ndarray,
    context: int,
    dt: float | None,
    obs_names: list[str],
    calibration_info: dict,
    rng: np.random.Generator,
    seed: int = 0,
) -> dict:
    """The report's `policy` section (module docstring); `_plots` holds figure data for the HTML.
    `calibration_info` gives the reward head's error per step on held-out real data (`calibrate`)."""
    if "reward_abs_error_per_step" not in calibration_info:
        raise UserError(
            "this calibration predates policy checks (no reward resolution)", "re-run `wmcheck calibrate RUNDIR`"
        )
    resolution = float(calibration_info["reward_abs_error_per_step"])
    rewarded = (
        float(calibration_info.get("reward_std_real", 0.0)) > 0
    )  # real logs without rewards: no returns to compare
    recorded = episodes
    episodes = [e for e in recorded if e.num_steps > context]  # the model observes `context` rows first
    if not episodes:
        raise UserError(
            f"no policy episode is longer than the model's context ({context} steps)",
            f"record episodes of more than {context} steps (--max-steps)",
        )
    with opened_env(run.env_id, run.env_kwargs) as env:
        codec = SpaceCodec.for_env(env)
        policy = make_policy(run.policy, env)
        cl = closed_loop(
            model, norm, episodes, policy, codec, env, context, ClosedLoopConfig(samples=run.samples, seed=seed)
        )
    ids = [int(e.id) for e in episodes]
    n, S = len(episodes), run.samples
    sim_ret = np.array([float(e.reward_array().sum()) for e in episodes])  # (n,)
    model_rets = cl.returns()  # (n, S)
    model_ret = model_rets.mean(1)  # (n,)
    diff = sim_ret - model_ret
    success, model_success = _success(recorded, episodes, run, cl)
    by_id = dict(zip([int(e.id) for e in recorded], success["per_episode"]))
    high = (
        np.array([bool(by_id[i]) for i in ids])
        if success["simulator_rate"] is not None
        else sim_ret >= np.median(sim_ret)
    )

    # ---- returns: paired per episode, beyond the model's resolution
    # A difference of returns within the reward head's error on real data (per closed-loop step) is
    # below what the model can tell apart; the tests ask whether the difference exceeds it.
    margin = resolution * (cl.lengths - context + 1)  # (n,) closed-loop steps of each episode
    boot = rng.integers(0, n, size=(1000, n))
    ci = percentile_interval(diff[boot].mean(1), 0.9) if n > 1 else (float(diff[0]), float(diff[0]))
    p_greater = sign_flip_test(diff - margin, rng) if rewarded else 1.0
    p_less = sign_flip_test(-diff - margin, rng) if rewarded else 1.0
    p_two = min(1.0, 2 * min(p_greater, p_less))
    inside = (sim_ret >= model_rets.min(1)) & (sim_ret <= model_rets.max(1))
    returns = {
        "simulator": _quantiles(sim_ret),
        "model": _quantiles(model_rets.ravel()),
        "paired_difference_mean": _r(diff.mean()),
        "paired_difference_ci": [_r(ci[0]), _r(ci[1])],
        "model_resolution": _r(margin.mean()),
        "p_value": _r(p_two),
        "differs": bool(p_two < alpha),
        "inside_model_range": _r(inside.mean()),
        "inside_model_range_expected": _r((S - 1) / (S + 1)),
        "compared": rewarded,
    }

    # ---- state visitation: simulator vs model closed loop, rows context..N of each episode
    vis = _visitation(episodes, cl, norm, obs_names, rng)
    vis["differs"] = bool(vis["p_value"] < alpha)

    # ---- coverage of the policy's simulator states by the real logs
    steps = np.array([blocks.support_steps.get(i, 0) for i in ids], float)
    cov = np.array([blocks.coverage.get(i, np.nan) for i in ids], float)
    known = steps > 0
    coverage = {
        "fraction_in_support": _r(float((cov[known] * steps[known]).sum() / steps[known].sum()))
        if known.any()
        else None,
        "successful_fraction_in_support": (
            _r(float((cov[known & high] * steps[known & high]).sum() / steps[known & high].sum()))
            if (known & high).any()
            else None
        ),
        "episodes_checked": int(known.sum()),
    }

    # ---- exploitation
    flagged = np.array([blocks.flagged.get(i, False) for i in ids])
    exploited = high & (sim_ret > model_rets.max(1)) & (diff > margin)  # beyond every rollout and the resolution
    order = np.flatnonzero(exploited)[np.argsort(-diff[exploited])]
    listed = [
        _split(episodes[i], cl, i, norm, div_q, dt, obs_names)
        | {
            "id": ids[i],
            "simulator_return": _r(sim_ret[i]),
            "model_return": _r(model_ret[i]),
            "model_return_range": [_r(model_rets[i].min()), _r(model_rets[i].max())],
            "through_flagged_block": bool(flagged[i]),
        }
        for i in order[:20]
    ]
    flag = bool(p_greater < alpha)
    exploitation = {
        "flag": flag,
        "p_value": _r(p_greater),
        "high_return_episodes": int(high.sum()),
        "high_return_definition": "successful" if success["simulator_rate"] is not None else "return >= median",
        "above_model_range": int(exploited.sum()),
        "through_flagged_fraction_high": _r(flagged[high].mean()) if high.any() else None,
        "through_flagged_fraction_other": _r(flagged[~high].mean()) if (~high).any() else None,
        "episodes": listed,
        "explanation": (
            ("the real logs carry no rewards: returns cannot be compared; " if not rewarded else "")
            + f"simulator returns exceed the model's closed-loop returns from the same initial conditions by "
            f"{diff.mean():.3g} on average (90% interval [{ci[0]:.3g}, {ci[1]:.3g}]; the model resolves {margin.mean():.3g}, "
            f"one-sided sign-flip p = {p_greater:.3g} that the excess is beyond it); "
            f"{int(exploited.sum())} of {int(high.sum())} high-return episodes score above every model rollout by more than the resolution; "
            f"{int(flagged[high].sum())} of the {int(high.sum())} high-return episodes pass through blocks the check flags"
        ),
    }

    # ---- gate
    gate = policy_gate(
        gate_policy, len(recorded), success, flag, gate_power(diff, margin, alpha, success, len(recorded))
    )
    return {
        "policy": run.policy if isinstance(run.policy, str) else getattr(run.policy, "__name__", repr(run.policy)),
        "env": env_name(run.env_id),
        "episodes": len(recorded),
        "closed_loop_episodes": n,
        "closed_loop_samples": S,
        "context_steps": context,
        "success": {k: v for k, v in success.items() if k != "per_episode"} | {"model_rate": model_success},
        "returns": returns,
        "visitation": vis,
        "coverage": coverage,
        "exploitation": exploitation,
        "gate": gate,
        "_plots": {
            "simulator_return": sim_ret.tolist(),
            "model_return": model_ret.tolist(),
            "model_return_lo": model_rets.min(1).tolist(),
            "model_return_hi": model_rets.max(1).tolist(),
            "high": high.tolist(),
        },
    }


def _success(
    recorded: list[Episode], episodes: list[Episode], run: PolicyRun, cl: ClosedLoop
) -> tuple[dict, float | None]:
    """Simulator success over every recorded episode; the model's over its rollouts of `episodes`."""
    per = [run.outcomes.get(int(e.id), Outcome(None, None)) for e in recorded]
    known = [o.success for o in per if o.success is not None]
    sources = sorted({o.source for o in per if o.source})
    rate = float(np.mean(known)) if known and len(known) == len(per) else None
    out = {
        "source": ", ".join(sources) or None,
        "simulator_rate": _r(rate),
        "successes": int(sum(known)),
        "known": len(known),
        "per_episode": [o.success for o in per],
    }
    # The same rule on the model's rollouts (a rule that needs the env's info cannot judge them).
    model_rate = None
    fn = make_success(run.success) if run.success is not None else None
    if fn is not None and rate is not None:
        hits = []
        try:
            for i, e in enumerate(episodes):
                N = e.num_steps
                for s in range(cl.obs.shape[1]):
                    img = Episode(
                        cl.obs[i, s, : N + 1], cl.actions[i, s, :N], rewards=cl.rewards[i, s, :N], id=e.id, seed=e.seed
                    )
                    hits.append(bool(episode_outcome(img, {}, fn).success))
            model_rate = _r(float(np.mean(hits)))
        except UserError:
            model_rate = None
    return out, model_rate


def _visitation(episodes, cl: ClosedLoop, norm: Normalizer, names: list[str], rng, k: int = 8) -> dict:
    C = cl.context
    sim_blocks, model_blocks, sim_all, model_all = [], [], [], []
    for i, e in enumerate(episodes):
        rows = np.linspace(C, e.num_steps, k).round().astype(int)
        sim_blocks.append(norm.norm_obs(e.observations[rows]).astype(np.float32))  # (k, D)
        model_blocks.append(norm.norm_obs(cl.obs[i, 0, rows]).astype(np.float32))  # (k, D) one rollout per episode
        sim_all.append(e.observations[C:])
        model_all.append(cl.obs[i, :, C : e.num_steps + 1].reshape(-1, cl.obs.shape[-1]))
    mmd, p = block_mmd_test(sim_blocks, model_blocks, rng)
    sim_all, model_all = np.concatenate(sim_all), np.concatenate(model_all)
    per_channel = []
    for d, name in enumerate(names):
        sq = np.quantile(sim_all[:, d], [0.05, 0.5, 0.95])
        mq = np.quantile(model_all[:, d], [0.05, 0.5, 0.95])
        lo, hi = np.quantile(model_all[:, d], [0.01, 0.99])
        per_channel.append(
            {
                "name": name,
                "simulator_q05_q50_q95": [_r(v) for v in sq],
                "model_q05_q50_q95": [_r(v) for v in mq],
                "simulator_inside_model_q01_q99": _r(float(((sim_all[:, d] >= lo) & (sim_all[:, d] <= hi)).mean())),
            }
        )
    return {"mmd2": _r(mmd), "p_value": _r(p), "per_channel": per_channel}


def _split(ep: Episode, cl: ClosedLoop, i: int, norm: Normalizer, div_q: np.ndarray, dt, names) -> dict:
    """Where the simulator trajectory leaves the model's closed-loop rollouts: the first row whose
    standardised error (mean over channels of z^2, z against the rollouts' mean and spread) exceeds the
    calibrated per-horizon quantile of real blocks' open-loop error."""
    C, N = cl.context, ep.num_steps
    sim = norm.norm_obs(ep.observations[C : N + 1])  # (L, D)
    model = norm.norm_obs(cl.obs[i, :, C : N + 1])  # (S, L, D)
    z2 = ((sim - model.mean(0)) / np.maximum(model.std(0), 1e-3)) ** 2  # (L, D)
    thr = div_q[np.minimum(np.arange(len(sim)), len(div_q) - 1)]  # (L,)
    over = np.flatnonzero(z2.mean(1) > thr)
    if not len(over):
        return {"split_step": None, "split_seconds": None, "simulator_state": None, "model_state": None}
    t = int(over[0])
    row = C + t
    mean_raw = cl.obs[i, :, row].mean(0)
    return {
        "split_step": row,
        "split_seconds": (row * dt if dt else None),
        "simulator_state": {n: _r(v) for n, v in zip(names, ep.observations[row])},
        "model_state": {n: _r(v) for n, v in zip(names, mean_raw)},
    }


def policy_gate(gate_policy: dict, n: int, success: dict, exploit_flag: bool, power: dict | None = None) -> dict:
    """The policy gate (module docstring): `n` simulator episodes and the success rate
    (`success["simulator_rate"]`, None if unknown) against the requirements, and the exploitation flag.

    `gate_policy` holds the keys the team's gate file sets; they are binding. Keys it leaves out take
    POLICY_GATE_DEFAULTS (field practice) with these rules:
      - the success rate's default applies where success is defined; with no success signal it is
        "not evaluated" and does not fail (a success rate the gate file sets fails when unknown);
      - the episode minimum's default is a warning that states what the recorded episodes can
        resolve (`power`, from `gate_power`), not a failure.
    """
    binding = set(gate_policy or {})
    req = {**POLICY_GATE_DEFAULTS, **(gate_policy or {})}
    min_eps, min_rate = int(req["min_episodes"]), float(req["min_success_rate"])
    rate = success["simulator_rate"]
    reasons, warnings_ = [], []
    if n < min_eps:
        text = f"{n} simulator episodes; " + (
            f"the gate file requires at least {min_eps} across the task distribution (record them: --episodes {min_eps})"
            if "min_episodes" in binding
            else f"field practice is at least {min_eps} across the task distribution"
        )
        if power and "min_episodes" not in binding:
            text += ": " + power["text"] + "; set policy.min_episodes in the gate file to make the minimum binding"
        (reasons if "min_episodes" in binding else warnings_).append(text)
    if rate is None and "min_success_rate" in binding and min_rate > 0:
        reasons.append(
            f"the simulator success rate is unknown ({success['known']} of {n} episodes report success); the gate "
            f"file requires at least {min_rate:.0%}: pass --success module:callable, or use an env whose info has "
            "'is_success'"
        )
    elif rate is not None and rate < min_rate:
        reasons.append(
            f"simulator success rate {rate:.1%} ({success['successes']} of {n}); the gate requires at least {min_rate:.0%}"
        )
    if exploit_flag:
        reasons.append(
            "the policy's simulator returns significantly exceed what the model of reality gives it from the "
            "same initial conditions: its success relies on the simulator"
        )
    evaluated = rate is not None or "min_success_rate" in binding
    return {
        "min_episodes": min_eps,
        "min_success_rate": min_rate,
        "binding": sorted(binding),
        "episodes": n,
        "success_rate": rate,
        "success_evaluated": evaluated,
        "passed": not reasons,
        "reasons": reasons,
        "warnings": warnings_,
        "power": power,
    }


def gate_power(diff: np.ndarray, margin: np.ndarray, alpha: float, success: dict, n: int) -> dict:
    """What `n` recorded episodes can resolve, from this check's own data: the smallest mean excess of
    simulator over model returns, beyond the model's resolution, that the one-sided exploitation test
    finds with 80 % power at `alpha` (normal approximation, the spread of the paired differences), and
    the half-width of the success rate's 95 % Wilson interval."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    m = len(diff)
    sd = float(np.std(diff - margin, ddof=1)) if m > 1 else float("nan")
    mde = (z(1 - alpha) + z(0.8)) * sd / math.sqrt(m) if m > 1 else None
    rate, half = success["simulator_rate"], None
    if rate is not None and n > 0:
        k = success["known"] or n
        q = z(0.975)
        half = q * math.sqrt(rate * (1 - rate) / k + q * q / (4 * k * k)) / (1 + q * q / k)
    parts = []
    if mde is not None and math.isfinite(mde):
        parts.append(
            f"a return excess smaller than {mde:.3g} per episode (80% power at alpha {alpha:g}, {m} paired episodes) "
            "would go unseen"
        )
    if half is not None:
        parts.append(f"the success rate is known to +-{half:.1%} (95% interval)")
    return {
        "min_detectable_return_excess": _r(mde),
        "success_rate_halfwidth": _r(half),
        "text": " and ".join(parts) if parts else "the recorded episodes give no measure of power",
    }


def _quantiles(x: np.ndarray) -> dict:
    q = np.quantile(x, [0.05, 0.5, 0.95])
    return {"mean": _r(float(np.mean(x))), "q05": _r(q[0]), "q50": _r(q[1]), "q95": _r(q[2])}


def _r(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else float(f"{x:.4g}")
