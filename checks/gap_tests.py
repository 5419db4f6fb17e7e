"""The gap tests of one check, run through the world model: evidence for latency, actuator,
sensor_noise and dynamics (attribution.py owns the statistics; this module applies them).

Owns `run_gap_tests(ctx) -> GapTests`, in the order corrections are found (each on what the
previous ones leave, since a delay looks partly like a weaker gain):
  1. latency and actuator (`fit_corrections`, attribution "fit", the default): the corrections'
     score tests at the identity, through the model (sysid.py); when latency fires, the delay's
     fit and the actuator test on the scores where that fit leaves the data; when actuator fires,
     the joint fit of the delay and every command parameter; a row is supported when its joint
     Wald test excludes the identity. With attribution "grid" (`grid_corrections`, one release):
     the former delay scan and per-channel gain / offset / deadband grid searches;
  2. the supported corrections (a sub-step delay too: `applied_columns`) are applied and the
     blocks re-scored: the residual tests
     (sensor_noise, dynamics; attribution.residual_evidence), the too-smooth test (the lower
     tail of KL and one-step NLL; attribution.smoothness_evidence, half of sensor_noise's level)
     and the two-sided open-loop bias test (bias.py, overall and per operating regime, half of
     dynamics' level: the other half is the coloured-residual test) run on the corrected scores,
     and so do the divergence tests the decision uses for tolerated gaps (`GapTests.corrected_scores`).
Whether the latency and actuator rows can fail a run under another behaviour policy is the
decision's (rule R4b, with policy_match.py's test).
Each test yields a `GapEvidence` with a typed detail (LatencyDetail, ActuatorDetail,
ResidualDetail) that the report words; the gate's tolerances (config.Tolerances) set
`within_tolerance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks import attribution as attr
from wmcheck.checks import bias as ob
from wmcheck.checks import sysid
from wmcheck.checks.blocks import Blocks, block_controls, make_blocks
from wmcheck.checks.config import Tolerances
from wmcheck.checks.evidence import GapEvidence
from wmcheck.checks.scoring import BlockScores
from wmcheck.checks.stats import cluster_bootstrap
from wmcheck.checks.transforms import actuator_correction, shift_drivers
from wmcheck.datasets.errors import UserError


@dataclass
class GapContext:
    """What the gap tests need: the model, the checked episodes and their scores, calibration."""

    model: object
    norm: object  # datasets.normalize.Normalizer
    cal: object  # calibration.Calibration
    episodes: list  # checked Episodes (those that have blocks)
    blocks: Blocks
    scores: BlockScores
    comp_idx: np.ndarray  # (k,) competent blocks
    level: float  # each gap test's level (config.split_alpha)
    tolerances: Tolerances
    rng: np.random.Generator
    seed: int = 0
    dt: float | None = None
    units: dict = field(default_factory=dict)  # channel name -> unit (the report's estimates)
    twin: np.ndarray | None = None  # (n,) each block's real twin (check._real_twins) or -1


@dataclass
class LatencyDetail:
    steps: int  # registered delay estimate (> 0: the simulator lacks latency)
    interval: tuple[float, float]  # 90 % episode-bootstrap interval (steps)
    best_shift: int  # the search's best shift of the commands
    improvement: float  # one-step NLL gain of that shift (nats per step and channel)
    statistic: float  # its paired t
    threshold: float  # the same search's null quantile on real blocks
    delays: np.ndarray  # (Ld,)
    curve: np.ndarray  # (Ld,) mean one-step NLL of the checked blocks per delay
    real_curve: np.ndarray  # (Ld,) the real blocks'
    dt: float | None = None


@dataclass
class Correction:
    """One actuator search's best candidate, in the channel's physical units."""

    channel: str
    index: int
    kind: str  # gain / offset / deadband
    value: float
    interval: tuple[float, float]
    evidence: float
    improvement: float
    statistic: float
    threshold: float


@dataclass
class ActuatorDetail:
    best: Correction  # the significant correction that explains the most
    searches: list[Correction]  # every channel and kind
    extrapolated_share: float  # share of the corrected commands outside the training range
    untested: dict[str, dict[str, list[float]]]  # channel -> kind -> candidates the model cannot judge
    competence_alpha: float = 0.01


@dataclass
class ResidualDetail:
    stats: attr.ResidualStats
    names: list[str]  # observation channels
    std: np.ndarray  # (D,) channel std (normalised -> physical)
    ac1_checked: np.ndarray  # (D,) lag-1 autocorrelation of the checked residuals
    ac1_real: np.ndarray  # (D,)
    applied: list[str]  # corrections applied before the residual tests
    per_channel_ratio: np.ndarray  # (D,) open-loop error, checked / real
    per_horizon_ratio: np.ndarray  # (H,)
    smoothness: attr.Smoothness | None = None  # the too-smooth test (sensor_noise's other half)
    bias: BiasDetail | None = None  # the open-loop bias test (dynamics' other half)


@dataclass
class BiasDetail:
    """The open-loop bias test (bias.py) with what the report needs to say it in physical units."""

    test: ob.BiasTest
    cells: list  # (C,) bias.Cell
    obs_std: np.ndarray  # (D,) normalised -> physical
    level: np.ndarray  # (C,) the model's predicted value of the cell's channel, physical units
    control_names: list[str]
    control_mean: np.ndarray  # (K,) normalised -> physical controls
    control_std: np.ndarray  # (K,)
    obs_names: list[str] = field(default_factory=list)
    units: dict = field(default_factory=dict)


@dataclass
class GapTests:
    gaps: dict[str, GapEvidence]  # latency, actuator, sensor_noise, dynamics
    corrected_scores: BlockScores  # the blocks re-scored after the corrections that fired (= scores without)
    applied: list[str] = field(default_factory=list)


def run_gap_tests(ctx: GapContext) -> GapTests:
    if len(ctx.comp_idx) == 0:
        why = "no block lies inside the model's competence"
        return GapTests(
            {g: GapEvidence.not_checked(g, why) for g in ("latency", "actuator", "sensor_noise", "dynamics")},
            ctx.scores,
        )
    boot_idx = cluster_bootstrap(ctx.rng, ctx.blocks.episode[ctx.comp_idx], ctx.cal.config.bootstrap)  # whole episodes
    if ctx.cal.config.attribution == "grid":
        latency, actuator, blocks, applied = grid_corrections(ctx, boot_idx)
    else:
        latency, actuator, blocks, applied = fit_corrections(ctx, boot_idx)
    sc = ctx.scores
    if applied:
        sc = ctx.cal.score(ctx.model, blocks, ctx.seed)
    sensor, dynamics = residual_tests(ctx, sc, boot_idx, applied, block_controls(blocks))
    return GapTests(
        {"latency": latency, "actuator": actuator, "sensor_noise": sensor, "dynamics": dynamics}, sc, applied
    )


def grid_corrections(ctx: GapContext, boot_idx) -> tuple[GapEvidence, GapEvidence, Blocks, list[str]]:
    """The grid searches (attribution="grid"): latency, then actuator on what the delay leaves; the
    blocks with the corrections that fired applied."""
    latency = latency_test(ctx, boot_idx)
    shift = latency.detail.steps if latency.fires else 0
    act_eps = [shift_drivers(e, shift) for e in ctx.episodes] if shift else ctx.episodes
    actuator = actuator_test(ctx, act_eps, boot_idx)
    corrected, applied = act_eps, [f"delay {shift} steps"] if shift else []
    if actuator.fires:
        b = actuator.detail.best
        corrected = [actuator_correction(e, b.index, b.kind, b.value) for e in corrected]
        applied.append(f"{b.kind} {b.value:.3g} on {b.channel}")
    blocks = ctx.blocks
    if applied:
        cfg = ctx.cal.config
        blocks = make_blocks(corrected, ctx.norm, cfg.context, cfg.horizon)
    return latency, actuator, blocks, applied


def sub_step(delay_steps: float) -> bool:
    """Whether a fitted delay rounds to zero steps. A log resolves time in steps: shifting the
    commands by a fraction f of a step mixes each command with its neighbour ((1 - f) u_t + f u_t-1
    for linear interpolation), a filter of the commands, and a slower response of the system
    (damping, inertia, actuator bandwidth) filters them too. On HalfCheetah a damping gap x1.5 was
    fitted as a delay of 0.23 steps and named latency; true delays of 1 and 2 steps were fitted at
    1.01 and 1.99 steps by the same model. Such a latency finding stands (the run fails) but is
    not named alone: the top gap lists it with dynamics (decision.py, T1)."""
    return abs(float(delay_steps)) < 0.5


SENSOR_LEVEL_EXPLAINED_BY = ("latency", "actuator", "dynamics")
"""What else gives the sensor-noise row's finding: one-step residuals of another level than
reality's (larger, smaller, a surprise below reality's: too smooth). Sensor noise changes that
level and nothing else, but the other gaps change it as well: a plant that moves less per step
(more damping, more inertia) has smaller residuals under the same random forces, one that moves
more has larger ones, and commands that act later or more strongly than the model expects leave
a one-step error the corrections only partly remove. A sensor-noise finding alone is named (a
level change with no bias, no colour and no correction's score is sensor noise's signature);
beside a firing latency, actuator or dynamics row (a correction's score, an open-loop bias or
larger coloured residuals, which noise does not give) it is reported with that row, and T1
chooses among the others (decision.py). HalfCheetah (docs/benchmarks.md, twenty-fifth session):
on damping x2 over reality, deterministic and with reality's noise, sensor noise and dynamics
fired and the bootstrap could not rank them, so the top gap was none; on Pusher commands acting
1.5x as strongly, and a deterministic simulator missing the latency, were none with sensor noise
beside actuator and latency. The sensor-noise perturbations (0.05-0.5) and the deterministic
twins never fired another row on either system."""


def identified_gains(estimates: list[sysid.Estimate]) -> list[sysid.Estimate]:
    """The fitted gains whose 95 % interval excludes 1: those `bandwidth_lookalike` judges."""
    return [e for e in estimates if e.param.kind == "gain" and sysid.excludes_identity(e)]


def bandwidth_lookalike(delay: sysid.Estimate | None, gains: list[sysid.Estimate]) -> bool:
    """Whether an actuator finding is the other half of a slower (or faster) plant, not a gain of
    its own: the latency row's delay is a fraction of a step (`sub_step`) and every fitted gain
    whose 95 % interval excludes 1 (at least one) moves the response the same way (later and
    weaker: delay < 0, gain < 1; earlier and stronger: delay > 0, gain > 1). A plant whose response
    is slower than the model's (more damping or inertia) passes the commands through a low-pass
    filter, and a command transform can imitate a low-pass only by both halves: a phase lag (a
    fractional delay) and a smaller steady gain. A gain gap alone scales the response without
    delaying it, and a delay alone delays it without scaling it. HalfCheetah (docs/benchmarks.md,
    twenty-fourth session): every one of 12 damping checks (x1.25-x3, deterministic and
    perturbed) was fitted a delay of -0.10 to -0.34 steps, with gains of 0.63-0.98 on all six
    channels where the actuator row fired, and 3 of them were named actuator; none of the 4 gain
    gaps (1/1.1-1/2) fired the latency row. Such an actuator finding fails the run but is listed
    with dynamics (decision.py, T1), whichever parameter heads the row (on one damping check a
    deadband's score was the largest)."""
    if delay is None or not sub_step(delay.value):
        return False
    outside = identified_gains(gains)
    return bool(outside) and all(delay.value * math.log(max(g.value, 1e-12)) > 0.0 for g in outside)


def common_gain_only(detail: FitDetail) -> bool:
    """Whether an actuator finding rests on the cell of one gain on every channel alone (no
    channel's own parameter is significant). A response weaker or stronger on every channel at once
    is what a plant with other damping or inertia gives as well: on Pusher (docs/benchmarks.md,
    twenty-fifth session) the cell fired on damping x2 and x3 over reality, deterministic and
    perturbed, and those checks were named actuator, while on the same model the gain gaps' own
    channel cells were significant (an offset t of 7.8 at 1/1.5) or the summed cell was alone
    (commands twice as strong). Such a finding fails the run but is listed with dynamics
    (decision.py, T1), as a sub-step delay and a bandwidth-like gain are."""
    return detail.significant_cells() == {sysid.COMMON_GAIN}


def applied_columns(layout: sysid.Layout, supported: set[str]) -> list[int]:
    """The theta indices applied before the residual and bias tests: the corrections of the gaps
    the fit supports (a correction the data do not support would only absorb part of another gap),
    a sub-step delay included. The dynamics row then asks whether anything is left once the delay
    is corrected, which a slower response leaves and a delay does not. HalfCheetah, one model
    (docs/benchmarks.md, sixteenth session): a true extra delay of 0.3 / 0.4 steps (fitted 0.35 /
    0.43) made the dynamics row fire (1.59 / 1.96) when the delay was left in the data, and not
    (0.47 / 0.57) once it was corrected; damping x3 (fitted delay 0.34) still fires it corrected
    (2.04), damping x1.5 (0.23) does not (0.74), which then stays confounded (decision.py, T1)."""
    return [int(j) for gap in sorted(supported) for j in layout.columns(gap)]


def applied_words(p: sysid.Param, rel: float, names: list[str], astd: np.ndarray) -> str:
    """One applied correction in words: its value relative to the real reference, physical units."""
    v = sysid.physical(p, rel, astd)
    return f"delay {v:+.2f} steps" if p.kind == "delay" else f"{p.kind} {v:.3g} on {names[p.channel]}"


@dataclass
class FitDetail:
    """The latency or actuator row from the corrections' score test and joint fit (sysid.py)."""

    gap: str  # "latency" | "actuator"
    test: ob.BiasTest  # the score test; its cells are `params`
    params: list  # (c,) sysid.Param of the test
    fit: sysid.SysidResult  # shared by both rows
    names: list[str]  # command channel names
    box: dict[str, dict[str, list[float]]]  # channel -> kind -> [lo, hi] the model can judge (physical)
    dt: float | None = None
    fit_support: float | None = None  # largest Wald z of the row's estimates / 1.96 (None: no fit for it)
    untestable: list = field(default_factory=list)  # sysid.Param left untested: no room inside the training range

    def estimates(self) -> list[sysid.Estimate]:
        return [e for e in self.fit.estimates if e.param.kind in sysid.GAP_KINDS[self.gap]]

    def best(self) -> sysid.Estimate | None:
        """The row's headline correction: among the significant ones, those whose own 95 % interval
        excludes the identity first, then those inside the box the model can judge (an estimate at
        its edge is censored: the fit pressed against what the model can say), then the largest
        score |t|. Two confounded corrections (a weak gain and a deadband) can both be significant
        while the fit pins only one down: on Pendulum with a x0.3 gain the deadband's |t| was the
        larger (7.9 vs 7.3) but its interval [-0.38, 0.95] held 0, the gain's [0.27, 0.64] did not
        hold 1. On another install (2026-12-03: numpy 2.4.6, torch 2.13.0, gymnasium 1.4.0) the same
        case gave the deadband |t| 9.4 and an interval [0.07, 0.48] that excluded 0 too, but at the
        edge of the box; the gain, 0.40 [0.31, 0.52], was inside it."""
        est = self.estimates()
        est = [e for e in est if self.significant(e.param)] or est
        return max(est, key=headline_order) if est else None

    def significant_cells(self) -> set[sysid.Param]:
        """The score test's significant cells (`params`, COMMON_GAIN among them)."""
        return {q for q, s in zip(self.params, self.test.significant) if s}

    def significant(self, p: sysid.Param) -> bool:
        """Whether the score test's cell of `p` is significant, or the cell of one gain on every
        channel (sysid.COMMON_GAIN) when `p` is a gain."""
        sig = self.significant_cells()
        return p in sig or (p.kind == "gain" and sysid.COMMON_GAIN in sig)


def headline_order(e: sysid.Estimate) -> tuple:
    """FitDetail.best's ranking of one estimate (larger first)."""
    return (sysid.excludes_identity(e), not e.at_bound, abs(e.t))


def fit_corrections(ctx: GapContext, boot_idx) -> tuple[GapEvidence, GapEvidence, Blocks, list[str]]:
    """The corrections' score tests and fit (sysid.py), in order: the latency test at the identity;
    when it fires, the delay's fit, and the actuator test on the scores where that fit leaves the
    data (a large delay moves the gain's score too); when the actuator test fires, the joint fit of
    the delay and every command parameter, from the delay found.
    Returns both rows and the blocks with the fitted corrections applied."""
    cfg, norm, cal = ctx.cal.config, ctx.norm, ctx.cal
    layout = sysid.Layout.for_normalizer(norm, cfg.max_delay)
    none = ("no command or exogenous input channels to be late against", "no command channels")
    if not len(layout.columns("latency")) and not len(layout.columns("actuator")):
        return (
            GapEvidence.not_checked("latency", none[0]),
            GapEvidence.not_checked("actuator", none[1]),
            ctx.blocks,
            [],
        )
    if cal.sysid is None:
        raise UserError(
            "this calibration has no reference for the corrections' fit (it was made with attribution 'grid')",
            "re-run `wmcheck calibrate RUN` (the default attribution is the fit)",
        )
    H_ = sysid.ATTRIBUTION_HORIZON
    data_all = sysid.FitData.of(ctx.episodes, ctx.blocks, norm, layout)
    data = data_all.subset(ctx.comp_idx)
    ident = sysid.evaluate(ctx.model, data, np.zeros(len(layout)), layout, cfg.context, H_)
    groups = ctx.blocks.episode[ctx.comp_idx]
    twin = None if ctx.twin is None else ctx.twin[ctx.comp_idx]
    lo, hi = sysid.bounds(norm, ctx.episodes, layout, cfg, cfg.competence_alpha)
    # A parameter the training-range guard leaves no room either way (lo = hi = the identity: any
    # correction moves more commands outside the logs' range) is one the model cannot judge; its
    # score is where the model only extrapolates, so it is not tested (the row lists it). On the
    # HalfCheetah benchmark the one faithful control that failed did so on such an offset alone.
    tested = {gap: [j for j in layout.columns(gap) if hi[j] > lo[j]] for gap in ("latency", "actuator")}
    untestable = [layout.params[j] for j in layout.columns("actuator") if hi[j] <= lo[j]]

    def test(gap: str, scores: np.ndarray):
        cols = tested[gap]
        if not len(cols):
            return None
        return sysid.score_test(
            scores,
            groups,
            cal.sysid.scores,
            cal.real_episode,
            np.asarray(cols),
            ctx.level,
            ctx.rng,
            boot_idx,
            twin,
            layout=layout,
        )

    def fit(free, start=None):
        return sysid.fit(ctx.model, data, layout, free, lo, hi, cfg.context, H_, ident, start=start)

    # In order, as a delay looks partly like a weaker gain: the actuator scores are taken where the
    # delay's fit leaves the data (its last evaluation has every parameter's gradient).
    tests = {"latency": test("latency", ident.grad)}
    f, act_scores, evaluations = None, ident.grad, 1
    if tests["latency"] is not None and tests["latency"].evidence >= 1.0:
        f = fit(list(layout.columns("latency")))
        act_scores, evaluations = f.at_fit.grad, evaluations + f.evaluations
    tests["actuator"] = test("actuator", act_scores)
    tests = {g: t for g, t in tests.items() if t is not None}
    fired = {g for g, t in tests.items() if t.evidence >= 1.0}
    if "actuator" in fired:  # every command parameter: a channel left out biases the others' estimates
        free = (list(layout.columns("latency")) if "latency" in fired else []) + list(layout.columns("actuator"))
        f = fit(free, start=None if f is None else f.theta)
        evaluations += f.evaluations
    astd = norm.std["action"].astype(float)
    names = list(norm.names["action"])
    result = sysid.SysidResult(layout, None, evaluations=1)
    applied: list[str] = []
    blocks = ctx.blocks
    if f is not None:
        H, ok, hessian_evaluations = sysid.hessian(ctx.model, data, layout, f, lo, hi, cfg.context, H_)
        cov = sysid.sandwich(H, f.at_fit.grad[:, f.free], groups)

        def t_of(j):
            for gap, t in tests.items():
                cols = tested[gap]
                if j in cols:
                    return t.t[cols.index(j)]
            return 0.0

        est, pairs, rel, total = sysid.estimates(f, layout, cov, cal.sysid, H, cal.real_episode, names, astd, t_of)
        result = sysid.SysidResult(layout, f, est, pairs, ok, evaluations + hessian_evaluations, rel, total)
        supported = {gap for gap in fired if result.support(layout.columns(gap)) >= 1.0}
        kept = applied_columns(layout, supported)
        if kept:
            theta = np.zeros(len(layout))
            theta[kept] = f.theta[kept]
            blocks = sysid.corrected_blocks(data_all, theta, layout)
            # in words relative to the model's own fit on real data (the number the rows report)
            applied = [applied_words(layout.params[j], f.theta[j] - cal.sysid.theta[j], names, astd) for j in kept]
    box: dict[str, dict[str, list[float]]] = {}
    for j, p in enumerate(layout.params):
        if p.kind != "delay":
            box.setdefault(names[p.channel], {})[p.kind] = [
                sysid.physical(p, lo[j], astd),
                sysid.physical(p, hi[j], astd),
            ]
    out = {}
    for gap in ("latency", "actuator"):
        if gap not in tests:
            reason = none[0] if gap == "latency" else none[1]
            if gap == "actuator" and untestable:
                reason = (
                    "no command parameter can be judged: every correction moves commands outside the training range"
                )
            out[gap] = GapEvidence.not_checked(gap, reason)
            continue
        t = tests[gap]
        detail = FitDetail(gap, t, sysid.test_params(layout, tested[gap]), result, names, box, ctx.dt)
        if gap == "actuator":
            detail.untestable = untestable
        evidence = t.evidence
        if gap in fired:  # present only when the fit supports it (sysid.py, "Decision")
            detail.fit_support = result.support(layout.columns(gap))
            evidence = min(t.evidence, detail.fit_support)
        best = detail.best() if evidence >= 1.0 else None
        if gap == "latency":
            within = best is not None and ctx.tolerances.latency.covers(best.value)
        else:
            sig = [e for e in detail.estimates() if detail.significant(e.param)] or ([best] if best else [])
            within = bool(sig) and all(ctx.tolerances.actuator.covers(e.param.kind, e.value) for e in sig)
        boot = np.minimum(t.boot, detail.fit_support) if detail.fit_support is not None else t.boot
        alike = ("dynamics",) if gap == "latency" and best is not None and sub_step(best.value) else ()
        if gap == "actuator" and evidence >= 1.0 and out["latency"].fires:
            if bandwidth_lookalike(out["latency"].detail.best(), detail.estimates()):
                alike = ("dynamics",)
        if gap == "actuator" and evidence >= 1.0 and common_gain_only(detail):
            alike = ("dynamics",)
        out[gap] = GapEvidence(gap, evidence, within_tolerance=within, boot=boot, detail=detail, confounded_with=alike)
    return out["latency"], out["actuator"], blocks, applied


def latency_test(ctx: GapContext, boot_idx) -> GapEvidence:
    cfg, real = ctx.cal.config, ctx.cal.real_search
    if ctx.norm.dim("action") + ctx.norm.dim("input") == 0:
        return GapEvidence.not_checked("latency", "no command or exogenous input channels to be late against")
    J = attr.search_matrices(
        ctx.model, ctx.episodes, ctx.norm, cfg, ctx.norm.std["action"].astype(float), actuator=False
    )
    delays = J.delays
    checked = J.latency[:, ctx.comp_idx]  # (Ld, k)
    res = attr.evaluate_search(
        checked,
        real.latency,
        delays,
        attr.identity_index("delay", delays),
        ctx.level,
        ctx.rng,
        cfg.bootstrap,
        boot_idx,
        ctx.cal.real_episode,
    )
    steps, interval = attr.registered_delay(checked, real.latency, delays, boot_idx)
    detail = LatencyDetail(
        steps,
        interval,
        int(delays[res.best]),
        res.improvement,
        res.evidence * res.threshold,
        res.threshold,
        delays,
        res.curve,
        real.latency.mean(1),
        ctx.dt,
    )
    return GapEvidence(
        "latency",
        res.evidence,
        within_tolerance=ctx.tolerances.latency.covers(steps),
        boot=res.boot_evidence,
        detail=detail,
    )


def actuator_test(ctx: GapContext, act_eps, boot_idx) -> GapEvidence:
    cfg, norm = ctx.cal.config, ctx.norm
    astd = norm.std["action"].astype(float)
    if not len(astd):
        return GapEvidence.not_checked("actuator", "no command channels")
    J = attr.search_matrices(ctx.model, ctx.episodes, norm, cfg, astd, latency=False, actuator_episodes=act_eps)
    names = norm.names["action"]
    level = ctx.level / max(1, J.n_actuator_searches)
    found, boots, untested = [], [], {}
    for kind, c, grid, mat in J.searches():
        unit = 1.0 if kind == "gain" else float(astd[c])
        ident = attr.identity_index(kind, grid)
        allowed = attr.allowed_corrections(norm, act_eps, c, kind, grid, unit, cfg.competence_alpha)  # (G,)
        if not allowed.all():
            untested.setdefault(names[c], {})[kind] = [float(v * unit) for v in grid[~allowed]]
        r = attr.evaluate_search(
            mat[:, ctx.comp_idx],
            ctx.cal.real_search.actuator[kind][c],
            grid,
            ident,
            level,
            ctx.rng,
            cfg.bootstrap,
            boot_idx,
            ctx.cal.real_episode,
            allowed,
        )
        found.append(
            Correction(
                names[c],
                c,
                kind,
                float(grid[r.best]) * unit,
                (r.interval[0] * unit, r.interval[1] * unit),
                float(r.evidence),
                float(r.improvement),
                float(r.evidence * r.threshold),
                float(r.threshold),
            )
        )
        boots.append(r.boot_evidence)
    # Gain, offset and deadband can all partly mimic one another: the estimate is the significant
    # correction that explains the most; the gap's evidence is the strongest search.
    significant = [f for f in found if f.evidence >= 1.0] or found
    best = max(significant, key=lambda f: f.improvement)
    extrap = attr.outside_training_share(
        norm, [actuator_correction(e, best.index, best.kind, best.value) for e in act_eps], best.index
    )
    detail = ActuatorDetail(best, found, extrap, untested, cfg.competence_alpha)
    return GapEvidence(
        "actuator",
        max(f.evidence for f in found),
        within_tolerance=ctx.tolerances.actuator.covers(best.kind, best.value),
        boot=np.max(np.stack(boots), 0),
        detail=detail,
    )


def bias_detail(ctx: GapContext, sc: BlockScores, controls: np.ndarray, boot_idx, level: float) -> BiasDetail | None:
    """The open-loop bias test of the competent blocks against the held-out real blocks (bias.py);
    None when the calibration has no per-step errors."""
    cal, idx, norm = ctx.cal, ctx.comp_idx, ctx.norm
    reference = ob.calibration_cells(cal)
    if reference is None or sc.err_steps.ndim != 3:
        return None
    layout, real = reference  # real: (m, Cb) block columns
    ctrl = controls[idx]
    checked = layout.block_columns(sc.err_steps[idx], ctrl, sc.pred_mean[idx])  # (k, Cb)
    twin = None if ctx.twin is None else ctx.twin[idx]
    groups = ctx.blocks.episode[idx]
    if twin is not None and len(twin) and (twin >= 0).all():  # every block replays a real block's inputs
        test = ob.paired_bias_test(checked, real[twin], groups, level, ctx.rng, boot_idx, layout=layout)
    else:
        test = ob.bias_test(checked, groups, real, cal.real_episode, level, ctx.rng, boot_idx, layout=layout)
    cells = layout.cells()
    std, mean = norm.std["obs"].astype(float), norm.mean["obs"].astype(float)
    ch = np.array([c.channel for c in cells])
    level_phys = layout.levels(sc.pred_mean[idx], ctrl) * std[ch] + mean[ch]
    names = list(norm.names["action"]) + list(norm.names["input"])
    cmean = np.concatenate([norm.mean["action"], norm.mean["input"]]).astype(float)
    cstd = np.concatenate([norm.std["action"], norm.std["input"]]).astype(float)
    return BiasDetail(test, cells, std, level_phys, names, cmean, cstd, list(norm.names["obs"]), dict(ctx.units))


def residual_tests(
    ctx: GapContext, sc: BlockScores, boot_idx, applied: list[str], controls: np.ndarray
) -> tuple[GapEvidence, GapEvidence]:
    real, idx = ctx.cal.real, ctx.comp_idx
    stats = attr.residual_evidence(
        sc.resid_std[idx],
        real.resid_std,
        sc.resid_mean[idx],
        real.resid_mean,
        sc.resid_ac1[idx],
        real.resid_ac1,
        ctx.level,
        ctx.rng,
        ctx.cal.config.bootstrap,
        boot_idx,
        (ctx.blocks.episode[idx], ctx.cal.real_episode),
        sensor_share=0.5,  # the other half of the sensor test's level: smoothness (too clean a simulator)
        dynamics_share=0.5,  # the other half of the dynamics test's level: the open-loop bias
    )
    bias = bias_detail(ctx, sc, controls, boot_idx, ctx.level / 2)
    smooth = attr.smoothness_evidence(
        {s: getattr(sc, s)[idx] for s in attr.SMOOTHNESS_SCORES},
        ctx.blocks.episode[idx],
        {s: getattr(real, s) for s in attr.SMOOTHNESS_SCORES},
        ctx.cal.real_episode,
        ctx.level / 2,
    )
    std = ctx.norm.std["obs"].astype(float)
    detail = ResidualDetail(
        stats,
        list(ctx.norm.names["obs"]),
        std,
        sc.resid_ac1[idx].mean(0),
        real.resid_ac1.mean(0),
        applied,
        sc.div_channel[idx].mean(0) / np.maximum(real.div_channel.mean(0), 1e-9),
        sc.div_curve[idx].mean(0) / np.maximum(real.div_curve.mean(0), 1e-9),
        smooth,
        bias,
    )
    worst = int(np.argmax(stats.sensor_per_channel))
    covers = ctx.tolerances.sensor_noise.covers(float(stats.ratio[worst]), float(stats.bias[worst] * std[worst]))
    sensor = GapEvidence(
        "sensor_noise",
        max(stats.sensor_evidence, smooth.evidence),
        within_tolerance=covers,
        boot=np.maximum(stats.sensor_boot, smooth.evidence),  # smoothness has no bootstrap: its point value
        detail=detail,
        explained_by=SENSOR_LEVEL_EXPLAINED_BY,
    )
    dyn_ev, dyn_boot = stats.dynamics_evidence, stats.dynamics_boot
    if bias is not None:
        dyn_ev = max(dyn_ev, bias.test.evidence)
        if len(bias.test.boot) == len(dyn_boot):
            dyn_boot = np.maximum(dyn_boot, bias.test.boot)
    dynamics = GapEvidence("dynamics", dyn_ev, boot=dyn_boot, detail=detail)
    return sensor, dynamics
