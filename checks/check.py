"""`wmcheck check` as a function: checked trajectories in, a versioned report dict out.

Owns the order of a check, in three stages (each in its own module):
  1. evidence  score the checked blocks (scoring.py), decide competence per block and run the
               divergence tests (divergence.py), the gap tests through the model (gap_tests.py),
               the visual test (visual.py), the distribution test and, with a policy, the
               closed-loop policy check (policy_check.py); all of it typed (evidence.py);
  2. decision  `decision.decide`: the only place where a verdict is decided (its docstring lists
               every rule); the power table (power.power_table) calls the same function;
  3. report    report_build.py words the evidence and the decision; this module assembles the
               report dict (figures' data under private `_` keys for the HTML and TensorBoard).
The false-alarm budget alpha is split by config.split_alpha and decision.Levels: half for the
divergence tests, half for the five gap tests (config.GAP_TESTS); a model with cameras adds the visual test at alpha.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmcheck.checks import report_build as rb
from wmcheck.checks.blocks import Blocks, block_controls, block_states, make_blocks
from wmcheck.checks.calibration import Calibration, load_calibrated
from wmcheck.checks.config import POWERED_GAPS, ROW_GAPS, SCORES, CheckConfig, Gate
from wmcheck.checks.decision import Decision, Levels, decide, strength
from wmcheck.checks.divergence import competent_blocks, divergence_evidence, endings_left_out, score_arrays
from wmcheck.checks.endings import end_profiles, ending_evidence, ends_inside, run_on_applies, terminates
from wmcheck.checks.evidence import CheckEvidence, DistributionEvidence, GapEvidence, PowerEvidence
from wmcheck.checks.folds import FoldModels, deal
from wmcheck.checks.gap_tests import GapContext, run_gap_tests
from wmcheck.checks.model_log import read_log_for_model
from wmcheck.checks.policy_check import EpisodeBlocks, PolicyRun, policy_section
from wmcheck.checks.policy_match import DECLARATIONS, PolicyShift, policy_pairs, policy_shift_test
from wmcheck.checks.power import cached_power_table
from wmcheck.checks.regimes import find_regimes
from wmcheck.checks.scoring import BlockScores, latent_features
from wmcheck.checks.stats import block_mmd_test, conformal_p, separation
from wmcheck.checks.visual import VisualCalibration, checked_video, require_frames, visual_gap
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.json_safe import json_safe
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.version import version
from wmcheck.training.checkpoint import file_sha256
from wmcheck.training.quality import QualityCard, read_card

REPORT_VERSION = 3  # 2: adds the `policy` and `regimes` sections; 3: the `inconclusive` verdict (exit 3)
NEXT_STEPS = rb.NEXT_STEPS
STRENGTH_MEANING = (
    "largest ratio of a test to its threshold (level / p for the divergence tests, statistic / null quantile "
    "for the gap rows): >= 1 means some test fired; it ranks runs, the verdict's rules decide"
)


@dataclass
class CheckInputs:
    """A loaded model, its calibration and the checked log, cut into blocks."""

    bundle: object  # training.checkpoint.ModelBundle
    cal: Calibration
    norm: Normalizer
    meta: object  # datasets.episode.LogMeta of the checked log
    episodes: list  # every checked Episode
    checked: list  # the Episodes long enough for a block
    blocks: Blocks | None  # None: every episode is shorter than a block
    quality: QualityCard | None = None  # RUNDIR/quality.json (None: a run trained before the card)

    @property
    def cfg(self) -> CheckConfig:
        return self.cal.config

    @property
    def dt(self) -> float | None:
        return self.meta.dt or self.bundle.channels.get("dt")


def _model_quality(inp: CheckInputs):
    """The quality card's competence at the check's horizon (None for a run without a card)."""
    return inp.quality.competence(inp.cfg.horizon) if inp.quality is not None else None


def load_inputs(run_dir: Path, rollouts: Path) -> CheckInputs:
    bundle, cal = load_calibrated(run_dir)
    norm = Normalizer.from_dict(bundle.normalizer)
    meta, episodes = read_log_for_model(rollouts, bundle.channels)
    require_frames(bundle.model, episodes, rollouts)
    cfg = cal.config
    if not any(e.num_steps for e in episodes):
        raise UserError(f"{rollouts}: no episode has a single step", "record or import episodes with steps")
    try:
        blocks = make_blocks(episodes, norm, cfg.context, cfg.horizon)
    except ValueError:  # every episode is shorter than a block: only the ending test can speak (R8)
        blocks = None
    checked = [e for e in episodes if e.id not in blocks.skipped] if blocks is not None else []
    if isinstance(bundle.model, FoldModels):  # no fold model trained on them: each scored by one, in turn
        bundle.model = bundle.model.assigned(deal([e.id for e in episodes], len(bundle.model)))
    return CheckInputs(bundle, cal, norm, meta, episodes, checked, blocks, read_card(run_dir))


def run_check(
    run_dir: str | Path,
    rollouts: str | Path,
    gate: Gate | None = None,
    command: str | None = None,
    seed: int = 0,
    policy: PolicyRun | None = None,
    clip_model: str | Path | None = None,
    checked_policy: str = "auto",
) -> dict:
    """Check the rollouts in `rollouts` against the model in `run_dir`; with `policy` (the policy and
    env that recorded them), also the closed-loop policy check; with `clip_model` (local CLIP
    weights), also CLIP image-embedding distances for camera logs; `checked_policy` (policy_match.
    DECLARATIONS): whether the checked commands come from the real logs' policy ("logs"), from
    another ("other"), or as the policy-shift test says ("auto")."""
    if checked_policy not in DECLARATIONS:
        raise UserError(
            f"--checked-policy must be one of {', '.join(DECLARATIONS)}, got {checked_policy!r}",
            "use logs (the checked commands come from the real logs' controller), other, or auto (the test decides)",
        )
    t0 = time.perf_counter()
    run_dir, rollouts, gate = Path(run_dir), Path(rollouts), gate or Gate()
    inp = load_inputs(run_dir, rollouts)
    cfg, cal, model = inp.cfg, inp.cal, inp.bundle.model
    if policy is not None and isinstance(model, FoldModels):
        raise UserError(
            f"{run_dir} is a cross-fitted run: the closed-loop policy check needs one model",
            "check the recorded rollouts against it (without --policy), or the policy against a run "
            "trained without --folds",
        )
    alpha = float(gate.alpha or cfg.alpha)
    levels = Levels.for_check(alpha, len(inp.checked))
    ending = ending_evidence(
        inp.episodes, cal.info.get("real_endings"), levels.gap, inp.norm.range["obs"], _end_profiles(inp, model)
    )
    if inp.blocks is None:
        shift = _policy_shift(inp, alpha, seed, checked_policy)  # it needs no block: another policy ends otherwise
        return _short_check(inp, ending, levels, gate, rollouts, command, t0, shift)
    sc = cal.score(model, inp.blocks, seed)
    rng = np.random.default_rng(seed)
    comp = _competence(sc, cal, gate)
    comp_idx = np.flatnonzero(comp.competent)
    twin = _real_twins(inp.blocks, cal, len(inp.bundle.channels.get("action_names", [])))  # (n,) once per check
    flagged = _flagged_blocks(sc, cal, comp.competent & ~_left_to_ending(inp), alpha)  # the blocks the tests judge
    div = _divergence(inp, sc, comp.competent, twin)
    _episode_details(div, inp, sc, flagged, alpha)
    gt = run_gap_tests(
        GapContext(
            model,
            inp.norm,
            cal,
            inp.checked,
            inp.blocks,
            sc,
            comp_idx,
            levels.gap,
            gate.tolerances,
            rng,
            seed,
            inp.meta.dt,
            {**inp.bundle.channels.get("units", {}), **(inp.meta.units or {})},
            twin,
        )
    )
    corrected = div if gt.corrected_scores is sc else _divergence(inp, gt.corrected_scores, comp.competent, twin)
    visual_row = _visual(model, run_dir, inp.checked, alpha, clip_model, gate.tolerances.visual)
    gaps = {**gt.gaps, "visual": _visual_evidence(visual_row), "ending": ending}
    dist = _distribution(inp, comp, gate, alpha, rng)
    policy_shift = _policy_shift(inp, alpha, seed, checked_policy)
    pol = None
    if policy is not None:
        pol = policy_section(
            model,
            inp.norm,
            inp.episodes,
            policy,
            _episode_blocks(inp, sc, comp, flagged),
            gate.policy,
            alpha,
            _onset_threshold(cal, alpha),
            cfg.context,
            inp.dt,
            inp.norm.names["obs"],
            cal.info,
            rng,
            seed,
        )
    # the power of a check of this size is a property of the model and its calibration, not of the
    # checked data: the calibration's seed, so that two checks of equal size get the same table
    power = cached_power_table(run_dir, cal, max(len(comp_idx), 1), alpha, cfg.power_target, cfg.seed)
    policy_passed = None if pol is None else bool(pol["gate"]["passed"])
    ev = CheckEvidence(
        div,
        gaps,
        dist,
        corrected,
        policy_passed,
        _power_evidence(power, inp, gate, ending),
        _model_quality(inp),
        policy_shift,
    )
    dec = decide(ev, levels, gate.allow_unverifiable)
    report = _report(inp, sc, comp, ev, dec, levels, visual_row, power, pol, gate, alpha, seed)
    report["provenance"] = _provenance(inp, rollouts, command, t0)
    report["_embedding"] = _embedding(model, inp.blocks, cal, rng)
    report["_video"] = checked_video(model, inp.blocks, np.argsort(-sc.divergence)[:6], cfg.context)
    return report


def _short_check(
    inp: CheckInputs,
    ending: GapEvidence,
    levels: Levels,
    gate: Gate,
    rollouts: Path,
    command,
    t0,
    policy_shift: PolicyShift | None = None,
) -> dict:
    """Every checked episode is shorter than a block: no score through the model can be compared
    with the calibration, but how the episodes end can (rule R8: inconclusive unless that fails),
    and whether another policy may have ended them so (R4b: `policy_shift`)."""
    from wmcheck.checks.evidence import DivergenceEvidence, PooledEvidence

    L = inp.cfg.context + inp.cfg.horizon
    why = f"no checked episode has the {L} steps a block needs (context {inp.cfg.context} + horizon {inp.cfg.horizon})"
    gaps = {g: GapEvidence.not_checked(g, why) for g in ROW_GAPS} | {"ending": ending}
    ev = CheckEvidence(
        DivergenceEvidence([], PooledEvidence({s: float("nan") for s in SCORES})),
        gaps,
        None,
        None,
        None,
        _power_evidence({}, inp, gate, ending),
        _model_quality(inp),
        policy_shift,
    )
    dec = decide(ev, levels, gate.allow_unverifiable)
    rows = rb.gap_rows(
        ev, dec, {"verdict": "not_checked", "evidence": None, "estimate": None, "ci": None, "explanation": why}
    )
    lengths = sorted({int(e.num_steps) for e in inp.episodes})
    report = {
        "report_version": REPORT_VERSION,
        "verdict": dec.verdict,
        "exit_code": dec.exit_code,
        "summary": {
            "score": None,
            "score_meaning": "not computed: no block could be scored",
            "evidence_strength": rb.r4(strength(ev, levels)),
            "evidence_strength_meaning": STRENGTH_MEANING,
            "top_gap": dec.top_gap,
            "confounded": dec.confounded,
            "episodes": 0,
            "consistent": 0,
            "divergent": 0,
            "unverifiable": 0,
            "skipped_short_episodes": {str(e.id): int(e.num_steps) for e in inp.episodes},
            "blocks": 0,
            "competent_blocks": 0,
            "pooled_p_values": {},
            "pooled_test": "not run: " + why,
            "failing": list(dec.failing),
            "missing_power": list(dec.missing_power),
            "alpha": levels.alpha,
            "tolerated_by_gate": dec.tolerated_by_gate,
            "message": rb.short_message(dec, ev, rows, why, len(inp.episodes), lengths),
        },
        "episodes": [],
        "gaps": rows,
        "divergence_curve": {"horizon_steps": [], "checked_mean": [], "real_mean": [], "real_q": []},
        "channels": [],
        "regimes": None,
        "power": {"n_blocks": 0, "target": inp.cfg.power_target, "alpha": levels.alpha, "gaps": {}},
        "thresholds": {
            "source": gate.source if gate.source != "defaults" else "calibration",
            "alpha": levels.alpha,
            "gap_alpha": levels.gap,
            "calibration_blocks": int(len(inp.cal.real.divergence)),
            "calibration_episodes": len(inp.cal.info.get("held_out_episodes", [])),
        },
        "policy": None,
        "figures": None,
    }
    report["provenance"] = _provenance(inp, rollouts, command, t0)
    return report


@dataclass
class Competence:
    competent: np.ndarray  # (n,) bool per block
    support_bound: float
    support_alpha: float
    coverage: float  # share of checked steps within the 99 % range of held-out real steps' distances
    real_step_q: float


def _competence(sc: BlockScores, cal: Calibration, gate: Gate) -> Competence:
    cfg, real = cal.config, cal.real
    a_sup = float(gate.score_alpha.get("support", cfg.competence_alpha))
    a_dis = float(gate.score_alpha.get("disagreement", cfg.competence_alpha))
    bound = cal.support_bound(a_sup)
    competent = competent_blocks(sc.support_steps, sc.disagreement, bound, real.disagreement, a_dis)
    q = cal.support_bound(0.01)
    return Competence(competent, bound, a_sup, float((sc.support_steps <= q).mean()), q)


def _onset_threshold(cal: Calibration, alpha: float) -> np.ndarray:
    return np.quantile(cal.real.div_curve, 1 - alpha, axis=0)  # (H,) per-horizon threshold for the onset


def _p_floor(cal: Calibration, alpha: float) -> float:
    """The conformal p a block must reach to be flagged: alpha, or (with few calibration blocks,
    where p cannot go below 1/(m+1)) a score above every real block."""
    return max(alpha, 1.0 / (len(cal.real.divergence) + 1))


def _flagged_blocks(sc: BlockScores, cal: Calibration, competent: np.ndarray, alpha: float) -> np.ndarray:
    """(n,) competent blocks that some score flags (conformal p at or below `_p_floor`)."""
    block_p = np.min(np.stack([conformal_p(getattr(sc, s), getattr(cal.real, s)) for s in SCORES]), 0)  # (n,)
    return competent & (block_p <= _p_floor(cal, alpha))


def _end_profiles(inp: CheckInputs, model, most: int = 200) -> dict:
    """The model's end profiles (endings.end_profiles) of the checked episodes that terminate inside
    the real logs' range and, where the run-on test applies, of every checked episode: at most
    `most` of each, evenly spread (a share of expected terminations and a rank test need no more)."""
    ends = [e for e in inp.episodes if terminates(e) and ends_inside(e, inp.norm.range["obs"])]
    runs = inp.episodes if run_on_applies(inp.cal.info.get("real_endings")) else []
    probed = {int(e.id): e for e in _spread(ends, most) + _spread(runs, most)}
    return end_profiles(model, list(probed.values()), inp.norm)


def _spread(items: list, most: int) -> list:
    """At most `most` of `items`, evenly spread."""
    if len(items) <= most:
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, most).round().astype(int)]


def _left_to_ending(inp: CheckInputs) -> np.ndarray:
    """(n,) the blocks that end at a termination, where the real logs terminate too: the divergence
    tests leave them to the ending test where their null holds few real endings (divergence.py,
    `endings_left_out`). Where no real episode terminates, a checked ending (a goal no real log
    reached) stays in those tests: their competence tests are what says the model has never seen it."""
    if not (inp.cal.info.get("real_endings") or {}).get("terminated") or not endings_left_out(inp.cal.real_ending):
        return np.zeros(len(inp.blocks), bool)
    return inp.blocks.ending


def _divergence(inp: CheckInputs, sc: BlockScores, competent: np.ndarray, twin: np.ndarray):
    """The divergence tests (twin (n,): each block's real twin or -1, from `_real_twins`)."""
    cal = inp.cal
    return divergence_evidence(
        score_arrays(sc),
        score_arrays(cal.real),
        cal.real_episode,
        inp.blocks.episode,
        competent,
        twin,
        _left_to_ending(inp),
        cal.real_ending,
    )


def _episode_details(div, inp: CheckInputs, sc: BlockScores, flagged: np.ndarray, alpha: float) -> None:
    """The report's details per episode (name, steps, score, mean scores, onset), in place."""
    cal, blocks = inp.cal, inp.blocks
    div_q = _onset_threshold(cal, alpha)
    by_id = {e.id: e for e in inp.checked}
    for e in div.episodes:
        idx = np.flatnonzero(blocks.episode == e.id)
        e.name, e.steps = by_id[e.id].name, int(by_id[e.id].num_steps)
        e.score = max(separation(getattr(sc, s)[idx], getattr(cal.real, s)) for s in SCORES)
        e.mean_scores = {s: float(v[idx].mean()) for s, v in score_arrays(sc).items()}
        for b in idx[flagged[idx]]:  # the first flagged competent block: where divergence starts
            over = np.array([], int)
            if conformal_p(sc.divergence[b], cal.real.divergence)[0] <= _p_floor(cal, alpha):
                over = np.flatnonzero(sc.div_curve[b] > div_q)
            e.onset_step = int(blocks.start[b] + inp.cfg.context + (over[0] if len(over) else 0))
            break


def _power_evidence(power: dict, inp: CheckInputs, gate: Gate, ending: GapEvidence) -> PowerEvidence:
    """What the power table says a check of this size could detect, whether the ending row could
    have fired at all (its best case, endings.EndingPower); the types a pass needs."""
    drivers = {"latency": inp.norm.dim("action") + inp.norm.dim("input"), "actuator": inp.norm.dim("action")}
    applies = [g for g in POWERED_GAPS if drivers.get(g, 1) > 0]
    required = tuple(gate.require_power) if gate.require_power is not None else tuple(applies)
    ending_power = getattr(ending.detail, "power", None)
    return PowerEvidence(
        {g: row["smallest_detected"] is not None for g, row in power.items()},
        all(row.get("reliable", True) for row in power.values()),
        len(inp.cal.info.get("held_out_episodes", [])),
        required,
        ending_power is not None and ending_power.detectable,
    )


def _visual_evidence(row: dict) -> GapEvidence:
    """The visual test's outcome (visual.py words its own row; the decision reads this)."""
    if row["verdict"] == "not_checked":
        return GapEvidence.not_checked("visual", row["explanation"])
    return GapEvidence("visual", row["evidence"], within_tolerance=(row["verdict"] == "tolerated"))


def _distribution(inp: CheckInputs, comp: Competence, gate: Gate, alpha: float, rng) -> DistributionEvidence:
    mmd, p = block_mmd_test(
        list(block_states(inp.blocks)),
        list(inp.cal.real_states),
        rng,
        x_groups=inp.blocks.episode,
        y_groups=inp.cal.real_episode,
    )
    return DistributionEvidence(
        float(p),
        float(mmd),
        comp.coverage,
        float(1 - comp.competent.mean()),
        gate.tolerances.distribution.min_coverage,
        alpha,
    )


def _policy_shift(inp: CheckInputs, alpha: float, seed: int, declared: str = "auto") -> PolicyShift | None:
    """Whether the checked commands follow the held-out real episodes' policy (policy_match.py), on
    its own random stream (it does not move the other tests' draws), with the team's declaration;
    None without command channels. Every calibration this wmcheck reads (version 8 on) stores the
    real pairs of a model with commands."""
    if inp.norm.dim("action") == 0:
        return None
    return policy_shift_test(
        policy_pairs(inp.episodes, inp.norm),
        inp.cal.real_policy,
        alpha,
        np.random.default_rng([seed, 4]),
        declared=declared,
    )


def _episode_blocks(inp: CheckInputs, sc: BlockScores, comp: Competence, flagged: np.ndarray) -> EpisodeBlocks:
    ep = inp.blocks.episode
    return EpisodeBlocks(
        flagged={int(e.id): bool(flagged[ep == e.id].any()) for e in inp.checked},
        coverage={int(e.id): float((sc.support_steps[ep == e.id] <= comp.real_step_q).mean()) for e in inp.checked},
        support_steps={int(e.id): int(sc.support_steps[ep == e.id].size) for e in inp.checked},
    )


def _report(
    inp: CheckInputs,
    sc,
    comp: Competence,
    ev: CheckEvidence,
    dec: Decision,
    levels: Levels,
    visual_row: dict,
    power: dict,
    pol,
    gate: Gate,
    alpha: float,
    seed: int,
) -> dict:
    cfg, real, blocks = inp.cfg, inp.cal.real, inp.blocks
    comp_idx = np.flatnonzero(comp.competent)
    rows = rb.gap_rows(ev, dec, visual_row)
    sel = comp_idx if len(comp_idx) else slice(None)
    score = max(separation(getattr(sc, s)[sel], getattr(real, s)) for s in SCORES)
    return {
        "report_version": REPORT_VERSION,
        "verdict": dec.verdict,
        "exit_code": dec.exit_code,
        "summary": {
            "score": round(float(score), 4),
            "score_meaning": (
                "largest over scores of max(AUC, 1 - AUC), AUC = P(a checked block scores worse than a held-out "
                "real block): 0.5 = like reality, 1 = every checked block worse (or every one better: smoother "
                "than reality) than every real block"
            ),
            "evidence_strength": rb.r4(strength(ev, levels)),
            "evidence_strength_meaning": STRENGTH_MEANING,
            "top_gap": dec.top_gap,
            "confounded": dec.confounded,
            "episodes": len(dec.episodes),
            "consistent": dec.count("consistent"),
            "divergent": dec.count("divergent"),
            "unverifiable": dec.count("unverifiable"),
            "skipped_short_episodes": {str(k): v for k, v in blocks.skipped.items()},
            "blocks": int(len(blocks)),
            "competent_blocks": int(len(comp_idx)),
            "pooled_p_values": {k: rb.r4(v) for k, v in ev.divergence.pooled.p_values.items()},
            "pooled_test": rb.pooled_description(ev),
            "failing": list(dec.failing),
            "missing_power": list(dec.missing_power),
            "divergence_confounded": list(dec.divergence_confounded),
            "alpha": alpha,
            "tolerated_by_gate": dec.tolerated_by_gate,
            "message": rb.message(dec, ev, rows, power, levels, pol)
            + rb.short_episodes_sentence(blocks.skipped, len(inp.episodes), inp.cfg.context, inp.cfg.horizon),
            "unattributed": rb.unattributed_entry(dec, ev, rows),
        },
        "episodes": [rb.episode_entry(e, dec.episodes[e.id], inp.meta.dt) for e in ev.divergence.episodes],
        "gaps": rows,
        "divergence_curve": {
            "horizon_steps": list(range(1, cfg.horizon + 1)),
            "checked_mean": rb.rlist(sc.div_curve[sel].mean(0)),
            "real_mean": rb.rlist(real.div_curve.mean(0)),
            "real_q": rb.rlist(_onset_threshold(inp.cal, alpha)),
            "real_q_level": 1 - alpha,
        },
        "channels": _channels(sc, real, inp.bundle.channels, comp_idx),
        "regimes": _regimes(sc, blocks, comp.competent, inp.cal, inp.norm, inp.bundle.channels, inp.meta, alpha, seed),
        "power": {"n_blocks": int(max(len(comp_idx), 1)), "target": cfg.power_target, "alpha": alpha, "gaps": power},
        "thresholds": {
            "source": gate.source if gate.source != "defaults" else "calibration",
            "alpha": alpha,
            "competence_alpha": comp.support_alpha,
            "support_bound": comp.support_bound,
            "episode_alpha": levels.episode,
            "pooled_alpha": levels.pooled,
            "gap_alpha": levels.gap,
            "calibration_blocks": int(len(real.divergence)),
            "calibration_episodes": len(inp.cal.info.get("held_out_episodes", [])),
            "calibration_folds": int(inp.cal.info.get("folds", 0)),  # > 0: cross-fitted (checks/folds.py)
            "calibration_extra_logs": [x["log"] for x in inp.cal.info.get("extra_real", [])],
            "calibration_warning": inp.cal.info.get("warning"),
            # the calibrated interval's cross-fitted coverage on the real blocks (None: calibrated before it was measured)
            "interval_coverage": inp.cal.info.get("interval_coverage"),
        },
        "policy": None if pol is None else {k: v for k, v in pol.items() if not k.startswith("_")},
        "figures": {
            "worst_blocks": _plot_data(sc, blocks, comp_idx, inp.norm, inp.bundle.channels, cfg),
            "episodes": _episode_plots(sc, blocks, ev.divergence.episodes, real, inp.norm, cfg, alpha),
            "policy_returns": None if pol is None else pol["_plots"],
        },
    }


def _provenance(inp: CheckInputs, rollouts: Path, command: str | None, t0: float) -> dict:
    return {
        "wmcheck_version": version(),
        "command": command or " ".join(sys.argv),
        "model_sha256": inp.bundle.file_hash,
        "training_data_sha256": inp.bundle.data_hash,
        "rollouts": str(rollouts),
        "rollouts_sha256": file_sha256(rollouts),
        "rollouts_source": inp.meta.source,
        "dt": inp.dt,
        "seconds": round(time.perf_counter() - t0, 1),
        "model_quality": _quality_summary(inp),
    }


def _quality_summary(inp: CheckInputs) -> dict | None:
    """What the report says about the model itself: the quality card at the check's horizon."""
    card = inp.quality
    if card is None:
        return None
    c = card.competence(inp.cfg.horizon)
    steps = [h for h in (1, 4, 16, c.horizon) if h <= card.horizon]
    return json_safe(
        {
            "competent": c.competent,
            "sentence": c.sentence(),
            "horizon": c.horizon,
            "nrmse_world_model": c.world_model,
            "nrmse_arx": c.arx,
            "heldout_episodes": card.heldout_episodes,
            "train_episodes": card.train_episodes,
            "at_steps": {
                str(h): {
                    "world_model": card.nrmse["world_model"][h - 1],
                    "arx": card.nrmse["arx"][h - 1],
                    "persistence": card.nrmse["persistence"][h - 1],
                    "coverage90_raw": card.coverage_raw[h - 1],
                    "coverage90_calibrated": card.coverage_calibrated[h - 1],
                }
                for h in sorted(set(steps))
            },
            "training": card.training,
        }
    )


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
    ref, who = cal.support_ref, "real (training)"
    if isinstance(model, FoldModels):  # each fold model has its own latent space: one fold's blocks only
        k, idx = model.groups(blocks.episode)[0]
        model, blocks, ref, who = model.models[k], blocks.subset(idx), ref[k], f"real (training, fold {k + 1})"
    # at most per_side blocks are observed (a check of 1,000 episodes has 3,000), then per_side steps drawn
    picked = np.sort(rng.choice(len(blocks), size=min(per_side, len(blocks)), replace=False))
    checked = latent_features(model, blocks.subset(picked)).reshape(-1, model.cfg.deter)
    checked = checked[rng.choice(len(checked), size=min(per_side, len(checked)), replace=False)]
    real = ref[rng.choice(len(ref), size=min(per_side, len(ref)), replace=False)]
    return {
        "features": np.concatenate([real, checked]).astype(np.float32),
        "labels": [who] * len(real) + ["checked"] * len(checked),
    }


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


def _channels(sc, real, channels, comp_idx) -> list[dict]:
    idx = comp_idx if len(comp_idx) else slice(None)
    names = channels.get("observation_names", [])
    units = channels.get("units", {})
    return [
        {
            "name": n,
            "unit": units.get(n),
            "nll_checked": round(float(sc.nll_channel[idx, d].mean()), 4),
            "nll_real": round(float(real.nll_channel[:, d].mean()), 4),
            "divergence_checked": round(float(sc.div_channel[idx, d].mean()), 4),
            "divergence_real": round(float(real.div_channel[:, d].mean()), 4),
        }
        for d, n in enumerate(names)
    ]


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
        train_range = np.stack(
            [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])], 1
        )  # (K, 2)
    return find_regimes(
        sc.z_steps,
        sc.err_steps * std,
        physical(block_controls(blocks)),
        competent,
        real.z_steps,
        real.err_steps * std,
        physical(cal.real_controls),
        names,
        list(channels.get("observation_names", [])),
        units,
        alpha,
        seed=seed,
        training_range=train_range,
        checked_episode=blocks.episode,
        real_episode=cal.real_episode,
    )


