"""What a pass is worth: gaps of graded size injected into held-out real episodes, judged by the
check's own decision.

Owns the power set calibration stores (`PowerSet`: half A of the held-out episodes as the null,
half B uninjected as the control, half B with each gap of `POWER_SIZES` injected, each with the
injected gap's own search; `injected_power` builds it) and `power_table`, which draws blocks of half
B as a check of a given size would have them, builds the evidence such a check would have against
half A (evidence.CheckEvidence) and calls decision.decide: the smallest size detected with
probability >= power_target is what a pass is worth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wmcheck.checks.attribution import allowed_corrections, identity_index, search_matrices
from wmcheck.checks.bias import CellLayout, bias_test, calibration_cells, regime_edges
from wmcheck.checks.blocks import block_controls, make_blocks
from wmcheck.checks.config import POWER_GAPS, SCORES, CheckConfig, split_alpha
from wmcheck.checks.evidence import CheckEvidence, GapEvidence
from wmcheck.checks.scoring import BlockScores, score_blocks
from wmcheck.checks.transforms import (
    actuator,
    horizon_motion,
    observation_noise,
    observation_scale,
    observation_smoothing,
    shift_drivers,
)
from wmcheck.datasets.normalize import Normalizer

if TYPE_CHECKING:
    from wmcheck.checks.calibration import Calibration

POWER_SIZES = {
    "latency": (1, 2, 3, 4),  # steps the commands and exogenous inputs are delayed by
    "actuator": (1.1, 1.25, 1.5, 2.0),  # gain on every command channel
    "sensor_noise": (0.05, 0.1, 0.25, 0.5),  # Gaussian noise, x each channel's training std
    "sensor_bias": (0.1, 0.25, 0.5, 1.0),  # bias, x each channel's training std
    "obs_scale": (1.02, 1.05, 1.1, 1.25),  # every observation x size: a proportional bias (fuel 10 % high)
    "smoothing": (3, 5, 9, 17),  # centred moving average over size steps: a simulator cleaner than reality
    "motion_larger": (1.1, 1.25, 1.5, 2.0),  # the horizon moves size x as far as reality's (transforms.horizon_motion)
    "motion_smaller": (0.9, 0.8, 0.67, 0.5),  # ... or as little: a plant that responds less (more damped, slower)
}
MOTION_GAPS = ("motion_larger", "motion_smaller")
"""The dynamics row's power: the plant's physics cannot be changed in a real log, but how far it
moves over a block's horizon can (transforms.horizon_motion, on the cut blocks), in both directions."""
assert tuple(POWER_SIZES) == POWER_GAPS, "config.POWER_GAPS names the power table's gap types"
POWER_UNITS = {
    "latency": "steps",
    "actuator": "gain",
    "sensor_noise": "x channel std",
    "sensor_bias": "x channel std",
    "obs_scale": "x observation",
    "smoothing": "steps (moving average)",
    "motion_larger": "x reality's motion over the horizon",
    "motion_smaller": "x reality's motion over the horizon",
}


POWER_PERMUTATIONS = 999  # the bias test's permutations per draw (bias.PERMUTATIONS in a check)
RESIDUALS = ("resid_std", "resid_mean", "resid_ac1")  # what the residual (sensor / dynamics) tests need
POWER_SCORES = SCORES + RESIDUALS


@dataclass
class PowerEntry:
    """Block statistics of one set of held-out blocks of half B (uninjected, or one injected size)."""

    scores: dict[str, np.ndarray]  # POWER_SCORES -> (n,) or (n, D)
    search_latency: np.ndarray | None = None  # (Ld, n) the delay search on these blocks
    search_gain: np.ndarray | None = None  # (C, G, n) the gain search of every command channel
    allowed_gain: np.ndarray | None = None  # (C, G) the gains the model can judge on these blocks
    bias_cells: np.ndarray | None = None  # (n, cells) open-loop bias per block and cell (bias.py)
    fit_scores: np.ndarray | None = None  # (n, p) the corrections' scores at the identity (sysid.py)

    OPTIONAL = ("search_latency", "search_gain", "allowed_gain", "bias_cells", "fit_scores")

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
    null_ending: np.ndarray | None = None  # (nA,) bool: blocks that end at a termination (blocks.py)
    control_ending: np.ndarray | None = None  # (nB,)

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {f"power/null/{s}": self.null[s] for s in POWER_SCORES}
        out["power/null_episode"] = self.null_episode
        if self.null_ending is not None:
            out["power/null_ending"] = self.null_ending
        if self.control is not None:
            out.update(self.control.to_arrays("power/control/"))
            out["power/control_episode"] = self.control_episode
            if self.control_ending is not None:
                out["power/control_ending"] = self.control_ending
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
            arrays.get("power/null_ending"),
            arrays.get("power/control_ending"),
        )


