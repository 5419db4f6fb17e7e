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
into half B (actions delayed, commands scaled, observation noise and bias added) and judged against
half A by the check's own decision (decision.decide on the per-episode and pooled divergence tests,
the residual tests and the injected gap's own search; see `power_table`); the smallest size
detected with probability >= power_target is what a pass is worth.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.attribution import SearchMatrices, allowed_corrections, identity_index, search_matrices
from wmcheck.checks.blocks import block_controls, block_states, make_blocks
from wmcheck.checks.config import POWER_GAPS, SCORES, CheckConfig, split_alpha
from wmcheck.checks.endings import real_endings
from wmcheck.checks.evidence import CheckEvidence, GapEvidence
from wmcheck.checks.scoring import BlockScores, latent_features, score_blocks
from wmcheck.checks.transforms import actuator, observation_noise, shift_actions
from wmcheck.datasets.atomic import atomic_path, write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import split_episodes
from wmcheck.training.checkpoint import ModelBundle, file_sha256, load_model

CALIBRATION_VERSION = 4  # 2: per-step errors and controls (regimes); 3: episode of every block (clustered tests);
# 4: searches stored per kind (C, G, n), power entries with named fields
POWER_SIZES = {
    "latency": (1, 2, 3, 4),  # steps the commands are delayed by
    "actuator": (1.1, 1.25, 1.5, 2.0),  # gain on every command channel
    "sensor_noise": (0.05, 0.1, 0.25, 0.5),  # Gaussian noise, x each channel's training std
    "sensor_bias": (0.1, 0.25, 0.5, 1.0),  # bias, x each channel's training std
}
assert tuple(POWER_SIZES) == POWER_GAPS, "config.POWER_GAPS names the power table's gap types"
POWER_UNITS = {"latency": "steps", "actuator": "gain", "sensor_noise": "x channel std", "sensor_bias": "x channel std"}


RESIDUALS = ("resid_std", "resid_mean", "resid_ac1")  # what the residual (sensor / dynamics) tests need
POWER_SCORES = SCORES + RESIDUALS


@dataclass
class PowerEntry:
    """Block statistics of one set of held-out blocks of half B (uninjected, or one injected size)."""

    scores: dict[str, np.ndarray]  # POWER_SCORES -> (n,) or (n, D)
    search_latency: np.ndarray | None = None  # (Ld, n) the delay search on these blocks
    search_gain: np.ndarray | None = None  # (C, G, n) the gain search of every command channel
    allowed_gain: np.ndarray | None = None  # (C, G) the gains the model can judge on these blocks

    OPTIONAL = ("search_latency", "search_gain", "allowed_gain")

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}score_{s}": self.scores[s] for s in POWER_SCORES}
        out.update({f"{prefix}{k}": getattr(self, k) for k in self.OPTIONAL if getattr(self, k) is not None})
        return out

    @classmethod
    def from_arrays(cls, arrays, prefix: str) -> PowerEntry:
        return cls(
            {s: arrays[f"{prefix}score_{s}"] for s in POWER_SCORES},
            **{k: arrays.get(f"{prefix}{k}") for k in cls.OPTIONAL},
        )


@dataclass
class InjectedSeries:
    sizes: tuple  # graded sizes, in `units`
    units: str
    entries: list[PowerEntry]  # one per size


