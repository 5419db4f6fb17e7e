"""Calibration on held-out real episodes: the null distributions every check compares against.

Owns `calibrate(run_dir, log)` and the files it writes next to the model:
  RUNDIR/calibration.json   config, provenance, power table (small, human-readable)
  RUNDIR/calibration.npz    arrays: real block scores, the corrections' scores and fit on real
                            blocks (sysid.py; the grid search matrices with attribution "grid"),
                            the training-latent support reference, injected-gap scores
Held-out = the validation episodes of the model's own split (never trained on). Every statistic
is per block of consecutive steps, so checks can resample blocks (autocorrelation respected).

Reward resolution: the reward head's mean absolute error per step on the held-out blocks (for
policy checks' return comparisons).

Power: calibration stores the power set (checks/power.py: halves of the held-out episodes, gaps of
graded size injected into one half); `power.power_table` turns it into what a pass is worth.
Endings: how many training and held-out episodes terminate (checks/endings.py).
Policy: the held-out episodes' (conditions, command) pairs, the reference of the policy-shift test
(checks/policy_match.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wmcheck.checks.attribution import SearchMatrices, search_matrices
from wmcheck.checks.blocks import block_controls, block_states, make_blocks
from wmcheck.checks.config import CheckConfig
from wmcheck.checks.endings import real_endings
from wmcheck.checks.model_log import episode_fingerprint, read_log_for_model
from wmcheck.checks.policy_match import PolicyPairs, policy_pairs
from wmcheck.checks.power import PowerSet, injected_power
from wmcheck.checks.scoring import BlockScores, latent_features, score_blocks, with_spread_scale
from wmcheck.checks.sysid import Reference, reference
from wmcheck.datasets.atomic import atomic_path, write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import split_episodes
from wmcheck.training.checkpoint import ModelBundle, file_sha256, load_model
from wmcheck.training.conformal import fit_spread_scale
from wmcheck.training.quality import compute_card, read_card, write_card

CALIBRATION_VERSION = 9  # 2: per-step errors and controls (regimes); 3: episode of every block (clustered tests);


# 4: searches stored per kind (C, G, n), power entries with named fields; 5: conformal spread scale;
# 6: the power entries' open-loop bias cells (bias.py); 7: the corrections' fit reference (sysid.py);
# 8: the held-out episodes' (conditions, command) pairs (policy_match.py); 9: the divergence score is the
# share of open-loop cells outside the 90 % interval (scoring.exceedance_share), not the mean z^2
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
    spread_scale: np.ndarray | None = None  # (H, D) conformal scale of the predictive std (training/conformal.py)
    sysid: Reference | None = None  # the corrections' fit on the real blocks (sysid.py; None with attribution "grid")
    known_episodes: np.ndarray | None = None  # (m,) content hashes of every real episode the model or its
    # thresholds rest on (training log and --real extras): never new data for the monitor
    real_policy: PolicyPairs | None = None  # what the held-out episodes' commands were chosen on (policy_match.py)

    def known_fingerprints(self) -> set[str] | None:
        """The content hashes of the episodes the model was trained or calibrated on; None for a
        calibration written before they were stored."""
        return None if self.known_episodes is None else {str(f) for f in self.known_episodes}

    def score(self, model, blocks, seed: int) -> BlockScores:
        """`blocks` scored the way the real blocks were: the calibration's latent draws per step,
        support reference and scale, and conformal spread (the one place these settings meet)."""
        return score_blocks(
            model,
            blocks,
            self.config.samples,
            self.support_ref,
            self.support_scale,
            seed=seed,
            spread_scale=self.spread_scale,
        )

    def support_bound(self, alpha: float) -> float:
        """The latent distance to the training latents that all but `alpha` of held-out real steps stay under."""
        return float(np.quantile(self.real.support_steps, 1 - alpha))

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
        if self.spread_scale is not None:
            arrays["spread_scale"] = self.spread_scale
        if self.sysid is not None:
            arrays.update(self.sysid.to_arrays())
        if self.known_episodes is not None:
            arrays["known_episodes"] = np.asarray(self.known_episodes, dtype="<U64")
        if self.real_policy is not None:
            arrays.update(self.real_policy.to_arrays())
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
            arrays.get("spread_scale"),
            Reference.from_arrays(arrays),
            arrays.get("known_episodes"),
            PolicyPairs.from_arrays(arrays),
        )


def load_calibrated(run_dir: str | Path) -> tuple[ModelBundle, Calibration]:
    """A run's model and its calibration, refused (UserError) when the calibration was made for
    another model.pt or does not say which (a missing hash is no match either)."""
    run_dir = Path(run_dir)
    bundle = load_model(run_dir)
    cal = Calibration.load(run_dir)
    if cal.info.get("model_sha256") != bundle.file_hash:
        raise UserError(
            f"{run_dir}/calibration.json belongs to another model.pt (or does not say which)",
            f"re-run `wmcheck calibrate {run_dir}`",
        )
    return bundle, cal


def extra_real_episodes(paths, channels: dict, training: list, first_id: int) -> tuple[list, list[dict]]:
    """Episodes of real logs the model never trained on, to calibrate on besides the held-out
    split: (episodes renumbered from `first_id` so that ids stay unique, one provenance dict per
    log). An episode whose content equals a training episode's (or one already taken) is a
    UserError: thresholds on data the model was fitted to would be too lenient."""
    seen = {episode_fingerprint(e): f"training episode {e.id}" for e in training}
    out, prov = [], []
    for path in paths:
        meta, eps = read_log_for_model(Path(path), channels, role="extra real log")
        if meta.source != "real":
            raise UserError(
                f"{path} has source {meta.source!r}, not 'real'",
                "calibrate only on real logs (import them with `wmcheck import`, which writes source 'real')",
            )
        for e in eps:
            fp = episode_fingerprint(e)
            if fp in seen:
                raise UserError(
                    f"episode {e.id} of {path} is the same data as {seen[fp]}",
                    "pass only real episodes the model never trained on (and each one once)",
                )
            seen[fp] = f"episode {e.id} of {path}"
            out.append(dataclasses.replace(e, id=first_id + len(out)))
        prov.append({"log": str(path), "sha256": file_sha256(path), "episodes": len(eps)})
    return out, prov


def calibrate(
    run_dir: str | Path,
    log_path: str | Path | None = None,
    cfg: CheckConfig | None = None,
    verbose: bool = True,
    extra_real: list | None = None,
) -> Calibration:
    """Score the held-out real episodes (the validation split of the training log, plus every
    episode of the `extra_real` logs) and store the nulls, competence bounds and power table."""
    run_dir = Path(run_dir)
    cfg = cfg or CheckConfig()
    bundle: ModelBundle = load_model(run_dir)
    log_path = Path(log_path) if log_path else training_log(run_dir)
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
        if not val_ids and not extra_real:
            raise UserError(
                "the model has no held-out episodes to calibrate on",
                "train with --val-fraction > 0 (e.g. 0.2), or pass real logs it never saw with --real",
            )
        held = list(log.episodes(val_ids))
        train_eps = list(log.episodes(train_ids))
        first_extra = max(log.episode_ids) + 1
    extra, extra_prov = extra_real_episodes(extra_real or [], bundle.channels, train_eps, first_extra)
    held += extra
    try:
        blocks = make_blocks(held, norm, cfg.context, cfg.horizon)
    except ValueError as exc:
        raise UserError(
            f"held-out episodes too short: {exc}", "use a shorter --horizon/--context or longer episodes"
        ) from None
    say(
        f"calibrating on {len(held)} held-out episodes ({len(blocks)} blocks of {blocks.length} steps"
        + (f"; {len(extra)} from {len(extra_prov)} extra real log(s))" if extra else ")")
    )
    # Support reference: latents of training blocks; scale: typical distance of held-out real latents.
    rng = np.random.default_rng(cfg.seed)
    train_blocks = make_blocks(train_eps, norm, cfg.context, cfg.horizon)
    feats = latent_features(model, train_blocks).reshape(-1, model.cfg.deter)
    ref = feats[rng.choice(len(feats), size=min(cfg.support_refs, len(feats)), replace=False)]
    held_feats = latent_features(model, blocks).reshape(-1, model.cfg.deter)
    d = torch.cdist(torch.from_numpy(held_feats), torch.from_numpy(ref)).min(1).values.numpy()
    scale = float(np.median(d)) or 1.0
    real = score_blocks(model, blocks, cfg.samples, ref, scale, seed=cfg.seed)
    # The model's own spread under-covers open loop; the conformal scale fitted on these blocks
    # makes its 90 % band cover 90 % of them at every step and channel, and every score uses it.
    spread = fit_spread_scale(np.abs(real.z_steps))  # (H, D)
    real = with_spread_scale(real, spread)
    sysid_ref = None
    if cfg.attribution == "grid":
        say("  attribution searches on real blocks (the null of every search)")
        real_search = search_matrices(model, held, norm, cfg, norm.std["action"].astype(float))
    else:
        say("  corrections' scores and fit on real blocks (the null of the latency and actuator tests)")
        real_search = SearchMatrices(np.zeros(0), np.zeros((0, 0)))
        sysid_ref = reference(model, held, blocks, norm, cfg)
    # Power: halves of the held-out episodes (A: null, B: injected; B uninjected is the control).
    # Both halves are subsets of the real blocks scored above (same episodes, same cuts).
    say("  power: injecting gaps of graded size into held-out episodes")
    power = injected_power(model, norm, cfg, held, blocks, real, spread)
    reward_err, reward_std = reward_resolution(model, blocks)
    info = {
        "log": str(log_path),
        "log_sha256": data_hash,
        "model_sha256": bundle.file_hash,
        "reward_abs_error_per_step": reward_err,
        "reward_std_real": reward_std,
        "held_out_episodes": [e.id for e in held],
        "extra_real": extra_prov,
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
        cfg,
        info,
        real,
        real_search,
        block_states(blocks),
        ref,
        scale,
        power,
        block_controls(blocks),
        blocks.episode,
        spread,
        sysid_ref,
        np.array(sorted({episode_fingerprint(e) for e in train_eps + held}), dtype="<U64"),
        policy_pairs(held, norm),
    )
    cal.save(run_dir)
    if model.cfg.image_keys:  # the visual gap's real-vs-real null (checks/visual.py)
        from wmcheck.checks.visual import calibrate_visual

        say("  visual: real-vs-real frame distances in the world model's image embedding")
        calibrate_visual(model, held, train_eps).save(run_dir)
    say(f"  calibration written to {run_dir / 'calibration.json'} ({info['seconds']} s)")
    if read_card(run_dir) is None:  # a run trained before the card: write it, so R9 applies to it too
        card = card_for_run(bundle, log_path)
        if card is not None:
            write_card(run_dir, card)
            say("  model-quality card written to " + str(run_dir / "quality.json"))
    return cal


def card_for_run(bundle: ModelBundle, log_path: Path):
    """The quality card of a trained model on its own held-out split (training/quality.py)."""
    from wmcheck.training.config import RunConfig
    from wmcheck.training.datamodule import LogDataModule

    t = RunConfig.from_dict(bundle.run_config).train
    dm = LogDataModule(log_path, t)
    dm.prepare()
    return compute_card(bundle.model, dm, t.openloop_context, max(t.openloop_horizons), seed=t.seed)


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


def training_log(run_dir: Path) -> Path:
    """The log a run was trained on (RUNDIR/data.json)."""
    data = run_dir / "data.json"
    if not data.exists():
        raise UserError(
            f"{run_dir} does not say which log it was trained on", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`"
        )
    return Path(json.loads(data.read_text())["log"])
