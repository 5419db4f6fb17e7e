"""Calibration on held-out real episodes: the null distributions every check compares against.

Owns `calibrate(run_dir, log)` and the files it writes next to the model:
  RUNDIR/calibration.json   config, provenance, power table (small, human-readable)
  RUNDIR/calibration.npz    arrays: real block scores, the corrections' scores and fit on real
                            blocks (sysid.py; the grid search matrices with attribution "grid"),
                            the training-latent support reference, injected-gap scores
Held-out = the validation episodes of the model's own split (never trained on), or for a
cross-fitted run (`train --folds K`) every episode of the log, each scored by the fold model that
held it out (checks/folds.py); plus the episodes of `--real` logs. Every statistic
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
from wmcheck.checks.endings import end_profiles, real_endings
from wmcheck.checks.folds import FoldModels, deal, load_fold_models, merge_arrays, per_fold
from wmcheck.checks.model_log import episode_fingerprint, read_log_for_model
from wmcheck.checks.policy_match import PolicyPairs, policy_pairs
from wmcheck.checks.power import PowerSet, halves, injected_power
from wmcheck.checks.scoring import BlockScores, latent_features, score_blocks, with_spread_scale
from wmcheck.checks.stats import left_out_quantiles
from wmcheck.checks.sysid import Reference, reference
from wmcheck.datasets.atomic import atomic_path, write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import training_split
from wmcheck.training.checkpoint import ModelBundle, file_sha256, load_model
from wmcheck.training.conformal import LEVEL, cross_fitted_inside, fit_spread_scale, left_out_scales
from wmcheck.training.crossfit import read_crossfit, single_model_run
from wmcheck.training.quality import compute_card, read_card, write_card

CALIBRATION_VERSION = 14  # 2: per-step errors and controls (regimes); 3: episode of every block (clustered tests);


# 4: searches stored per kind (C, G, n), power entries with named fields; 5: conformal spread scale;
# 6: the power entries' open-loop bias cells (bias.py); 7: the corrections' fit reference (sysid.py);
# 8: the held-out episodes' (conditions, command) pairs (policy_match.py); 9: the divergence score is the
# share of open-loop cells outside the 90 % interval (scoring.exceedance_share), not the mean z^2;
# 10: the held-out blocks' open-loop predicted means (the bias test's response cells, bias.py);
# 11: the real blocks scored with left-out spread scales, every open-loop draw from its own posterior, and
# the power table's episode t with the pooled variance (stats.episode_t); 12: the blocks of an episode that
# terminates run back from its termination, and the blocks that end there are marked (real_ending; blocks.py);
# the model's end probability at the held-out real terminations (info real_endings, endings.py); 13: the
# held-out episodes' steps run on after an expected end (info real_endings held_out_run_on, endings.py);
# 14: the power set's motion gaps, the dynamics row's power (power.MOTION_GAPS)
@dataclass
class Calibration:
    config: CheckConfig
    info: dict  # provenance and sizes
    real: BlockScores
    real_search: SearchMatrices
    real_states: np.ndarray  # (n, k, D + A + E) states visited by the held-out blocks (distribution test)
    support_ref: np.ndarray  # (M, deter); a cross-fitted run's: (K, M, deter), one reference per fold model
    support_scale: float | np.ndarray  # a float; a cross-fitted run's: (K,)
    power: PowerSet
    real_controls: np.ndarray | None = None  # (n, H, A + E) operating conditions of the held-out steps (regimes)
    real_episode: np.ndarray | None = None  # (n,) held-out episode id of every real block (the clusters)
    spread_scale: np.ndarray | None = None  # (H, D) conformal scale of the predictive std (training/conformal.py)
    sysid: Reference | None = None  # the corrections' fit on the real blocks (sysid.py; None with attribution "grid")
    known_episodes: np.ndarray | None = None  # (m,) content hashes of every real episode the model or its
    # thresholds rest on (training log and --real extras): never new data for the monitor
    real_policy: PolicyPairs | None = None  # what the held-out episodes' commands were chosen on (policy_match.py)
    real_ending: np.ndarray | None = None  # (n,) bool: the real block ends at its episode's termination (blocks.py)

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

    def left_out_support_bounds(self, alpha: float) -> np.ndarray:
        """(n,) per real block, `support_bound` from the steps of the other held-out episodes: the
        bound the block's own episode would meet as a new one (it is not in-sample for it)."""
        return left_out_quantiles(self.real.support_steps, self.real_episode, 1 - alpha)

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
        if self.real_ending is not None:
            arrays["real_ending"] = self.real_ending
        with atomic_path(run_dir / "calibration.npz", suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)
        meta = {
            "calibration_version": CALIBRATION_VERSION,
            "config": self.config.to_dict(),
            "info": self.info,
            "support_scale": np.asarray(self.support_scale).tolist(),  # a float, or one per fold
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
            meta["support_scale"] if isinstance(meta["support_scale"], float) else np.asarray(meta["support_scale"]),
            PowerSet.from_arrays(arrays, meta["power"]),
            arrays.get("real_controls"),
            arrays.get("real_episode"),
            arrays.get("spread_scale"),
            Reference.from_arrays(arrays),
            arrays.get("known_episodes"),
            PolicyPairs.from_arrays(arrays),
            arrays.get("real_ending"),
        )