def power_table(cal: Calibration, n_blocks: int, alpha: float, target: float, reps: int = 100, seed: int = 0) -> dict:
    """Detection probability per injected gap size for a check of n_blocks blocks, and the smallest
    size detected with probability >= target.

    A replicate draws min(n_blocks, available) injected blocks of half B WITHOUT replacement (more
    blocks than exist, with replacement, would replicate blocks and inflate the power), as whole
    episodes in random order (the last one cut; a cross-fitted run's folds in turn, `draw_order`), builds the evidence a check of those blocks would
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
    n = effective_blocks(cal, n_blocks)
    judge = _PowerJudge(cal, n, alpha, rng)

    strata = cal.info.get("fold_of")  # a cross-fitted run's folds: draws take them in turn

    def rate(entry: PowerEntry) -> float:
        hits = 0
        for _ in range(reps):
            order = draw_order(ps.control_episode, rng, strata)
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


def effective_blocks(cal: Calibration, n_blocks: int) -> int:
    """The number of blocks a power-table draw for a check of n_blocks uses: min(n_blocks, the
    blocks of half B), at least 1. Every check at least as large as half B has the same table."""
    control = cal.power.control_episode
    return max(1, min(int(n_blocks), len(control) if control is not None else int(n_blocks)))


POWER_CACHE = "power_cache.json"
"""RUNDIR/power_cache.json: power tables already computed for this calibration, by check size."""
POWER_TABLE_VERSION = 4  # 2: the actuator score test has a cell of one gain on every channel (sysid.COMMON_GAIN);
# 3: the blocks that end at a termination are left out of the divergence tests (divergence.py);
# 4: the dynamics row's motion gaps (MOTION_GAPS)
"""Bumped when a test the power table replays changes, so that a cache written by older code is not
read (a cache from before the version was recorded has none, and is not read either)."""


def cached_power_table(run_dir: Path, cal: Calibration, n_blocks: int, alpha: float, target: float, seed: int) -> dict:
    """`power_table` of a check of n_blocks, computed once per calibration and check size: the
    table depends only on the calibration and these arguments, so a check of a size seen before
    reads it from RUNDIR/power_cache.json (keyed by the calibration's hash; a re-calibration
    starts a new cache, and so does a cache of another POWER_TABLE_VERSION). A run folder that
    cannot be written just goes uncached."""
    from wmcheck.datasets.atomic import write_text_atomic
    from wmcheck.training.checkpoint import file_sha256

    run_dir = Path(run_dir)
    ident = file_sha256(run_dir / "calibration.npz")
    n_blocks = effective_blocks(cal, n_blocks)  # checks larger than half B share one table
    key = f"n={int(n_blocks)} alpha={float(alpha)!r} target={float(target)!r} seed={int(seed)}"
    path = run_dir / POWER_CACHE
    cache = {"calibration_sha256": ident, "power_table_version": POWER_TABLE_VERSION, "tables": {}}
    try:
        stored = json.loads(path.read_text())
        if (
            isinstance(stored, dict)
            and stored.get("calibration_sha256") == ident
            and stored.get("power_table_version") == POWER_TABLE_VERSION
            and isinstance(stored.get("tables"), dict)
        ):
            cache = stored
    except (OSError, ValueError):
        pass
    if key in cache["tables"]:
        return cache["tables"][key]
    table = json.loads(json.dumps(power_table(cal, n_blocks, alpha, target, seed=seed)))  # as the cache returns it
    cache["tables"][key] = table
    try:
        write_text_atomic(path, json.dumps(cache))
    except OSError:
        pass
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
        reference = calibration_cells(cal)  # the held-out blocks' open-loop bias columns (bias.py)
        self.cell_layout = None if reference is None else reference[0]
        self.real_cells = None if reference is None else reference[1]  # (m, Cb)
        self.a_gap = a_gap
        ref = cal.sysid  # the corrections' score tests (sysid.py): layout and half A's scores, once
        self.fit_layout = None if ref is None else ref.layout
        self.fit_null = None if ref is None else ref.scores[self.in_a]
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
        cells = None if self.real_cells is None else self.real_cells[~self.in_a]
        if self.cal.sysid is not None:
            return PowerEntry(c.scores, bias_cells=cells, fit_scores=self.cal.sysid.scores[~self.in_a])
        if not self.has_search:
            return PowerEntry(c.scores, c.search_latency, c.search_gain, c.allowed_gain, cells)
        gain = search.actuator["gain"][:, :, ~self.in_a] if self.thr_gain is not None else None
        return PowerEntry(c.scores, search.latency[:, ~self.in_a], gain, c.allowed_gain, cells)

    def _search_gaps(self, entry: PowerEntry, idx: np.ndarray) -> dict[str, GapEvidence]:
        from wmcheck.checks.attribution import only_allowed, paired_improvement

        out = {g: GapEvidence.not_checked(g, "not simulated") for g in ("latency", "actuator")}
        if self.fit_layout is not None and entry.fit_scores is not None:  # the score tests a check runs
            from wmcheck.checks import sysid

            ps = self.cal.power
            for gap in ("latency", "actuator"):
                cols = self.fit_layout.columns(gap)
                if len(cols):
                    t = sysid.score_test(
                        entry.fit_scores[idx],
                        ps.control_episode[idx],
                        self.fit_null,
                        ps.null_episode,
                        cols,
                        self.a_gap,
                        self.rng,
                        permutations=POWER_PERMUTATIONS,
                        layout=self.fit_layout,
                    )
                    out[gap] = GapEvidence(gap, t.evidence)
            return out
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
            dynamics_share=0.5,
        )
        from wmcheck.checks.attribution import smoothness_evidence

        smooth = smoothness_evidence(
            {k: s[k][idx] for k in ("kl", "nll")},
            ps.control_episode[idx],
            {k: null[k] for k in ("kl", "nll")},
            ps.null_episode,
            split_alpha(self.alpha)[1] / 2,
        )
        dynamics = st.dynamics_evidence
        if self.real_cells is not None and entry.bias_cells is not None:
            bt = bias_test(
                entry.bias_cells[idx],
                ps.control_episode[idx],
                self.real_cells[self.in_a],
                ps.null_episode,
                split_alpha(self.alpha)[1] / 2,
                self.rng,
                permutations=POWER_PERMUTATIONS,
                layout=self.cell_layout,
            )
            dynamics = max(dynamics, bt.evidence)
        return {
            "sensor_noise": GapEvidence("sensor_noise", max(st.sensor_evidence, smooth.evidence)),
            "dynamics": GapEvidence("dynamics", dynamics),
        }

    def detected(self, entry: PowerEntry, idx: np.ndarray) -> bool:
        from wmcheck.checks.decision import Levels, decide
        from wmcheck.checks.divergence import divergence_evidence, endings_left_out

        ps = self.cal.power
        episodes = ps.control_episode[idx]
        ending = None if ps.control_ending is None else ps.control_ending[idx]
        div = divergence_evidence(
            {s: entry.scores[s][idx] for s in SCORES},
            ps.null,
            ps.null_episode,
            episodes,
            ending=ending,
            real_ending=ps.null_ending,
            leave_out=endings_left_out(self.cal.real_ending),  # the check's decision, on every real block
        )
        gaps = {
            **self._search_gaps(entry, idx),
            **self._residual_gaps(entry, idx),
            "visual": GapEvidence.not_checked("visual", "not simulated"),
            "ending": GapEvidence.not_checked("ending", "not simulated"),
        }
        decision = decide(CheckEvidence(div, gaps), Levels.for_check(self.alpha, len(np.unique(episodes))))
        return decision.verdict in ("fail", "unverifiable")  # R8's inconclusive (nothing judged) is no detection


def _inject(gap: str, size, episodes, norm: Normalizer, rng: np.random.Generator):
    if gap == "latency":
        return [shift_drivers(e, -int(size)) for e in episodes]  # commands and inputs act `size` steps late
    if gap == "actuator":
        # A checked system whose commands act `size` times as strongly as reality's: the real
        # motions stay, the logged commands become 1/size of the real ones (this keeps them
        # inside the training range; scaling them up would test the model's extrapolation).
        out = episodes
        for c in range(norm.dim("action")):
            out = [actuator(e, c, gain=1.0 / float(size)) for e in out]
        return out
    if gap == "obs_scale":
        return [observation_scale(e, float(size)) for e in episodes]
    if gap == "smoothing":
        return [observation_smoothing(e, int(size)) for e in episodes]
    std = norm.std["obs"].astype(float)
    if gap == "sensor_noise":
        return [observation_noise(e, std=size * std, rng=rng) for e in episodes]
    return [observation_noise(e, bias=size * std) for e in episodes]


def _fit_scores(model, episodes, blocks, norm: Normalizer, cfg: CheckConfig) -> np.ndarray:
    """(n, p) the corrections' scores at the identity on these blocks (what a check's score test sees)."""
    from wmcheck.checks import sysid

    layout = sysid.Layout.for_normalizer(norm, cfg.max_delay)
    data = sysid.FitData.of(episodes, blocks, norm, layout)
    return sysid.evaluate(model, data, np.zeros(len(layout)), layout, cfg.context, sysid.ATTRIBUTION_HORIZON).grad


def halves(held: list, strata: dict[int, int] | None = None) -> tuple[list, list]:
    """(A, B): the held-out episodes dealt alternately into two halves, each in held order; with
    `strata` (episode id -> fold of a cross-fitted run) alternately within each fold, so that both
    halves hold each fold model's episodes in equal numbers. Folds differ in their score
    level (on 20 Pendulum segments, 5 folds: mean divergence 0.014-0.155 by fold), and halves cut
    across them unevenly (3 episodes of the best fold in A, 1 in B) made the uninjected control
    fail 87 % of its draws."""
    if not strata:
        return held[0::2], held[1::2]
    a: set[int] = set()
    b: set[int] = set()
    for k in sorted(set(strata[e.id] for e in held)):
        ids = [e.id for e in held if strata[e.id] == k]
        first, second = (a, b) if len(a) <= len(b) else (b, a)
        first.update(ids[0::2])
        second.update(ids[1::2])
    return [e for e in held if e.id in a], [e for e in held if e.id in b]


def draw_order(episodes: np.ndarray, rng: np.random.Generator, strata: dict | None = None) -> np.ndarray:
    """Whole episodes in random order for a power-table draw; with `strata` (folds) the folds take
    turns (random order within each fold and of the folds), as a check deals its episodes."""
    unique = np.unique(episodes)
    if not strata:
        return rng.permutation(unique)
    fold = np.array([strata[str(int(e))] for e in unique])
    groups = [rng.permutation(unique[fold == k]) for k in rng.permutation(np.unique(fold))]
    return np.array([g[i] for i in range(max(len(g) for g in groups)) for g in groups if i < len(g)])


def injected_power(
    model,
    norm: Normalizer,
    cfg: CheckConfig,
    held: list,
    blocks,
    real: BlockScores,
    spread=None,
    strata: dict[int, int] | None = None,
) -> PowerSet:
    """Half A of the held-out episodes (`halves`) is the null; half B uninjected is the control, and
    with each gap of POWER_SIZES injected it is re-scored (with the injected gap's own search, as a
    check runs it). Both halves are subsets of the real blocks scored in calibration."""
    half_a, half_b = halves(held, strata)
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
        null_ending=blocks.ending[in_a],
        control_ending=blocks.ending[~in_a],
    )
    cells = CellLayout(norm.mean["obs"].shape[0], regime_edges(block_controls(blocks)), response=True)
    blocks_b = blocks.subset(np.flatnonzero(~in_a))  # half B's blocks, as the control was scored
    for g, (gap, sizes) in enumerate(POWER_SIZES.items()):
        entries = []
        for size in sizes:
            inj = half_b
            if gap in MOTION_GAPS:  # on the cut blocks: the context stays real
                inj_blocks = horizon_motion(blocks_b, size)
            else:
                inj = _inject(gap, size, half_b, norm, np.random.default_rng([cfg.seed, g]))
                inj_blocks = make_blocks(inj, norm, cfg.context, cfg.horizon)
            assert np.array_equal(inj_blocks.episode, ps.control_episode), "injection changed the block layout"
            sc = score_blocks(model, inj_blocks, cfg.samples, seed=cfg.seed, spread_scale=spread)
            entry = PowerEntry({s: getattr(sc, s) for s in POWER_SCORES})
            entry.bias_cells = cells.block_columns(sc.err_steps, block_controls(inj_blocks), sc.pred_mean)
            if cfg.attribution == "fit" and gap in ("latency", "actuator"):
                entry.fit_scores = _fit_scores(model, inj, inj_blocks, norm, cfg)
            elif gap == "latency":
                entry.search_latency = search_matrices(model, inj, norm, cfg, astd, actuator=False).latency
            elif gap == "actuator" and len(astd):
                entry.search_gain = search_matrices(
                    model, inj, norm, cfg, astd, latency=False, kinds=("gain",)
                ).actuator["gain"]
                entry.allowed_gain = allowed(inj)
            entries.append(entry)
        ps.gaps[gap] = InjectedSeries(tuple(sizes), POWER_UNITS[gap], entries)
    return ps