@dataclass
class PowerSet:
    """What the power table needs: half A (the null), half B uninjected (the control) and injected."""

    null: dict[str, np.ndarray]  # POWER_SCORES of half A
    null_episode: np.ndarray  # (nA,)
    control: PowerEntry | None = None  # half B as it is; None with fewer than 2 held-out episodes
    control_episode: np.ndarray | None = None  # (nB,)
    gaps: dict[str, InjectedSeries] = field(default_factory=dict)

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {f"power/null/{s}": self.null[s] for s in POWER_SCORES}
        out["power/null_episode"] = self.null_episode
        if self.control is not None:
            out.update(self.control.to_arrays("power/control/"))
            out["power/control_episode"] = self.control_episode
        for gap, series in self.gaps.items():
            for i, entry in enumerate(series.entries):
                out.update(entry.to_arrays(f"power/{gap}/{i}/"))
        return out

    def sizes(self) -> dict:
        return {gap: {"sizes": list(e.sizes), "units": e.units} for gap, e in self.gaps.items()}

    @classmethod
    def from_arrays(cls, arrays, sizes: dict) -> PowerSet:
        control = PowerEntry.from_arrays(arrays, "power/control/") if "power/control_episode" in arrays else None
        gaps = {
            gap: InjectedSeries(
                tuple(e["sizes"]),
                e["units"],
                [PowerEntry.from_arrays(arrays, f"power/{gap}/{i}/") for i in range(len(e["sizes"]))],
            )
            for gap, e in sizes.items()
        }
        return cls(
            {s: arrays[f"power/null/{s}"] for s in POWER_SCORES},
            arrays["power/null_episode"],
            control,
            arrays.get("power/control_episode"),
            gaps,
        )