def load_run(run_dir: str | Path) -> ModelBundle:
    """RUN's model: its model.pt, or for a cross-fitted run (training/crossfit.py) its fold models
    as one bundle whose model is a FoldModels (checks/folds.py)."""
    info = read_crossfit(run_dir)
    return load_model(run_dir) if info is None else load_fold_models(run_dir, info)


def load_calibrated(run_dir: str | Path, one_model_for: str | None = None) -> tuple[ModelBundle, Calibration]:
    """A run's model and its calibration, refused (UserError) when the calibration was made for
    another model.pt or does not say which (a missing hash is no match either). `one_model_for`
    (a command's name): that command needs one model, and a cross-fitted run is refused."""
    run_dir = Path(run_dir)
    if one_model_for is not None:
        single_model_run(run_dir, one_model_for)
    bundle = load_run(run_dir)
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


def interval_coverage(r: np.ndarray, episodes: np.ndarray, held: list, strata: dict | None = None) -> dict:
    """What the checks' calibrated interval is worth: its coverage of the real blocks' truth per
    horizon step (mean over channels) and per channel (mean over steps), cross-fitted (the scale
    fitted on one half of the held-out episodes, scored on the other, and back; the halves hold
    each fold equally, as the power table's do).
    r (B, H, D) absolute standardised errors of the real blocks, episodes (B,) their episode ids,
    strata the fold of each episode id (a cross-fitted run) or None."""
    first, _ = halves(held, strata)
    inside = cross_fitted_inside(r, episodes, first_half=np.isin(episodes, [e.id for e in first]))
    H, D = r.shape[1:]
    per_step = np.full(H, np.nan) if inside is None else inside.mean((0, 2))  # (H,)
    per_channel = np.full(D, np.nan) if inside is None else inside.mean((0, 1))  # (D,)

    def rounded(a: np.ndarray) -> list:
        return [round(float(c), 4) if np.isfinite(c) else None for c in a]

    ok = np.isfinite(per_step)
    return {
        "level": LEVEL,
        "per_step": rounded(per_step),
        "per_channel": rounded(per_channel),
        "min": float(per_step[ok].min()) if ok.any() else None,
        "max": float(per_step[ok].max()) if ok.any() else None,
        "episodes": len(held),
    }


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
    bundle: ModelBundle = load_run(run_dir)
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
    folds = model.assignment if isinstance(model, FoldModels) else None
    if folds is not None and cfg.attribution == "grid":
        raise UserError(
            "a cross-fitted run is calibrated with the corrections' fit, not the grid searches",
            "drop --attribution grid (the fit is the default)",
        )
    train_cfg = bundle.run_config["train"]
    with open_log(log_path) as log:
        if folds is not None:  # every episode is held out once, by the fold model that did not train on it
            if set(folds) != set(log.episode_ids):
                raise UserError(
                    f"{run_dir}/crossfit.json does not list the episodes of {log_path}",
                    f"train the run again: `wmcheck train {log_path} --out {run_dir} --folds {len(model)}`",
                )
            val_ids = sorted(folds)
            train_sets = [[i for i in val_ids if folds[i] != k] for k in range(len(model))]
        else:
            train_ids, val_ids = training_split(
                log.episode_ids,
                train_cfg["val_fraction"],
                train_cfg["seed"],
                train_cfg.get("folds", 0),
                train_cfg.get("fold", 0),
            )
            train_sets = [train_ids]
        if not val_ids and not extra_real:
            raise UserError(
                "the model has no held-out episodes to calibrate on",
                "train with --val-fraction > 0 (e.g. 0.2), or pass real logs it never saw with --real",
            )
        by_id = {e.id: e for e in log.episodes(sorted(set(val_ids).union(*train_sets)))}
    held = [by_id[i] for i in val_ids]
    train_eps = [by_id[i] for i in sorted(set().union(*train_sets))]  # every episode some model trained on
    first_extra = max(by_id) + 1
    extra, extra_prov = extra_real_episodes(extra_real or [], bundle.channels, train_eps, first_extra)
    held += extra
    if folds is not None:  # the extra real episodes no fold trained on: dealt over the folds
        model = model.assigned({**folds, **deal([e.id for e in extra], len(model))})
    cfg, note = cfg.fitted_to([e.num_steps + 1 for e in held])
    if note:
        say(f"calibrating: {note}")
    try:
        blocks = make_blocks(held, norm, cfg.context, cfg.horizon)
    except ValueError as exc:
        raise UserError(
            f"held-out episodes too short: {exc}", "use a shorter --horizon/--context or longer episodes"
        ) from None
    say(
        f"calibrating on {len(held)} held-out episodes ({len(blocks)} blocks of {blocks.length} steps"
        + (f"; {len(extra)} from {len(extra_prov)} extra real log(s))" if extra else ")")
        + (f", each scored by the one of {len(model)} fold models that held it out" if folds is not None else "")
    )
    ref, scale, n_latents = support_reference(model, [[by_id[i] for i in ids] for ids in train_sets], blocks, norm, cfg)
    real = score_blocks(model, blocks, cfg.samples, ref, scale, seed=cfg.seed)
    # The model's own spread under-covers open loop; the conformal scale fitted on these blocks
    # makes its 90 % band cover 90 % of them at every step and channel, and every score uses it.
    # The real blocks themselves are scored with the scale fitted without their episode, so they
    # are not in-sample for it (conformal.left_out_scales).
    r = np.abs(real.z_steps)  # (B, H, D)
    spread = fit_spread_scale(r)  # (H, D)
    strata = model.assignment if folds is not None else None  # halves (coverage, power) hold each fold equally
    coverage = interval_coverage(r, blocks.episode, held, strata)
    real = with_spread_scale(real, left_out_scales(r, blocks.episode))
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
    power = injected_power(model, norm, cfg, held, blocks, real, spread, strata)
    reward_err, reward_std = reward_resolution(model, blocks)
    trained = {e.id for e in train_eps}
    distinct = train_eps + [e for e in held if e.id not in trained]  # every real episode once
    info = {
        "log": str(log_path),
        "log_sha256": data_hash,
        "model_sha256": bundle.file_hash,
        "reward_abs_error_per_step": reward_err,
        "reward_std_real": reward_std,
        "held_out_episodes": [e.id for e in held],
        "extra_real": extra_prov,
        "real_endings": real_endings(distinct, held, end_profiles(model, held, norm), norm.range["obs"]),
        "blocks": len(blocks),
        "block_length": blocks.length,
        "training_latents": n_latents,
        "folds": len(model) if folds is not None else 0,
        "interval_coverage": coverage,
        **({"fold_of": {str(e.id): int(strata[e.id]) for e in held}} if strata else {}),
        "seconds": round(time.perf_counter() - t0, 1),
        "dt": bundle.channels.get("dt"),
    }
    if len(blocks) < 20:
        info["warning"] = (
            f"only {len(blocks)} held-out blocks: thresholds and power are coarse; "
            "hold out more real episodes for sharper checks"
            + (
                ""
                if folds is not None
                else " (`calibrate --real EXTRA.h5`, or `train --folds 5`: every episode held out once)"
            )
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
        np.array(sorted({episode_fingerprint(e) for e in distinct}), dtype="<U64"),
        policy_pairs(held, norm),
        blocks.ending,
    )
    cal.save(run_dir)
    if model.cfg.image_keys:  # the visual gap's real-vs-real null (checks/visual.py)
        from wmcheck.checks.visual import calibrate_visual

        say("  visual: real-vs-real frame distances in the world model's image embedding")
        calibrate_visual(model, held, train_eps).save(run_dir)
    if coverage["min"] is not None:
        say(
            f"  calibrated {LEVEL:.0%} interval: covers {coverage['min']:.2f}-{coverage['max']:.2f} of held-out "
            f"real truth per imagined step (cross-fitted over {coverage['episodes']} episodes)"
        )
    say(f"  calibration written to {run_dir / 'calibration.json'} ({info['seconds']} s)")
    if folds is None and read_card(run_dir) is None:  # a run trained before the card: write it, so R9 applies to it too
        card = card_for_run(bundle, log_path)
        if card is not None:
            write_card(run_dir, card)
            say("  model-quality card written to " + str(run_dir / "quality.json"))
    return cal


