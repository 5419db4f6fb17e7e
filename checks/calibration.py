"""Calibration on held-out real episodes: the null distributions every check compares against.

Owns `calibrate(run_dir, log)` and the files it writes next to the model:
  RUNDIR/calibration.json   config, provenance, power table (small, human-readable)
  RUNDIR/calibration.npz    arrays: real block scores, attribution search matrices on real
                            blocks, the training-latent support reference, injected-gap scores
Held-out = the validation episodes of the model's own split (never trained on). Every statistic
is per block of consecutive steps, so checks can resample blocks (autocorrelation respected).

Reward resolution: the reward head's mean absolute error per step on the held-out blocks (for
policy checks' return comparisons).

Power: the held-out episodes are split in two halves by episode; gaps of graded size are injected
into half B (actions delayed, commands scaled, observation noise and bias added) and tested against
half A with the tests a check runs (the pooled divergence test, the residual tests, and the injected
gap's own search; see `power_table`); the smallest size detected with probability >= power_target
is what a pass is worth.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.attribution import SearchMatrices, allowed_corrections, search_matrices
from wmcheck.checks.blocks import block_controls, block_states, make_blocks
from wmcheck.checks.config import SCORES, CheckConfig, split_alpha
from wmcheck.checks.scoring import BlockScores, latent_features, score_blocks
from wmcheck.checks.stats import episode_t_greater, mann_whitney_greater
from wmcheck.checks.transforms import actuator, observation_noise, shift_actions
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import split_episodes
from wmcheck.scripts.atomic import atomic_path, write_text_atomic
from wmcheck.scripts.errors import UserError
from wmcheck.training.checkpoint import ModelBundle, file_sha256, load_model

CALIBRATION_VERSION = 3  # 2: per-step errors and controls (regimes); 3: episode of every block (clustered tests)
POWER_SIZES = {
    "latency": (1, 2, 3, 4),  # steps the commands are delayed by
    "actuator": (1.1, 1.25, 1.5, 2.0),  # gain on every command channel
    "sensor_noise": (0.05, 0.1, 0.25, 0.5),  # Gaussian noise, x each channel's training std
    "sensor_bias": (0.1, 0.25, 0.5, 1.0),  # bias, x each channel's training std
}
POWER_UNITS = {"latency": "steps", "actuator": "gain", "sensor_noise": "x channel std", "sensor_bias": "x channel std"}


@dataclass
class Calibration:
    config: CheckConfig
    info: dict  # provenance and sizes
    real: BlockScores
    real_search: SearchMatrices
    real_states: np.ndarray  # (n, k, D + A + E) states visited by the held-out blocks (distribution test)
    support_ref: np.ndarray  # (M, deter)
    support_scale: float
    power: dict  # gap -> {"sizes", "units", "scores": {size: {score: (nB,)}}, "null": {score: (nA,)}}
    real_controls: np.ndarray | None = None  # (n, H, A + E) operating conditions of the held-out steps (regimes)
    real_episode: np.ndarray | None = None  # (n,) held-out episode id of every real block (the clusters)

    def save(self, run_dir: Path) -> None:
        arrays = {**self.real.to_arrays("real_"), **self.real_search.to_arrays("realJ_"),
                  "support_ref": self.support_ref.astype(np.float32), "real_states": self.real_states}
        if self.real_controls is not None:
            arrays["real_controls"] = self.real_controls
        if self.real_episode is not None:
            arrays["real_episode"] = self.real_episode
        for key in ("null_episode", "control_episode"):
            if self.power.get(key) is not None:
                arrays[f"powerep_{key}"] = self.power[key]
        for part in ("null", "control"):
            for key, arr in (self.power.get(part) or {}).items():
                arrays[f"power_{part}_{key}"] = arr
        for gap, entry in self.power["gaps"].items():
            for i, size in enumerate(entry["sizes"]):
                for key, arr in entry["scores"][i].items():
                    arrays[f"power_{gap}_{i}_{key}"] = arr
        with atomic_path(run_dir / "calibration.npz", suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)
        meta = {"calibration_version": CALIBRATION_VERSION, "config": self.config.to_dict(), "info": self.info,
                "support_scale": self.support_scale,
                "power": {gap: {"sizes": list(e["sizes"]), "units": e["units"]} for gap, e in self.power["gaps"].items()}}
        write_text_atomic(run_dir / "calibration.json", json.dumps(meta, indent=2, sort_keys=True))

    @classmethod
    def load(cls, run_dir: str | Path) -> "Calibration":
        run_dir = Path(run_dir)
        jpath, npath = run_dir / "calibration.json", run_dir / "calibration.npz"
        if not jpath.exists() or not npath.exists():
            raise UserError(f"{run_dir} has no calibration", f"run `wmcheck calibrate {run_dir}` (train does it at the end)")
        meta = json.loads(jpath.read_text())
        if meta.get("calibration_version") != CALIBRATION_VERSION:
            raise UserError(f"{jpath} has calibration version {meta.get('calibration_version')}", f"re-run `wmcheck calibrate {run_dir}`")
        with np.load(npath, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        def part(prefix):
            return {k[len(prefix):]: arrays[k] for k in arrays if k.startswith(prefix)}

        power = {"null": part("power_null_"), "gaps": {}}
        if part("power_control_"):
            power["control"] = part("power_control_")
        for key in ("null_episode", "control_episode"):
            power[key] = arrays.get(f"powerep_{key}")
        for gap, e in meta["power"].items():
            power["gaps"][gap] = {"sizes": e["sizes"], "units": e["units"],
                                  "scores": [part(f"power_{gap}_{i}_") for i in range(len(e["sizes"]))]}
        return cls(CheckConfig.from_dict(meta["config"]), meta["info"], BlockScores.from_arrays(arrays, "real_"),
                   SearchMatrices.from_arrays(arrays, "realJ_"), arrays["real_states"], arrays["support_ref"], float(meta["support_scale"]), power,
                   arrays.get("real_controls"), arrays.get("real_episode"))


def pooled_detect(checked: dict[str, np.ndarray], null: dict[str, np.ndarray], alpha: float,
                  rng: np.random.Generator | None = None, permutations: int = 20000,
                  checked_episode: np.ndarray | None = None, null_episode: np.ndarray | None = None) -> tuple[bool, dict[str, float]]:
    """The pooled test of a check: any score's one-sided p < alpha / (2 * #scores); Welch's t of the
    episode means of the (log) scores when the episode labels are given (as in a check), otherwise
    the Mann-Whitney test of the blocks.
    `permutations`: Monte-Carlo size of the exact test on small samples (the power table, which
    runs this hundreds of times, uses fewer: its p-values only need to resolve alpha / 6)."""
    if checked_episode is None or null_episode is None:
        ps = {s: mann_whitney_greater(checked[s], null[s], rng, permutations) for s in SCORES}
    else:
        ps = {s: episode_t_greater(checked[s], checked_episode, null[s], null_episode, log=(s != "nll")) for s in SCORES}
    return any(p < alpha / (2 * len(SCORES)) for p in ps.values()), ps


RESIDUALS = ("resid_std", "resid_mean", "resid_ac1")  # what the residual (sensor / dynamics) tests need


def power_table(cal: Calibration, n_blocks: int, alpha: float, target: float, reps: int = 100, seed: int = 0) -> dict:
    """Detection probability per injected gap size for a check of n_blocks blocks, and the smallest
    size detected with probability >= target.

    A replicate draws min(n_blocks, available) injected blocks of half B WITHOUT replacement (more
    blocks than exist, with replacement, would replicate blocks and inflate the power), as whole
    episodes in random order (the last one cut), and runs the check's tests against half A at the
    check's levels: the pooled divergence test (episodes as the units, alpha / 2 shared over its
    scores), the residual tests (sensor noise and dynamics, alpha / 8 each) and the injected gap's
    own search (latency: the delay search; actuator: the gain search of every command channel,
    over the gains the model can judge), alpha / 8. A replicate is detected when any of them
    fires, as a check that does not pass. Not simulated: the per-episode tests and the searches
    for other gap types than the injected one (they can only add detections), so the figures are
    a lower bound for the injected gap itself.

    The same draw on the uninjected half B is the control (with every search): its detection rate
    is what the procedure reports for no gap at all. Above alpha the sizes are optimistic (the
    report says so); at or above the target the held-out episodes differ among themselves (e.g.
    seasons) as much as an injected gap would make them, so the power is reported as unreliable
    and no smallest size is claimed."""
    from wmcheck.checks.attribution import null_quantile, only_allowed, paired_improvement, residual_evidence

    rng = np.random.default_rng(seed)
    a_div, a_gap = split_alpha(alpha)  # the check's split of the budget
    ep_b, ep_a = cal.power.get("control_episode"), cal.power.get("null_episode")
    null = cal.power["null"]
    control = cal.power.get("control")
    search = cal.real_search
    in_a = np.isin(cal.real_episode, np.unique(ep_a)) if (cal.real_episode is not None and ep_a is not None) else None
    have_search = in_a is not None and search.latency.size > 0 and control is not None

    def draw(nB: int, n: int) -> np.ndarray:
        if ep_b is None:
            return rng.choice(nB, size=n, replace=False)
        order = rng.permutation(np.unique(ep_b))
        return np.concatenate([np.flatnonzero(ep_b == e) for e in order])[:n]

    nB = len(control[SCORES[0]]) if control else 0
    n = max(1, min(n_blocks, nB)) if nB else 1
    # search thresholds at this draw size, from the same searches on half A (computed once)
    thr = {}
    if have_search:
        lat_id = int(np.flatnonzero(search.delays == 0)[0])
        thr["latency"] = null_quantile(search.latency[:, in_a], lat_id, n, a_gap, rng, 200, ep_a)
        gain_id = int(np.flatnonzero(search.act_values["gain"] == 1.0)[0])
        n_search = max(1, len(search.actuator))
        for k in search.actuator:
            if k.startswith("gain:"):
                thr[k] = null_quantile(search.actuator[k][:, in_a], gain_id, n, a_gap / n_search, rng, 200, ep_a)

    def searches_fire(entry, idx) -> bool:
        if not have_search:
            return False
        if "search_latency" in entry and paired_improvement(entry["search_latency"], lat_id, idx)[0] >= thr["latency"]:
            return True
        for k, t in thr.items():
            if k.startswith("gain:") and f"search_{k}" in entry:
                mat = only_allowed(entry[f"search_{k}"], entry.get(f"allowed_{k}"), gain_id)
                if paired_improvement(mat, gain_id, idx)[0] >= t:
                    return True
        return False

    def residuals_fire(entry, idx) -> bool:
        if not all(k in entry and k in null for k in RESIDUALS) or ep_b is None or ep_a is None:
            return False
        ev = residual_evidence(entry["resid_std"][idx], null["resid_std"], entry["resid_mean"][idx], null["resid_mean"],
                               entry["resid_ac1"][idx], null["resid_ac1"], a_gap, rng, 0, [], (ep_b[idx], ep_a))
        return ev["evidence"] >= 1.0 or ev["dynamics_evidence"] >= 1.0

    def rate(entry) -> float:
        hits = 0
        for _ in range(reps):
            idx = draw(len(entry[SCORES[0]]), n)
            hits += bool(pooled_detect({s: entry[s][idx] for s in SCORES}, null, a_div, rng, permutations=2000,
                                       checked_episode=None if ep_b is None else ep_b[idx], null_episode=ep_a)[0]
                         or residuals_fire(entry, idx) or searches_fire(entry, idx))
        return hits / reps

    control_rate = None
    if control:
        ctrl = dict(control)
        if have_search:  # the uninjected half B gets every search the check runs
            ctrl["search_latency"] = search.latency[:, ~in_a]
            for k in thr:
                if k.startswith("gain:"):
                    ctrl[f"search_{k}"] = search.actuator[k][:, ~in_a]
        control_rate = rate(ctrl)
    reliable = control_rate is None or control_rate < target
    table = {}
    for gap, e in cal.power["gaps"].items():
        probs = [rate(entry) for entry in e["scores"]]
        smallest = next((s for s, p in zip(e["sizes"], probs) if p >= target), None) if reliable else None
        table[gap] = {"sizes": list(e["sizes"]), "units": e["units"], "detection_probability": probs,
                      "smallest_detected": smallest, "blocks_used": n, "control_detection": control_rate,
                      "reliable": bool(reliable)}
    return table


def _inject(gap: str, size, episodes, norm: Normalizer, rng: np.random.Generator):
    if gap == "latency":
        return [shift_actions(e, -int(size)) for e in episodes]  # commands take effect `size` steps late
    if gap == "actuator":
        # A checked system whose commands act `size` times as strongly as reality's: the real
        # motions stay, the logged commands become 1/size of the real ones (this keeps them
        # inside the training range; scaling them up would test the model's extrapolation).
        out = episodes
        for c in range(norm.dim("action")):
            out = [actuator(e, c, gain=1.0 / float(size)) for e in out]
        return out
    std = norm.std["obs"].astype(float)
    if gap == "sensor_noise":
        return [observation_noise(e, std=size * std, rng=rng) for e in episodes]
    return [observation_noise(e, bias=size * std) for e in episodes]


def calibrate(run_dir: str | Path, log_path: str | Path | None = None, cfg: CheckConfig | None = None,
              verbose: bool = True) -> Calibration:
    run_dir = Path(run_dir)
    cfg = cfg or CheckConfig()
    bundle: ModelBundle = load_model(run_dir)
    log_path = Path(log_path) if log_path else _training_log(run_dir)
    if not log_path.exists():
        raise UserError(f"training log {log_path} not found", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`")
    data_hash = file_sha256(log_path)
    if data_hash != bundle.data_hash:
        raise UserError(f"{log_path} is not the log this model was trained on (data hash differs)",
                        "pass the training log; calibrating on other data would make the thresholds meaningless")
    t0 = time.perf_counter()
    say = print if verbose else (lambda *a, **k: None)
    norm = Normalizer.from_dict(bundle.normalizer)
    model = bundle.model
    train_cfg = bundle.run_config["train"]
    with open_log(log_path) as log:
        train_ids, val_ids = split_episodes(log.episode_ids, train_cfg["val_fraction"], train_cfg["seed"])
        if not val_ids:
            raise UserError("the model has no held-out episodes to calibrate on", "train with --val-fraction > 0 (e.g. 0.2)")
        held = list(log.episodes(val_ids))
        train_eps = list(log.episodes(train_ids))
    try:
        blocks = make_blocks(held, norm, cfg.context, cfg.horizon)
    except ValueError as exc:
        raise UserError(f"held-out episodes too short: {exc}", "use a shorter --horizon/--context or longer episodes") from None
    say(f"calibrating on {len(held)} held-out episodes ({len(blocks)} blocks of {blocks.length} steps)")
    # Support reference: latents of training blocks; scale: typical distance of held-out real latents.
    rng = np.random.default_rng(cfg.seed)
    train_blocks = make_blocks(train_eps, norm, cfg.context, cfg.horizon)
    feats = latent_features(model, train_blocks).reshape(-1, model.cfg.deter)
    ref = feats[rng.choice(len(feats), size=min(cfg.support_refs, len(feats)), replace=False)]
    held_feats = latent_features(model, blocks).reshape(-1, model.cfg.deter)
    d = torch.cdist(torch.from_numpy(held_feats), torch.from_numpy(ref)).min(1).values.numpy()
    scale = float(np.median(d)) or 1.0
    real = score_blocks(model, blocks, cfg.samples, ref, scale, seed=cfg.seed)
    say("  attribution searches on real blocks (the null of every search)")
    real_search = search_matrices(model, held, norm, cfg, norm.std["action"].astype(float))
    # Power: halves of the held-out episodes (A: null, B: injected; B uninjected is the control).
    # Both halves are subsets of the real blocks scored above (same episodes, same cuts).
    say("  power: injecting gaps of graded size into held-out episodes")
    half_a, half_b = held[0::2], held[1::2]
    power = {"null": {}, "gaps": {}}
    if half_a and half_b:
        in_a = np.isin(blocks.episode, [e.id for e in half_a])
        null, control = real.subset(np.flatnonzero(in_a)), real.subset(np.flatnonzero(~in_a))
        power["null"] = {s: getattr(null, s) for s in SCORES + RESIDUALS}
        power["control"] = {s: getattr(control, s) for s in SCORES + RESIDUALS}
        power["null_episode"], power["control_episode"] = blocks.episode[in_a], blocks.episode[~in_a]
        astd = norm.std["action"].astype(float)
        for c in range(len(astd)):  # the gains a check could try on the uninjected half B
            power["control"][f"allowed_gain:{c}"] = allowed_corrections(norm, half_b, c, "gain", np.asarray(cfg.gain_grid), 1.0,
                                                                        cfg.competence_alpha)
        for g, (gap, sizes) in enumerate(POWER_SIZES.items()):
            entries = []
            for size in sizes:
                inj = _inject(gap, size, half_b, norm, np.random.default_rng([cfg.seed, g]))
                inj_blocks = make_blocks(inj, norm, cfg.context, cfg.horizon)
                assert np.array_equal(inj_blocks.episode, power["control_episode"]), "injection changed the block layout"
                sc = score_blocks(model, inj_blocks, cfg.samples, seed=cfg.seed)
                entry = {s: getattr(sc, s) for s in SCORES + RESIDUALS}
                # the injected gap's own search, as a check runs it (the power table replays it)
                if gap == "latency":
                    entry["search_latency"] = search_matrices(model, inj, norm, cfg, astd, actuator=False).latency
                elif gap == "actuator":
                    gains = np.asarray(cfg.gain_grid)
                    mats = search_matrices(model, inj, norm, cfg, astd, latency=False, kinds=("gain",))
                    for c in range(len(astd)):
                        entry[f"search_gain:{c}"] = mats.actuator[f"gain:{c}"]
                        entry[f"allowed_gain:{c}"] = allowed_corrections(norm, inj, c, "gain", gains, 1.0, cfg.competence_alpha)
                entries.append(entry)
            power["gaps"][gap] = {"sizes": sizes, "units": POWER_UNITS[gap], "scores": entries}
    else:
        power["null"] = {s: getattr(real, s) for s in SCORES + RESIDUALS}
        power["null_episode"] = blocks.episode
    reward_err, reward_std = reward_resolution(model, blocks)
    info = {"log": str(log_path), "log_sha256": data_hash, "model_sha256": bundle.file_hash,
            "reward_abs_error_per_step": reward_err, "reward_std_real": reward_std,
            "held_out_episodes": val_ids, "blocks": len(blocks), "block_length": blocks.length,
            "training_latents": int(len(feats)), "seconds": round(time.perf_counter() - t0, 1),
            "dt": bundle.channels.get("dt")}
    if len(blocks) < 20:
        info["warning"] = (f"only {len(blocks)} held-out blocks: thresholds and power are coarse; "
                           "hold out more real episodes for sharper checks")
    cal = Calibration(cfg, info, real, real_search, block_states(blocks), ref, scale, power, block_controls(blocks),
                      blocks.episode)
    cal.save(run_dir)
    if model.cfg.image_keys:  # the visual gap's real-vs-real null (checks/visual.py)
        from wmcheck.checks.visual import calibrate_visual

        say("  visual: real-vs-real frame distances in the world model's image embedding")
        calibrate_visual(model, held, train_eps).save(run_dir)
    say(f"  calibration written to {run_dir / 'calibration.json'} ({info['seconds']} s)")
    return cal


def reward_resolution(model, blocks, chunk: int = 64) -> tuple[float, float]:
    """(mean |reward head - logged reward| per step, std of the logged rewards) on held-out real blocks,
    from filtered (posterior) states: how finely the model can tell returns apart. Policy checks
    treat return differences within this per step as below the model's resolution."""
    errs, rewards = [], []
    model.eval()
    with torch.no_grad():
        for _, b in blocks.torch_chunks(chunk):
            obsd, _ = model.observe(b, sample=False)
            pred = model.twohot.mean(model.reward(obsd.state.feat()))  # (n, L) predicts reward[t] = r_{t-1}
            errs.append((pred - b.reward.float())[:, 1:].abs().numpy())  # column 0 starts a block: no reward
            rewards.append(b.reward[:, 1:].float().numpy())
    return float(np.concatenate(errs).mean()), float(np.concatenate(rewards).std())


def _training_log(run_dir: Path) -> Path:
    data = run_dir / "data.json"
    if not data.exists():
        raise UserError(f"{run_dir} does not say which log it was trained on", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`")
    return Path(json.loads(data.read_text())["log"])