@dataclass
class Calibration:
    config: CheckConfig
    info: dict  # provenance and sizes
    real: BlockScores
    real_search: SearchMatrices
    real_states: np.ndarray  # (n, k, D + A + E) states visited by the held-out blocks (distribution test)
    support_ref: np.ndarray  # (M, deter)
    support_scale: float
    power: PowerSet
    real_controls: np.ndarray | None = None  # (n, H, A + E) operating conditions of the held-out steps (regimes)
    real_episode: np.ndarray | None = None  # (n,) held-out episode id of every real block (the clusters)

    def save(self, run_dir: Path) -> None:
        arrays = {
            **self.real.to_arrays("real_"),
            **self.real_search.to_arrays("realJ_"),
            **self.power.to_arrays(),
            "support_ref": self.support_ref.astype(np.float32),
            "real_states": self.real_states,
        }
        if self.real_controls is not None:
            arrays["real_controls"] = self.real_controls
        if self.real_episode is not None:
            arrays["real_episode"] = self.real_episode
        with atomic_path(run_dir / "calibration.npz", suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)
        meta = {
            "calibration_version": CALIBRATION_VERSION,
            "config": self.config.to_dict(),
            "info": self.info,
            "support_scale": self.support_scale,
            "power": self.power.sizes(),
        }
        write_text_atomic(run_dir / "calibration.json", json.dumps(meta, indent=2, sort_keys=True))

    @classmethod
    def load(cls, run_dir: str | Path) -> Calibration:
        run_dir = Path(run_dir)
        jpath, npath = run_dir / "calibration.json", run_dir / "calibration.npz"
        if not jpath.exists() or not npath.exists():
            raise UserError(
                f"{run_dir} has no calibration", f"run `wmcheck calibrate {run_dir}` (train does it at the end)"
            )
        meta = json.loads(jpath.read_text())
        if meta.get("calibration_version") != CALIBRATION_VERSION:
            raise UserError(
                f"{jpath} has calibration version {meta.get('calibration_version')}, this wmcheck reads "
                f"{CALIBRATION_VERSION}",
                f"re-run `wmcheck calibrate {run_dir}`",
            )
        with np.load(npath, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return cls(
            CheckConfig.from_dict(meta["config"]),
            meta["info"],
            BlockScores.from_arrays(arrays, "real_"),
            SearchMatrices.from_arrays(arrays, "realJ_"),
            arrays["real_states"],
            arrays["support_ref"],
            float(meta["support_scale"]),
            PowerSet.from_arrays(arrays, meta["power"]),
            arrays.get("real_controls"),
            arrays.get("real_episode"),
        )


def power_table(cal: Calibration, n_blocks: int, alpha: float, target: float, reps: int = 100, seed: int = 0) -> dict:
    """Detection probability per injected gap size for a check of n_blocks blocks, and the smallest
    size detected with probability >= target.

    A replicate draws min(n_blocks, available) injected blocks of half B WITHOUT replacement (more
    blocks than exist, with replacement, would replicate blocks and inflate the power), as whole
    episodes in random order (the last one cut), builds the evidence a check of those blocks would
    have against half A (evidence.CheckEvidence: the per-episode and pooled divergence tests of
    divergence.py, the residual tests, and the injected gap's own search: latency the delay search,
    actuator the gain search of every command channel over the gains the model can judge) and
    calls the check's decision (decision.decide) at the check's levels for that many episodes. A
    replicate is detected when the verdict is not `pass`. Not simulated: competence (every
    injected block counts as competent), the distribution, visual and ending tests, and the searches for
    other gap types than the injected one (they can only add detections), so the figures are a
    lower bound for the injected gap itself.

    The same draw on the uninjected half B is the control (with every search): its detection rate
    is what the procedure reports for no gap at all. Above alpha the sizes are optimistic (the
    report says so); at or above the target the held-out episodes differ among themselves (e.g.
    seasons) as much as an injected gap would make them, so the power is reported as unreliable
    and no smallest size is claimed."""
    ps = cal.power
    if ps.control is None or not ps.gaps:
        return {}
    rng = np.random.default_rng(seed)
    nB = len(ps.control_episode)
    n = max(1, min(n_blocks, nB))
    judge = _PowerJudge(cal, n, alpha, rng)

    def rate(entry: PowerEntry) -> float:
        hits = 0
        for _ in range(reps):
            order = rng.permutation(np.unique(ps.control_episode))
            idx = np.concatenate([np.flatnonzero(ps.control_episode == e) for e in order])[:n]
            hits += judge.detected(entry, idx)
        return hits / reps

    control_rate = rate(judge.control_with_searches())
    reliable = control_rate < target
    table = {}
    for gap, series in ps.gaps.items():
        probs = [rate(entry) for entry in series.entries]
        smallest = next((s for s, p in zip(series.sizes, probs) if p >= target), None) if reliable else None
        table[gap] = {
            "sizes": list(series.sizes),
            "units": series.units,
            "detection_probability": probs,
            "smallest_detected": smallest,
            "blocks_used": n,
            "control_detection": control_rate,
            "reliable": bool(reliable),
        }
    return table


class _PowerJudge:
    """The check's evidence and decision on a draw of half-B blocks (see `power_table`)."""

    def __init__(self, cal: Calibration, n: int, alpha: float, rng: np.random.Generator):
        from wmcheck.checks.attribution import null_quantile

        self.cal, self.alpha, self.rng = cal, alpha, rng
        ps, search = cal.power, cal.real_search
        self.in_a = np.isin(cal.real_episode, np.unique(ps.null_episode))
        a_gap = split_alpha(alpha)[1]
        self.has_search = search.latency.size > 0
        self.thr_latency, self.thr_gain = None, None
        if self.has_search:  # thresholds at this draw size, from the same searches on half A
            self.lat_id = identity_index("delay", search.delays)
            self.thr_latency = null_quantile(
                search.latency[:, self.in_a], self.lat_id, n, a_gap, rng, 200, ps.null_episode
            )
            gains = search.act_values.get("gain")
            if gains is not None and len(search.actuator["gain"]):
                self.gain_id = identity_index("gain", gains)
                level = a_gap / max(1, search.n_actuator_searches)  # the check's Bonferroni over all its searches
                self.thr_gain = [
                    null_quantile(m[:, self.in_a], self.gain_id, n, level, rng, 200, ps.null_episode)
                    for m in search.actuator["gain"]
                ]

    def control_with_searches(self) -> PowerEntry:
        """Half B uninjected, with every search the check runs (latency and gains)."""
        c, search = self.cal.power.control, self.cal.real_search
        if not self.has_search:
            return c
        gain = search.actuator["gain"][:, :, ~self.in_a] if self.thr_gain is not None else None
        return PowerEntry(c.scores, search.latency[:, ~self.in_a], gain, c.allowed_gain)

    def _search_gaps(self, entry: PowerEntry, idx: np.ndarray) -> dict[str, GapEvidence]:
        from wmcheck.checks.attribution import only_allowed, paired_improvement

        out = {g: GapEvidence.not_checked(g, "not simulated") for g in ("latency", "actuator")}
        if self.has_search and entry.search_latency is not None:
            t = paired_improvement(entry.search_latency, self.lat_id, idx)[0]
            out["latency"] = GapEvidence("latency", min(t, 1e6) / self.thr_latency)
        if self.thr_gain is not None and entry.search_gain is not None:
            ev = []
            for c, thr in enumerate(self.thr_gain):
                allowed = None if entry.allowed_gain is None else entry.allowed_gain[c]
                mat = only_allowed(entry.search_gain[c], allowed, self.gain_id)
                ev.append(min(paired_improvement(mat, self.gain_id, idx)[0], 1e6) / thr)
            out["actuator"] = GapEvidence("actuator", max(ev))
        return out

    def _residual_gaps(self, entry: PowerEntry, idx: np.ndarray) -> dict[str, GapEvidence]:
        from wmcheck.checks.attribution import residual_evidence

        null, ps = self.cal.power.null, self.cal.power
        s = entry.scores
        st = residual_evidence(
            s["resid_std"][idx],
            null["resid_std"],
            s["resid_mean"][idx],
            null["resid_mean"],
            s["resid_ac1"][idx],
            null["resid_ac1"],
            split_alpha(self.alpha)[1],
            self.rng,
            0,
            [],
            (ps.control_episode[idx], ps.null_episode),
            sensor_share=0.5,
        )
        from wmcheck.checks.attribution import smoothness_evidence

        smooth = smoothness_evidence(
            {k: s[k][idx] for k in ("kl", "nll")},
            ps.control_episode[idx],
            {k: null[k] for k in ("kl", "nll")},
            ps.null_episode,
            split_alpha(self.alpha)[1] / 2,
        )
        return {
            "sensor_noise": GapEvidence("sensor_noise", max(st.sensor_evidence, smooth.evidence)),
            "dynamics": GapEvidence("dynamics", st.dynamics_evidence),
        }

    def detected(self, entry: PowerEntry, idx: np.ndarray) -> bool:
        from wmcheck.checks.decision import Levels, decide
        from wmcheck.checks.divergence import divergence_evidence

        ps = self.cal.power
        episodes = ps.control_episode[idx]
        div = divergence_evidence({s: entry.scores[s][idx] for s in SCORES}, ps.null, ps.null_episode, episodes)
        gaps = {
            **self._search_gaps(entry, idx),
            **self._residual_gaps(entry, idx),
            "visual": GapEvidence.not_checked("visual", "not simulated"),
            "ending": GapEvidence.not_checked("ending", "not simulated"),
        }
        decision = decide(CheckEvidence(div, gaps), Levels.for_check(self.alpha, len(np.unique(episodes))))
        return decision.verdict != "pass"


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


def injected_power(model, norm: Normalizer, cfg: CheckConfig, held: list, blocks, real: BlockScores) -> PowerSet:
    """Half A (even held-out episodes) is the null; half B (odd ones) uninjected is the control, and
    with each gap of POWER_SIZES injected it is re-scored (with the injected gap's own search, as a
    check runs it). Both halves are subsets of the real blocks scored in calibration."""
    half_a, half_b = held[0::2], held[1::2]
    if not (half_a and half_b):
        return PowerSet({s: getattr(real, s) for s in POWER_SCORES}, blocks.episode)
    in_a = np.isin(blocks.episode, [e.id for e in half_a])
    null, control = real.subset(np.flatnonzero(in_a)), real.subset(np.flatnonzero(~in_a))
    astd = norm.std["action"].astype(float)
    gains = np.asarray(cfg.gain_grid)

    def allowed(eps) -> np.ndarray:  # (C, G) the gains a check could try on these episodes
        return (
            np.stack(
                [allowed_corrections(norm, eps, c, "gain", gains, 1.0, cfg.competence_alpha) for c in range(len(astd))]
            )
            if len(astd)
            else np.zeros((0, len(gains)), bool)
        )

    ps = PowerSet(
        {s: getattr(null, s) for s in POWER_SCORES},
        blocks.episode[in_a],
        PowerEntry({s: getattr(control, s) for s in POWER_SCORES}, allowed_gain=allowed(half_b)),
        blocks.episode[~in_a],
    )
    for g, (gap, sizes) in enumerate(POWER_SIZES.items()):
        entries = []
        for size in sizes:
            inj = _inject(gap, size, half_b, norm, np.random.default_rng([cfg.seed, g]))
            inj_blocks = make_blocks(inj, norm, cfg.context, cfg.horizon)
            assert np.array_equal(inj_blocks.episode, ps.control_episode), "injection changed the block layout"
            sc = score_blocks(model, inj_blocks, cfg.samples, seed=cfg.seed)
            entry = PowerEntry({s: getattr(sc, s) for s in POWER_SCORES})
            if gap == "latency":
                entry.search_latency = search_matrices(model, inj, norm, cfg, astd, actuator=False).latency
            elif gap == "actuator" and len(astd):
                entry.search_gain = search_matrices(
                    model, inj, norm, cfg, astd, latency=False, kinds=("gain",)
                ).actuator["gain"]
                entry.allowed_gain = allowed(inj)
            entries.append(entry)
        ps.gaps[gap] = InjectedSeries(tuple(sizes), POWER_UNITS[gap], entries)
    return ps


def calibrate(
    run_dir: str | Path, log_path: str | Path | None = None, cfg: CheckConfig | None = None, verbose: bool = True
) -> Calibration:
    run_dir = Path(run_dir)
    cfg = cfg or CheckConfig()
    bundle: ModelBundle = load_model(run_dir)
    log_path = Path(log_path) if log_path else _training_log(run_dir)
    if not log_path.exists():
        raise UserError(f"training log {log_path} not found", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`")
    data_hash = file_sha256(log_path)
    if data_hash != bundle.data_hash:
        raise UserError(
            f"{log_path} is not the log this model was trained on (data hash differs)",
            "pass the training log; calibrating on other data would make the thresholds meaningless",
        )
    t0 = time.perf_counter()
    say = print if verbose else (lambda *a, **k: None)
    norm = Normalizer.from_dict(bundle.normalizer)
    model = bundle.model
    train_cfg = bundle.run_config["train"]
    with open_log(log_path) as log:
        train_ids, val_ids = split_episodes(log.episode_ids, train_cfg["val_fraction"], train_cfg["seed"])
        if not val_ids:
            raise UserError(
                "the model has no held-out episodes to calibrate on", "train with --val-fraction > 0 (e.g. 0.2)"
            )
        held = list(log.episodes(val_ids))
        train_eps = list(log.episodes(train_ids))
    try:
        blocks = make_blocks(held, norm, cfg.context, cfg.horizon)
    except ValueError as exc:
        raise UserError(
            f"held-out episodes too short: {exc}", "use a shorter --horizon/--context or longer episodes"
        ) from None
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
    power = injected_power(model, norm, cfg, held, blocks, real)
    reward_err, reward_std = reward_resolution(model, blocks)
    info = {
        "log": str(log_path),
        "log_sha256": data_hash,
        "model_sha256": bundle.file_hash,
        "reward_abs_error_per_step": reward_err,
        "reward_std_real": reward_std,
        "held_out_episodes": val_ids,
        "real_endings": real_endings(train_eps + held),
        "blocks": len(blocks),
        "block_length": blocks.length,
        "training_latents": int(len(feats)),
        "seconds": round(time.perf_counter() - t0, 1),
        "dt": bundle.channels.get("dt"),
    }
    if len(blocks) < 20:
        info["warning"] = (
            f"only {len(blocks)} held-out blocks: thresholds and power are coarse; "
            "hold out more real episodes for sharper checks"
        )
    cal = Calibration(
        cfg, info, real, real_search, block_states(blocks), ref, scale, power, block_controls(blocks), blocks.episode
    )
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
        raise UserError(
            f"{run_dir} does not say which log it was trained on", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`"
        )
    return Path(json.loads(data.read_text())["log"])