def support_reference(model, train_sets: list[list], blocks, norm, cfg: CheckConfig):
    """(reference, scale, latents) of the competence test: up to cfg.support_refs deterministic
    latents of each model's training blocks, (M, deter), or (K, M, deter) with FoldModels, and the
    median distance of the held-out real latents to their own model's reference: a float, or (K,)."""
    rng = np.random.default_rng(cfg.seed)
    models = model.models if isinstance(model, FoldModels) else [model]
    feats = [
        latent_features(m, make_blocks(eps, norm, cfg.context, cfg.horizon)).reshape(-1, m.cfg.deter)
        for m, eps in zip(models, train_sets)
    ]
    size = min(cfg.support_refs, *(len(f) for f in feats))
    refs = [f[rng.choice(len(f), size=size, replace=False)] for f in feats]
    held = latent_features(model, blocks)  # (n, L - C, deter), each block by its own model
    groups = model.groups(blocks.episode) if isinstance(model, FoldModels) else [(0, np.arange(len(blocks)))]
    scales = np.ones(len(models))
    for k, idx in groups:
        d = torch.cdist(torch.from_numpy(held[idx].reshape(-1, held.shape[-1])), torch.from_numpy(refs[k]))
        scales[k] = float(np.median(d.min(1).values.numpy())) or 1.0
    n_latents = int(sum(len(f) for f in feats))
    if isinstance(model, FoldModels):
        return np.stack(refs), scales, n_latents
    return refs[0], float(scales[0]), n_latents