DRILLDOWN_EPISODES = 4
"""Episodes the report draws one by one: those holding the three most divergent blocks, then the
worst by episode score (as its episode table sorts them)."""


def _block_plot(sc, blocks, b: int, norm, cfg) -> dict:
    """Block b: checked trajectory, predicted mean and 90 % band (raw units), where it starts."""
    mean, std = norm.mean["obs"], norm.std["obs"]
    return {
        "episode": int(blocks.episode[b]),
        "start": int(blocks.start[b]),
        "context": cfg.context,
        "truth": _rows(blocks.batch.obs[b] * std + mean),
        "pred": _rows(sc.pred_mean[b] * std + mean),
        "lo": _rows(sc.pred_lo[b] * std + mean),
        "hi": _rows(sc.pred_hi[b] * std + mean),
    }


def _plot_data(sc, blocks, comp_idx, norm, channels, cfg) -> dict:
    """The three most divergent blocks: checked trajectory, predicted mean and 90 % band (raw units)."""
    return {
        "worst_blocks": [_block_plot(sc, blocks, b, norm, cfg) for b in _worst_blocks(sc)],
        "names": channels.get("observation_names", []),
    }


def _worst_blocks(sc, n: int = 3) -> list[int]:
    """The n most divergent blocks, most divergent first."""
    return [int(i) for i in np.argsort(-sc.divergence)[:n]]


def _episode_plots(sc, blocks, episodes, real, norm, cfg, alpha: float) -> dict:
    """The report's drill-down, for DRILLDOWN_EPISODES episodes (see there): each block's start step
    and divergence score along the episode, and its most divergent block's overlay data; with the
    held-out real blocks' median and (1 - alpha) quantile of the same score to read them against."""
    worst_blocks = [int(blocks.episode[b]) for b in _worst_blocks(sc)]
    scored = [e for e in episodes if e.blocks and np.isfinite(e.score)]  # an episode without blocks has none
    by_score = [int(e.id) for e in sorted(scored, key=lambda x: -x.score)]
    out = []
    for eid in list(dict.fromkeys(worst_blocks + by_score))[:DRILLDOWN_EPISODES]:
        idx = np.flatnonzero(blocks.episode == eid)
        idx = idx[np.argsort(blocks.start[idx])]
        worst = int(idx[np.argmax(sc.divergence[idx])])
        out.append(
            {
                "episode": eid,
                "block_start": [int(x) for x in blocks.start[idx]],
                "divergence": rb.rlist(sc.divergence[idx]),
                "worst_block": _block_plot(sc, blocks, worst, norm, cfg),
            }
        )
    return {
        "episodes": out,
        "real_divergence_median": rb.r4(np.median(real.divergence)),
        "real_divergence_q": rb.r4(np.quantile(real.divergence, 1 - alpha)),
        "real_q_level": 1 - alpha,
    }


def _rows(a: np.ndarray) -> list:
    """(T, D) -> nested lists at 5 significant digits (report.json stays small)."""
    return [[float(f"{v:.5g}") for v in row] for row in np.asarray(a, float)]