def card_for_run(bundle: ModelBundle, log_path: Path):
    """The quality card of a trained model on its own held-out split (training/quality.py)."""
    from wmcheck.training.config import RunConfig
    from wmcheck.training.datamodule import LogDataModule

    t = RunConfig.from_dict(bundle.run_config).train
    dm = LogDataModule(log_path, t)
    dm.prepare()
    return compute_card(bundle.model, dm, t.openloop_context, max(t.openloop_horizons), seed=t.seed)


def reward_resolution(model, blocks, chunk: int = 64) -> tuple[float, float]:
    """(mean |reward head - logged reward| per step, std of the logged rewards) on held-out real blocks
    (with FoldModels each by its fold's model),
    from filtered (posterior) states: how finely the model can tell returns apart. Policy checks
    treat return differences within this per step as below the model's resolution."""
    errs = per_fold(model, blocks, lambda m, b, k: _reward_errors(m, b, chunk), merge_arrays)
    return float(errs.mean()), float(np.asarray(blocks.batch.reward)[:, 1:].astype(np.float64).std())


def _reward_errors(model, blocks, chunk: int) -> np.ndarray:
    """(n, L - 1) |reward head - logged reward| per block step (column 0 starts a block: no reward)."""
    errs = []
    model.eval()
    with torch.no_grad():
        for _, b in blocks.torch_chunks(chunk):
            obsd, _ = model.observe(b, sample=False)
            pred = model.twohot.mean(model.reward(obsd.state.feat()))  # (n, L) predicts reward[t] = r_{t-1}
            errs.append((pred - b.reward.float())[:, 1:].abs().numpy())
    return np.concatenate(errs)


def training_log(run_dir: Path) -> Path:
    """The log a run was trained on (RUNDIR/data.json)."""
    data = run_dir / "data.json"
    if not data.exists():
        raise UserError(
            f"{run_dir} does not say which log it was trained on", f"pass it: `wmcheck calibrate {run_dir} LOG.h5`"
        )
    return Path(json.loads(data.read_text())["log"])
