"""Latency and actuator attribution as system identification through the world model: one
differentiable fit of correction parameters, detected by their scores.

The latency and actuator rows ask: which correction of the checked data's driving signals makes
the world model (our picture of reality) explain the checked observations? This module answers it
as a fit instead of a grid search.

Parameters theta (`Layout`; all 0 at the identity), applied to the drivers before the model sees
them (`corrected_controls`, differentiable):
  delay       d steps, one for every driving signal (commands and exogenous inputs together):
              u'[t] = u(t + d), a fractional shift by Catmull-Rom interpolation (C1: its derivative
              at an integer delay is the central difference), the episode's first and last values
              held beyond its ends as in transforms.shift_drivers; d > 0: the simulator lacks latency
  gain        per command channel, log of the gain
  offset      per command channel, in units of its training std
  deadband    per command channel, width in std units: w >= 0 zeroes |a| <= w and moves the rest
              w toward 0 (transforms.deadband); w < 0 moves commands |w| away from 0 (the inverse),
              so the score at w = 0 is two-sided
  The delay acts first, then deadband, gain and offset (transforms.actuator's order).

Objective, per block (`objective`): the one-step Gaussian NLL of the observations (symlog space,
mean over steps t >= C and channels) under the prior's mean-field prediction, plus 0.5 log of the
mean squared error of open-loop rollouts of `horizon` steps branched from the block's own
posterior states every `horizon` steps (a Gaussian log-score at that horizon: latency shows most in
the one-step term, gains and offsets accumulate over a few steps). Deterministic (latent modes);
one posterior pass serves both terms.

Detection (`score_test`). The score of every parameter at the identity, dJ_b/dtheta per block, comes
from one backward pass for all blocks and parameters (theta has one row per block). The model is not
at its optimum on real data either, so the held-out real blocks' scores are the null: per
parameter Welch's t of the checked episodes' mean score against the real episodes', the max |t|
over the test's parameters, its null by permuting episodes (bias.bias_test; paired against each
block's real twin, with a sign-flip null, when every block has one). A Rao score test in
two-sample form: its threshold does not depend on how many episodes are checked, and correlated
parameters are not over-corrected. Latency (the delay) and actuator (every command parameter)
are two tests.

Estimation (`fit`; the order is gap_tests.fit_corrections'). When the latency test fires the delay
is fitted, and the actuator test reads the scores where that fit leaves the data (a delay of three
steps moves the gain's score as well). The parameters of the tests that fired (the delay; every
command parameter, since a channel left at the identity biases the others' estimates: on
HalfCheetah with every gain at 0.5, fitting the 2 significant channels gave 0.64 and 0.52, fitting
all 6 gave 0.51-0.60 and a far lower J) are then fitted jointly, since a delay and a weak gain
mimic each other: L-BFGS on the blocks' mean J plus a weak ridge toward the identity (the delay
alone: the one-dimensional `delay_search`), projected onto the box
the model can judge (`bounds`: corrections that move no more commands outside the training logs'
range than the identity does, or competence_alpha of them; attribution.allowed_corrections' rule).
The estimate is relative to the same fit on the held-out real blocks (calibration: the model's own
preference, e.g. a curve that bottoms out at -0.3 steps, cancels). Interval: the cluster-robust
sandwich H^-1 S H^-1 over episodes (H by forward differences of the mean gradient, S from the
per-episode scores at the fit), plus the real reference's variance; the correlation of two
estimates says when they are confounded.

Decision: a gap is present when its score test fires *and* the fit supports it: the joint Wald test
of the row's fitted parameters against the identity at 95 % (`SysidResult.support`; joint, since a
confounded gain and deadband can each have a wide interval while together they are well
determined). The row's evidence is the smaller of the two, each over its threshold
(gap_tests.fit_corrections). The score test alone fires
on any systematic difference that correlates with the drivers: an engineering power-curve model
fired the latency test with a fitted delay of -0.01 steps. The second condition can only remove
findings, so the false-alarm level holds.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from wmcheck.checks.attribution import allowed_corrections
from wmcheck.checks.blocks import Blocks
from wmcheck.checks.folds import FoldModels, per_fold, restore_order
from wmcheck.datasets.windows import MIN_HORIZON
from wmcheck.worldmodel.distributions import symexp, symlog

KINDS = ("gain", "offset", "deadband")
GAP_KINDS = {"latency": ("delay",), "actuator": KINDS}
"""The parameter kinds of each gap's test and row."""
RIDGE = 1e-3  # nats per squared parameter unit: a weak prior toward the identity
FD_STEP = 0.02  # forward-difference step of the Hessian, parameter units
CONFOUNDED = 0.7  # |correlation| of two estimates above which the report calls them confounded
GUARD_POINTS = 33  # candidate values per parameter when the box the model can judge is found
MAX_EVALS = 30  # objective evaluations of one fit (a cap; the tolerances usually stop it first)
TOL_CHANGE = 1e-5  # nats per step and channel: a smaller change of J or of a parameter ends the fit
TOL_GRAD = 1e-4  # largest |gradient| (nats per parameter unit) at which the fit is converged
STALE_EVALS = 3  # evaluations at the best J (within TOL_CHANGE) since the last gain end the fit


class _Converged(Exception):
    """Raised from the L-BFGS closure to end a fit that no longer improves."""


class Progress:
    """The best point of a fit so far, and when to stop: the strong-Wolfe search can probe one
    corner of the box for many evaluations with J the same to 6 digits, so STALE_EVALS evaluations
    that return the best J again (within TOL_CHANGE) since the last gain end the fit. A worse trial
    point is the line search at work and counts neither way."""

    def __init__(self, theta: np.ndarray):
        self.best, self.theta, self.stale = np.inf, theta, 0

    def stop_after(self, obj: float, theta: np.ndarray) -> bool:
        if obj < self.best - TOL_CHANGE:
            self.stale = 0
        elif abs(obj - self.best) <= TOL_CHANGE:
            self.stale += 1
        if obj < self.best:
            self.best, self.theta = obj, theta
        return self.stale >= STALE_EVALS


@dataclass(frozen=True)
class Param:
    kind: str  # "delay" | "gain" | "offset" | "deadband"
    channel: int | None = None  # command channel; None for the delay


@dataclass
class Layout:
    """The correction parameters of a model's channels, in theta order."""

    params: list[Param]
    n_actions: int
    n_inputs: int
    max_delay: int

    @classmethod
    def of(cls, n_actions: int, n_inputs: int, max_delay: int) -> Layout:
        params = [Param("delay")] if n_actions + n_inputs else []
        params += [Param(k, c) for c in range(n_actions) for k in KINDS]
        return cls(params, int(n_actions), int(n_inputs), int(max_delay))

    @classmethod
    def for_normalizer(cls, norm, max_delay: int) -> Layout:
        return cls.of(norm.dim("action"), norm.dim("input"), max_delay)

    def __len__(self) -> int:
        return len(self.params)

    @property
    def margin(self) -> int:
        """Driver offsets kept on each side of a block column (Catmull-Rom reads d - 1 .. d + 2)."""
        return self.max_delay + 2

    def index(self, kind: str, channel: int | None = None) -> int | None:
        p = Param(kind, channel)
        return self.params.index(p) if p in self.params else None

    def columns(self, gap: str) -> np.ndarray:
        """theta indices of a gap's test: latency the delay, actuator every command parameter."""
        return np.array([i for i, p in enumerate(self.params) if p.kind in GAP_KINDS[gap]], int)


# ----------------------------------------------------------------------------- data and layer
@dataclass
class FitData:
    """Blocks prepared for the fit: their batch and the normalised drivers around each column."""

    blocks: Blocks
    drivers: np.ndarray  # (n, L, 2M + 1, A + E): driver of column j at offset k - M (prev-aligned)
    act_mean: np.ndarray  # (A,) raw units
    act_std: np.ndarray  # (A,)
    _tokens: dict = field(default_factory=dict, repr=False)  # (model id, chunk) -> encoder outputs per chunk
    _subsets: dict = field(default_factory=dict, repr=False)  # index bytes -> that subset (FitData.subset)

    @classmethod
    def of(cls, episodes, blocks: Blocks, norm, layout: Layout) -> FitData:
        """`blocks` must be cut from `episodes` (make_blocks); column j of a block starting at step s
        reads driver u_{s + j - 1} (the prev-aligned step view), so offset k reads u_{s + j - 1 + k}."""
        by_id = {e.id: e for e in episodes}
        M, L = layout.margin, blocks.length
        U = layout.n_actions + layout.n_inputs
        out = np.zeros((len(blocks), L, 2 * M + 1, U), np.float32)
        k = np.arange(-M, M + 1)
        cache: dict[int, np.ndarray] = {}
        for i, (eid, s) in enumerate(zip(blocks.episode, blocks.start)):
            if eid not in cache:
                ep = by_id[int(eid)]
                cache[eid] = np.concatenate(
                    [norm.norm_action(ep.actions), norm.norm_input(ep.input_array())], -1
                ).astype(np.float32)  # (N, U)
            u = cache[eid]
            idx = np.clip(int(s) + np.arange(L)[:, None] - 1 + k[None, :], 0, len(u) - 1)  # (L, 2M + 1)
            out[i] = u[idx]
        return cls(
            blocks,
            out,
            norm.mean["action"].astype(np.float64),
            np.maximum(norm.std["action"].astype(np.float64), 1e-12),
        )

    def subset(self, idx) -> FitData:
        """The blocks `idx`; the same subset again is the same object (with FoldModels a fit
        evaluates each fold's subset many times, and it keeps its encoder tokens)."""
        idx = np.asarray(idx)
        key = idx.tobytes()
        if key not in self._subsets:
            self._subsets[key] = FitData(self.blocks.subset(idx), self.drivers[idx], self.act_mean, self.act_std)
        return self._subsets[key]

    def __len__(self) -> int:
        return len(self.blocks)

    def chunks(self, chunk: int, model=None):
        """(slice, torch batch, drivers, encoder tokens or None) per chunk. The observations'
        encoding does not depend on the corrections, so with `model` it is computed once per
        FitData and reused by every evaluation (the image encoder of a pixel model is the costly part)."""
        key = (id(model), chunk)
        if model is not None and key not in self._tokens:
            with torch.no_grad():
                self._tokens[key] = [_tokens(model, b) for _, b in self.blocks.torch_chunks(chunk)]
        cached = self._tokens.get(key) if model is not None else None
        for i, (sl, batch) in enumerate(self.blocks.torch_chunks(chunk)):
            yield sl, batch, torch.from_numpy(self.drivers[sl]), (None if cached is None else cached[i])


def _catmull_rom(s: torch.Tensor) -> torch.Tensor:
    """(n,) fractions in [0, 1) -> (n, 4) weights of the samples at floor - 1 .. floor + 2."""
    s2, s3 = s * s, s * s * s
    return torch.stack(
        [(-s3 + 2 * s2 - s) / 2, (3 * s3 - 5 * s2 + 2) / 2, (-3 * s3 + 4 * s2 + s) / 2, (s3 - s2) / 2], 1
    )


def corrected_controls(
    drivers: torch.Tensor, theta: torch.Tensor, layout: Layout, act_mean, act_std
) -> tuple[torch.Tensor, torch.Tensor]:
    """drivers (n, L, 2M + 1, U) normalised, theta (n, p) -> prev_action (n, L, A), prev_input (n, L, E)
    of the corrected drivers (module docstring), column 0 zero as at every block's start."""
    n, L, _, U = drivers.shape
    M, A = layout.margin, layout.n_actions
    dtype = drivers.dtype
    i_d = layout.index("delay")
    d = theta[:, i_d].clamp(-layout.max_delay, layout.max_delay) if i_d is not None else theta.new_zeros(n)
    f = torch.floor(d.detach())
    w = _catmull_rom(d - f).to(dtype)  # (n, 4)
    base = (f.long() + M)[:, None] + torch.arange(-1, 3)[None, :]  # (n, 4) offset indices
    g = drivers.gather(2, base[:, None, :, None].expand(n, L, 4, U))  # (n, L, 4, U)
    u = (g * w[:, None, :, None]).sum(2)  # (n, L, U)
    a, inp = u[..., :A], u[..., A:]
    if A:
        mean = torch.as_tensor(act_mean, dtype=dtype)
        std = torch.as_tensor(act_std, dtype=dtype)
        r = a * std + mean  # raw units (n, L, A)

        def col(kind):  # (n, 1, A)
            return theta[:, [layout.index(kind, c) for c in range(A)]].to(dtype)[:, None, :]

        band = col("deadband") * std
        sign = torch.sign(r)
        r = torch.where((band < 0) | (r.abs() > band), r - band * sign, torch.zeros_like(r))
        r = torch.exp(col("gain")) * r + col("offset") * std
        a = (r - mean) / std
    keep = torch.ones(L, dtype=dtype)
    keep[0] = 0.0
    return a * keep[None, :, None], inp * keep[None, :, None]


# ----------------------------------------------------------------------------- objective
def _gauss_nll(y, mean, log_std):
    return 0.5 * ((y - mean) * torch.exp(-log_std)).pow(2) + log_std


def _tokens(model, seq) -> torch.Tensor:
    """The encoder's tokens of a sequence's observations (n, L, F), as model.observe computes them."""
    tokens = model.encoder(seq.obs.float())  # (n, L, units)
    if model.image_encoder is not None:
        tokens = torch.cat([tokens, model.image_encoder(seq.images)], -1)
    return tokens


def _soft_observe(model, seq, tokens: torch.Tensor | None = None):
    """The posterior filter of model.observe with each latent's probabilities in place of its one-hot
    mode (the straight-through mode is piecewise constant in the controls, so J would jump where a
    mode flips and no line search or finite difference could use it): states (n, L, ...)."""
    from wmcheck.worldmodel.rssm import State

    rssm = model.rssm
    tokens = _tokens(model, seq) if tokens is None else tokens
    ctrl = torch.cat([seq.prev_action, seq.prev_input], -1).float()  # (n, L, U)
    first = seq.is_first.bool()
    state = rssm.initial(tokens.shape[0], tokens.device)
    step = rssm.filter_scan(tokens, ctrl, first)
    deters, stochs = [], []
    for t in range(tokens.shape[1]):
        deter, logp = step(state, t)
        state = State(deter, logp.exp())
        deters.append(deter)
        stochs.append(state.stoch)
    return State(torch.stack(deters, 1), torch.stack(stochs, 1))


def _soft_prior(model, deter):
    """The prior heads' mixture probabilities of the latents given h: (..., S, C)."""
    return model.rssm.prior_logp(deter).exp().mean(-3)


def _soft_imagine(model, state, ctrl):
    """Roll the prior forward under ctrl (B, H, U) with latent probabilities (the heads' mixture)."""
    from wmcheck.worldmodel.rssm import State

    rssm = model.rssm
    core = rssm.core_scan(ctrl)
    deters, stochs = [], []
    for t in range(ctrl.shape[1]):
        deter = core(state, t)
        state = State(deter, _soft_prior(model, deter))
        deters.append(deter)
        stochs.append(state.stoch)
    return State(torch.stack(deters, 1), torch.stack(stochs, 1))


def objective(
    model, batch, prev_action, prev_input, context: int, horizon: int, tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """J per block (n,) of the module docstring, smooth and differentiable in the controls (latent
    probabilities instead of modes: `_soft_observe`)."""
    from wmcheck.worldmodel.rssm import State

    seq = copy.copy(batch)
    seq.prev_action, seq.prev_input = prev_action.float(), prev_input.float()
    post = _soft_observe(model, seq, tokens)  # (n, L, ...)
    mean, log_std = model.decode(State(post.deter, _soft_prior(model, post.deter)))  # (n, L, D) symlog space
    y = seq.obs.float()
    one_step = _gauss_nll(symlog(y), mean, log_std)[:, context:].mean((1, 2))  # (n,)
    n, L = y.shape[:2]
    starts = list(range(context - 1, L - horizon, horizon))  # branch points t0 (t0 + horizon <= L - 1)
    if not starts:
        return one_step
    W = len(starts)
    st = State(post.deter[:, starts].reshape(n * W, -1), post.stoch[:, starts].reshape(n * W, *post.stoch.shape[2:]))
    window = torch.stack([torch.arange(t0 + 1, t0 + 1 + horizon) for t0 in starts])  # (W, h)
    ctrl = torch.cat([seq.prev_action, seq.prev_input], -1)[:, window].reshape(n * W, horizon, -1)
    m, _ = model.decode(_soft_imagine(model, st, ctrl))  # (nW, h, D)
    err = (symexp(m) - y[:, window].reshape(n * W, horizon, -1)).pow(2).mean((1, 2))  # (nW,)
    return one_step + 0.5 * torch.log(err.clamp_min(1e-8)).reshape(n, W).mean(1)


@contextlib.contextmanager
def _frozen(model):
    """Model weights out of autograd (only the corrections get gradients), eval mode."""
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
        model.train(was_training)


@dataclass
class Evaluation:
    J: np.ndarray  # (n,) objective per block
    grad: np.ndarray  # (n, p) dJ_b / dtheta per block

    @classmethod
    def merged(cls, parts: list[Evaluation], order: np.ndarray) -> Evaluation:
        """Per-fold evaluations (folds.per_fold) back in block order."""
        inverse = restore_order(order)
        return cls(np.concatenate([p.J for p in parts])[inverse], np.concatenate([p.grad for p in parts])[inverse])


ROWS_PER_PASS = 64  # block copies in one batched pass when several thetas are evaluated at once
# (the evaluations' own chunk: a size1m model is compute-bound on a CPU at 48 rows, and 500-row
# passes were slower per row; small models gain from filling a pass)


def _repeat(x: torch.Tensor, m: int) -> torch.Tensor:
    """(n, ...) -> (m n, ...): m copies along the batch axis, copy i at rows i n .. (i + 1) n - 1."""
    return x if m == 1 else x.repeat(m, *([1] * (x.dim() - 1)))


def _passes(
    model, data: FitData, thetas: np.ndarray, layout: Layout, context: int, horizon: int, grad: bool, chunk: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """J (m, n) at every theta of thetas (m, p) for every block and, with `grad`, its gradient
    (m, n, p) from one backward pass. The m thetas go through the model together (each block
    repeated m times, at most ROWS_PER_PASS rows a pass): a pass over a few blocks of a small model
    is dominated by per-step overhead, which the copies share; a `size1m` model is compute-bound
    at 48 rows, and there it gains nothing. One model (FoldModels are split by the callers)."""
    m, p = thetas.shape
    n = len(data)
    J = np.zeros((m, n))
    G = np.zeros((m, n, p)) if grad else None
    per = max(1, min(chunk, ROWS_PER_PASS // m))
    with _frozen(model), torch.enable_grad() if grad else torch.no_grad():
        for sl, batch, drv, tok in data.chunks(per, model):
            nb = drv.shape[0]
            rows = torch.as_tensor(thetas, dtype=torch.float32).repeat_interleave(nb, 0)  # (m nb, p)
            if grad:
                rows.requires_grad_(True)
            pa, pi = corrected_controls(_repeat(drv, m), rows, layout, data.act_mean, data.act_std)
            copies = batch if m == 1 else batch.map(lambda x: _repeat(x, m))
            Jc = objective(model, copies, pa, pi, context, horizon, None if tok is None else _repeat(tok, m))
            J[:, sl] = Jc.detach().double().numpy().reshape(m, nb)
            if grad:
                (g,) = torch.autograd.grad(Jc.sum(), rows)
                G[:, sl] = g.double().numpy().reshape(m, nb, p)
    return J, G


def evaluate_many(
    model, data: FitData, thetas: np.ndarray, layout: Layout, context: int, horizon: int, chunk: int = 64
) -> list[Evaluation]:
    """J and its gradient per block at each theta of thetas (m, p), in batched passes (`_passes`;
    with FoldModels, every block through its fold's model)."""
    thetas = np.atleast_2d(np.asarray(thetas, float))
    if isinstance(model, FoldModels):
        return per_fold(
            model,
            data,
            lambda mk, d, k: evaluate_many(mk, d, thetas, layout, context, horizon, chunk),
            lambda parts, order: [Evaluation.merged([p[i] for p in parts], order) for i in range(len(thetas))],
        )
    J, G = _passes(model, data, thetas, layout, context, horizon, True, chunk)
    return [Evaluation(J[i], G[i]) for i in range(len(thetas))]


def evaluate(
    model, data: FitData, theta: np.ndarray, layout: Layout, context: int, horizon: int, chunk: int = 64
) -> Evaluation:
    """J and its gradient per block at theta (p,): one forward and one backward pass."""
    return evaluate_many(model, data, np.asarray(theta, float)[None], layout, context, horizon, chunk)[0]


def objective_many(
    model, data: FitData, thetas: np.ndarray, layout: Layout, context: int, horizon: int, chunk: int = 64
) -> np.ndarray:
    """Mean J over the blocks at each theta of thetas (m, p), forward passes only (the delay's scan)."""
    thetas = np.atleast_2d(np.asarray(thetas, float))
    if isinstance(model, FoldModels):
        parts = per_fold(
            model,
            data,
            lambda mk, d, k: (objective_many(mk, d, thetas, layout, context, horizon, chunk), len(d)),
            lambda parts, order: parts,
        )
        return sum(j * n for j, n in parts) / sum(n for _, n in parts)
    J, _ = _passes(model, data, thetas, layout, context, horizon, False, chunk)
    return J.mean(1)


def corrected_blocks(data: FitData, theta: np.ndarray, layout: Layout) -> Blocks:
    """The blocks with their drivers corrected by theta (for re-scoring)."""
    with torch.no_grad():
        drv = torch.from_numpy(data.drivers)
        rows = torch.as_tensor(theta, dtype=torch.float32).expand(drv.shape[0], -1)
        pa, pi = corrected_controls(drv, rows, layout, data.act_mean, data.act_std)
    return data.blocks.with_controls(pa.numpy(), pi.numpy())


# ----------------------------------------------------------------------------- the box
def bounds(norm, episodes, layout: Layout, cfg, competence_alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) (p,) of theta: the contiguous range around the identity of each parameter that the
    model can judge on these episodes (attribution.allowed_corrections on GUARD_POINTS candidates
    spanning the configured grids; the deadband symmetric about 0), one parameter at a time."""
    lo, hi = np.zeros(len(layout)), np.zeros(len(layout))
    astd = np.maximum(norm.std["action"].astype(float), 1e-12)
    g = np.asarray(cfg.gain_grid, float)
    o = np.asarray(cfg.offset_grid, float)
    wmax = float(max(np.abs(cfg.deadband_grid)))
    cands = {
        "gain": np.log(np.geomspace(g.min(), g.max(), GUARD_POINTS)),
        "offset": np.linspace(o.min(), o.max(), GUARD_POINTS),
        "deadband": np.linspace(-wmax, wmax, GUARD_POINTS),
    }
    for i, p in enumerate(layout.params):
        if p.kind == "delay":
            lo[i], hi[i] = -layout.max_delay, layout.max_delay
            continue
        theta = np.union1d(cands[p.kind], [0.0])  # sorted, with the identity
        values = np.exp(theta) if p.kind == "gain" else theta
        unit = 1.0 if p.kind == "gain" else float(astd[p.channel])
        ok = allowed_corrections(norm, episodes, p.channel, p.kind, values, unit, competence_alpha)
        j0 = int(np.flatnonzero(theta == 0.0)[0])
        a = j0
        while a > 0 and ok[a - 1]:
            a -= 1
        b = j0
        while b < len(theta) - 1 and ok[b + 1]:
            b += 1
        lo[i], hi[i] = theta[a], theta[b]
    return lo, hi


# ----------------------------------------------------------------------------- fit
@dataclass
class Fit:
    theta: np.ndarray  # (p,) fitted (the parameters outside `free` stay 0)
    free: np.ndarray  # (k,) indices fitted
    J0: float  # mean J at the identity
    J1: float  # mean J at the fit
    at_fit: Evaluation
    evaluations: int
    at_bound: np.ndarray  # (k,) bool: the estimate sits on the edge of the box the model can judge


def fit(
    model,
    data: FitData,
    layout: Layout,
    free,
    lo: np.ndarray,
    hi: np.ndarray,
    context: int,
    horizon: int,
    at_identity: Evaluation | None = None,
    max_evals: int = MAX_EVALS,
    start: np.ndarray | None = None,
) -> Fit:
    """Minimise mean_b J_b(theta) + RIDGE / 2 |theta|^2 over theta[free] inside [lo, hi] (L-BFGS with
    strong-Wolfe line search on the projected gradient: a coordinate pushing out of the box stops
    there). J is not convex in the delay over several steps (one step of shift can be a local
    minimum when the true delay is two), so a free delay starts at the best integer shift of a scan
    (forward passes only) and is refined from there with the rest; `start` (p,) replaces the scan
    (a fit that continues from an earlier one). It ends when an iteration gains less than
    TOL_CHANGE, or when STALE_EVALS evaluations since the last gain return the best J again (the
    line search stuck on a corner of the box), and returns the best point it evaluated."""
    free = np.asarray(free, int)
    p = len(layout)
    cache: dict[bytes, Evaluation] = {}
    if at_identity is not None:
        cache[np.zeros(p).tobytes()] = at_identity

    def full(x: np.ndarray) -> np.ndarray:
        theta = np.zeros(p)
        theta[free] = np.clip(x, lo[free], hi[free])
        return theta

    def ev(theta: np.ndarray) -> Evaluation:
        key = theta.tobytes()
        if key not in cache:
            cache[key] = evaluate(model, data, theta, layout, context, horizon)
        return cache[key]

    x0 = np.zeros(len(free)) if start is None else np.clip(np.asarray(start, float)[free], lo[free], hi[free])
    i_d = layout.index("delay")
    scans = 0
    if start is None and i_d is not None and i_d in free:
        shifts = np.arange(-layout.max_delay, layout.max_delay + 1)
        if at_identity is not None:  # its J is known: scan the others, the identity first among equals
            shifts = shifts[shifts != 0]
        th = np.zeros((len(shifts), p))
        th[:, i_d] = shifts
        Js = objective_many(model, data, th, layout, context, horizon)  # (shifts,) in batched passes
        scans = len(shifts)
        if at_identity is not None:
            shifts, Js = np.append(0, shifts), np.append(at_identity.J.mean(), Js)
        x0[list(free).index(i_d)] = shifts[int(np.argmin(Js))]
        if len(free) == 1:  # the delay alone: a bracketed search (delay_search)

            def J_and_grad(d: float) -> tuple[float, float]:
                e = ev(full(np.array([d])))
                return float(e.J.mean()), float(e.grad.mean(0)[i_d])

            d, _ = delay_search(J_and_grad, x0[0], shifts, Js, lo[i_d], hi[i_d], max_evals)
            return _finish(full(np.array([d])), free, lo, hi, ev, p, len(cache) + scans)
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [x],
        lr=1.0,
        max_iter=max_evals,
        max_eval=max_evals,
        history_size=10,
        line_search_fn="strong_wolfe",
        tolerance_grad=TOL_GRAD,
        tolerance_change=TOL_CHANGE,
    )

    progress = Progress(full(x0))

    def closure():
        xv = x.detach().numpy()
        theta = full(xv)
        e = ev(theta)
        g = e.grad.mean(0)[free] + RIDGE * theta[free]
        # projected gradient: no push past a bound
        g = np.where(((theta[free] >= hi[free]) & (g < 0)) | ((theta[free] <= lo[free]) & (g > 0)), 0.0, g)
        x.grad = torch.from_numpy(g)
        obj = float(e.J.mean() + 0.5 * RIDGE * np.sum(theta[free] ** 2))
        if progress.stop_after(obj, theta):
            raise _Converged
        return torch.tensor(obj, dtype=torch.float64)

    if len(free):
        with contextlib.suppress(_Converged):
            opt.step(closure)
    theta = progress.theta if len(free) else full(x.detach().numpy())
    return _finish(theta, free, lo, hi, ev, p, len(cache) + scans)


def _finish(theta: np.ndarray, free: np.ndarray, lo, hi, ev, p: int, evaluations: int) -> Fit:
    """The Fit at theta: its evaluation, J at the identity and which estimates sit on the box."""
    at_fit = ev(theta)
    J0 = float(ev(np.zeros(p)).J.mean())
    tol = 1e-9
    at_bound = (theta[free] <= lo[free] + tol) & (lo[free] < -tol) | (theta[free] >= hi[free] - tol) & (hi[free] > tol)
    at_bound |= (lo[free] == 0) & (hi[free] == 0)
    return Fit(theta, free, J0, float(at_fit.J.mean()), at_fit, evaluations, at_bound)


def delay_search(
    J_and_grad, d0: float, shifts: np.ndarray, Js: np.ndarray, lo: float, hi: float, max_evals: int
) -> tuple[float, int]:
    """The delay alone (J_and_grad(d) -> mean J and its derivative in d; Js the scan's mean J at the
    whole shifts), refined from the scan's best whole shift d0 by a safeguarded Newton search on
    mean J + RIDGE / 2 d^2 (J is C1 in the delay: Catmull-Rom shift).

    The minimum lies between d0 and its downhill neighbour (d0 is the scan's best; the gradient
    at d0 says which side), whose J the scan already has: that is the bracket [a, b], a the best
    point so far. Each step evaluates J and its gradient at the Newton point of the secant
    curvature between a and the last other point with a gradient, when that curvature is
    positive and the point falls inside the bracket; otherwise at the minimiser of the
    bracket's interpolant (`_interpolated_minimum`). The bracket keeps the side that holds the
    minimum. The search ends when the gradient is below TOL_GRAD, the bracket or the last
    step's gain is below TOL_CHANGE, the gain the next step promises (g^2 / 2c for the secant,
    the interpolant's otherwise) is below TOL_CHANGE, or after max_evals. It returns the best
    delay evaluated and the number of evaluations (docs/benchmarks.md compares it with
    L-BFGS on the same problem)."""
    known = {float(d): float(J) + 0.5 * RIDGE * float(d) ** 2 for d, J in zip(shifts, Js)}

    def objective(d: float) -> tuple[float, float]:
        J, g = J_and_grad(d)
        return float(J) + 0.5 * RIDGE * d * d, float(g) + RIDGE * d

    a = float(np.clip(d0, lo, hi))
    Ja, ga = objective(a)
    evals = 1
    if abs(ga) <= TOL_GRAD:
        return a, evals
    b = float(np.clip(a - np.sign(ga), lo, hi))  # the downhill neighbour
    if abs(b - a) <= TOL_CHANGE:
        return a, evals  # on the edge of the box, pushing out
    gb = None
    if b in known:
        Jb = known[b]
    else:
        Jb, gb = objective(b)
        evals += 1
    other = (b, gb) if gb is not None else None  # the last point besides a with a gradient
    while evals < max_evals and abs(ga) > TOL_GRAD and abs(b - a) > TOL_CHANGE:
        c = (ga - other[1]) / (a - other[0]) if other is not None else 0.0
        newton = a - ga / c if c > 0 else np.nan
        if c > 0 and 0 < (newton - a) / (b - a) < 1:
            t, predicted = newton, 0.5 * ga * ga / c
        else:
            t, predicted = _interpolated_minimum(a, Ja, ga, b, Jb, gb)
        if predicted <= TOL_CHANGE:
            break  # the next step promises less than a gain worth an evaluation
        Jt, gt = objective(t)
        evals += 1
        if Jt >= Ja:  # the minimum lies between a and t
            b, Jb, gb = t, Jt, gt
            other = (t, gt)
            continue
        gain = Ja - Jt
        if gt * (b - t) >= 0:  # downhill from t points back toward a: the minimum is between them
            b, Jb, gb = a, Ja, ga
        other = (a, ga)
        a, Ja, ga = t, Jt, gt
        if gain <= TOL_CHANGE:
            break
    return a, evals


def _interpolated_minimum(a: float, Ja: float, ga: float, b: float, Jb: float, gb: float | None) -> tuple[float, float]:
    """The minimiser on [a, b] of the quadratic through (Ja, ga at a; Jb at b), or of the cubic
    through both ends' values and gradients (Nocedal & Wright eq. 3.59), kept within the inner
    80 % of the bracket (the midpoint where the interpolant has no interior minimum); and the
    gain the unclipped minimiser promises, -ga (t - a) / 2 (exact for a quadratic), or inf
    where the interpolant has no minimum inside the bracket."""
    h = b - a
    s = 0.5
    if gb is None:
        q = Jb - Ja - ga * h  # curvature term of J(a + s h) = Ja + ga h s + q s^2
        if q > 0:
            s = -ga * h / (2 * q)
    else:
        d1 = ga + gb - 3 * (Ja - Jb) / (a - b)
        disc = d1 * d1 - ga * gb
        if disc >= 0:
            d2 = np.sign(b - a) * np.sqrt(disc)
            denom = gb - ga + 2 * d2
            if denom != 0:
                s = 1 - (gb + d2 - d1) / denom
    predicted = max(-0.5 * ga * s * h, 0.0) if 0 < s < 1 else np.inf
    return a + float(np.clip(s, 0.1, 0.9)) * h, predicted


def cluster_score_cov(grad: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Covariance of the mean score over blocks, with episodes as the clusters: grad (n, k) -> (k, k)."""
    n = len(grad)
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    E = int(inv.max()) + 1 if n else 0
    psi = np.zeros((E, grad.shape[1]))
    np.add.at(psi, inv, grad / n)  # per-episode contribution to the mean score
    psi -= psi.mean(0, keepdims=True) if E else 0.0
    return psi.T @ psi * (E / max(E - 1, 1))


def hessian(
    model, data: FitData, layout: Layout, f: Fit, lo, hi, context: int, horizon: int
) -> tuple[np.ndarray, bool, int]:
    """(k, k) Hessian of the mean J at the fit over its free parameters, by forward differences of
    the mean gradient, symmetrised, plus the ridge; whether it is positive definite (a minimum;
    otherwise its eigenvalues are floored, and the interval is approximate); and the objective
    evaluations it took (k + 1, in batched passes)."""
    k = len(f.free)
    steps = np.array([FD_STEP if f.theta[j] + FD_STEP <= hi[j] else -FD_STEP for j in f.free])
    th = np.repeat(f.theta[None], k + 1, 0)  # row 0: the fit itself, in the same batched pass as the steps
    th[1 + np.arange(k), f.free] += steps
    evs = evaluate_many(model, data, th, layout, context, horizon)
    g = np.stack([e.grad.mean(0)[f.free] for e in evs])  # (k + 1, k)
    H = ((g[1:] - g[0]) / steps[:, None]).T  # column j: the change of the gradient along parameter j
    return (*floored(H), len(th))


def floored(H: np.ndarray) -> tuple[np.ndarray, bool]:
    """A finite-difference Hessian (k, k) symmetrised, plus the ridge, with its eigenvalues floored
    at 1e-3 of the largest; and whether it was positive definite before the floor."""
    k = len(H)
    H = 0.5 * (H + H.T) + RIDGE * np.eye(k)
    w, V = np.linalg.eigh(H)
    ok = bool(w.min() > 0) if k else True
    floor = max(1e-6, 1e-3 * float(np.abs(w).max()) if k else 1e-6)
    return (V * np.maximum(w, floor)) @ V.T, ok


def sandwich(H: np.ndarray, grad: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Cluster-robust covariance of the fit: H^-1 S H^-1 with S from per-block scores (n, k)."""
    Hi = np.linalg.inv(H)
    return Hi @ cluster_score_cov(grad, groups) @ Hi


# ----------------------------------------------------------------------------- calibration side
@dataclass
class Reference:
    """The held-out real blocks' side of the fit (calibration): the score test's null and the fit
    that says what the model itself prefers."""

    scores: np.ndarray  # (m, p) dJ/dtheta per real block at the identity
    theta: np.ndarray  # (p,) the joint fit of every parameter on the real blocks
    scores_at_fit: np.ndarray  # (m, p) the real blocks' scores at that fit (its variance)
    dims: tuple[int, int] = (0, 0)  # (command, exogenous input) channels: the layout
    max_delay: int = 0

    @property
    def layout(self) -> Layout:
        return Layout.of(*self.dims, self.max_delay)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "sysid/scores": self.scores,
            "sysid/theta": self.theta,
            "sysid/scores_at_fit": self.scores_at_fit,
            "sysid/dims": np.array([*self.dims, self.max_delay]),
        }

    @classmethod
    def from_arrays(cls, arrays) -> Reference | None:
        if "sysid/scores" not in arrays:
            return None
        A, E, max_delay = (int(v) for v in np.asarray(arrays["sysid/dims"]))
        return cls(
            np.asarray(arrays["sysid/scores"]),
            np.asarray(arrays["sysid/theta"]),
            np.asarray(arrays["sysid/scores_at_fit"]),
            (A, E),
            max_delay,
        )


def reference(model, episodes, blocks: Blocks, norm, cfg) -> Reference:
    """The Reference of held-out real episodes cut into `blocks`."""
    layout = Layout.for_normalizer(norm, cfg.max_delay)
    data = FitData.of(episodes, blocks, norm, layout)
    ident = evaluate(model, data, np.zeros(len(layout)), layout, cfg.context, ATTRIBUTION_HORIZON)
    lo, hi = bounds(norm, episodes, layout, cfg, cfg.competence_alpha)
    f = fit(model, data, layout, np.arange(len(layout)), lo, hi, cfg.context, ATTRIBUTION_HORIZON, ident)
    return Reference(ident.grad, f.theta, f.at_fit.grad, (layout.n_actions, layout.n_inputs), layout.max_delay)


ATTRIBUTION_HORIZON = MIN_HORIZON
"""Open-loop steps of the objective's rollouts (scoring.attribution_objective's horizon); a block
imagines at least this many (datasets.windows.MIN_HORIZON)."""


# ----------------------------------------------------------------------------- estimates
@dataclass
class Estimate:
    """One fitted correction in physical units, relative to the real blocks' own fit."""

    param: Param
    channel: str | None  # command channel name (None for the delay)
    value: float  # steps (delay), factor (gain), raw units (offset, deadband)
    interval: tuple[float, float]  # 95 %
    t: float  # its score test's Welch t (checked vs real)
    at_bound: bool = False  # at the edge of what the model can judge


def excludes_identity(e: Estimate) -> bool:
    """Whether the estimate's 95 % interval leaves out the identity (gain 1, any other kind 0)."""
    identity = 1.0 if e.param.kind == "gain" else 0.0
    lo, hi = e.interval
    return bool(np.isfinite(lo) and np.isfinite(hi)) and not (lo <= identity <= hi)  # NaN: nothing excluded


def physical(p: Param, theta: float, act_std: np.ndarray) -> float:
    if p.kind == "delay":
        return float(theta)
    if p.kind == "gain":
        return float(np.exp(theta))
    return float(theta * act_std[p.channel])


@dataclass
class SysidResult:
    """What the latency and actuator rows need from the fit."""

    layout: Layout
    fit: Fit | None  # None when no test fired
    estimates: list[Estimate] = field(default_factory=list)
    confounded: list[tuple[str, str, float]] = field(default_factory=list)
    curvature_ok: bool = True
    evaluations: int = 0
    relative: np.ndarray | None = None  # (k,) fitted - real reference, parameter scale (fit.free order)
    covariance: np.ndarray | None = None  # (k, k) of `relative` (checked sandwich + the real reference's)

    def support(self, cols) -> float:
        """Joint Wald statistic of the fitted parameters among `cols` against the identity, over its
        chi-square 95 % critical value (square-rooted: >= 1 means the corrections together exclude
        the identity). Joint, because confounded parameters (a gain and a deadband) can each have a
        wide interval while their combination is well determined."""
        if self.fit is None or self.relative is None:
            return 0.0
        idx = [i for i, j in enumerate(self.fit.free) if j in set(int(c) for c in cols)]
        if not idx:
            return 0.0
        r = self.relative[idx]
        w = float(r @ np.linalg.pinv(self.covariance[np.ix_(idx, idx)], rcond=1e-10) @ r)
        return float(np.sqrt(max(w, 0.0) / chi2_isf(0.05, len(idx))))


def estimates(
    result_fit: Fit, layout: Layout, cov: np.ndarray, ref: Reference, H: np.ndarray, real_groups, names, act_std, t_of
) -> tuple[list[Estimate], list[tuple[str, str, float]], np.ndarray, np.ndarray]:
    """Estimates relative to the real reference, 95 % intervals (the checked sandwich plus the real
    fit's, the latter with the checked Hessian), the confounded pairs (from the estimates'
    correlation), and the relative parameters (k,) with their covariance (k, k)."""
    free = result_fit.free
    cov_real = sandwich(H, ref.scores_at_fit[:, free], real_groups)
    total = cov + cov_real
    sd = np.sqrt(np.maximum(np.diag(total), 0.0))
    corr = total / np.maximum(np.outer(sd, sd), 1e-300)
    out = []
    for i, j in enumerate(free):
        p = layout.params[j]
        rel = result_fit.theta[j] - ref.theta[j]
        lo, hi = rel - 1.96 * sd[i], rel + 1.96 * sd[i]
        out.append(
            Estimate(
                p,
                None if p.channel is None else names[p.channel],
                physical(p, rel, act_std),
                (physical(p, lo, act_std), physical(p, hi, act_std)),
                float(t_of(j)),
                bool(result_fit.at_bound[i]),
            )
        )
    labels = [label(e) for e in out]
    pairs = [
        (labels[a], labels[b], float(corr[a, b]))
        for a in range(len(out))
        for b in range(a + 1, len(out))
        if abs(corr[a, b]) >= CONFOUNDED
    ]
    rel = result_fit.theta[free] - ref.theta[free]
    return out, pairs, rel, total


def chi2_isf(p: float, k: int) -> float:
    """Upper p-quantile of the chi-square distribution with k degrees of freedom: exact for k = 1
    (the normal's) and k = 2 (-2 ln p), Wilson-Hilferty's cube-root approximation beyond (within
    0.6 % at p = 0.05 for k >= 3, slightly low at k = 3)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - p)
    if k == 1:
        z2 = NormalDist().inv_cdf(1 - p / 2)
        return z2 * z2
    if k == 2:
        return -2.0 * float(np.log(p))
    c = 2.0 / (9.0 * k)
    return k * (1 - c + z * np.sqrt(c)) ** 3


def describe(kind: str, channel: str | None) -> str:
    """A correction in words: "delay", "gain on torque", or "gain on every command channel"."""
    if kind == "delay":
        return "delay"
    return f"{kind} on {'every command channel' if channel is None else channel}"


def label(e: Estimate) -> str:
    return describe(e.param.kind, e.channel)


# ----------------------------------------------------------------------------- detection
COMMON_GAIN = Param("gain", None)
"""One gain on every tested command channel: the score test's extra cell (`test_params`).

Why. The test takes the largest |t| over its cells, so each channel's gain must stand out alone
against a null over every parameter (3 per command channel, and the delay). A gap that scales
every channel's response at once (a motor constant, a supply voltage, a mass that every joint
moves) moves all the gain scores the same way by a little each. On Pusher (7 channels,
docs/benchmarks.md, twenty-fifth session) commands acting twice as strongly gave gain-score t's
of 1.9 to 4.1 on the 7 channels, none reaching the level, and the check named dynamics. The
derivative of the objective along equal log-gains is the sum of the gain scores: one cell that
gathers them, whose t grows with the number of channels that agree. The permutation null takes
the largest |t| over all cells, so the extra cell costs one correlated cell of multiplicity."""


def test_params(layout: Layout, cols) -> list[Param]:
    """The score test's cells: the parameters `cols`, then COMMON_GAIN when they hold 2 gains or more."""
    params = [layout.params[j] for j in cols]
    return params + [COMMON_GAIN] if sum(p.kind == "gain" for p in params) >= 2 else params


def test_cells(scores: np.ndarray, layout: Layout, cols) -> np.ndarray:
    """(n, len(test_params)) per-block scores of the test's cells: the columns `cols` of `scores`
    (n, p), then the sum of their gain columns (the score of one gain on every channel)."""
    x = scores[:, cols]
    if len(test_params(layout, cols)) == len(cols):  # no COMMON_GAIN cell
        return x
    gains = [i for i, j in enumerate(cols) if layout.params[j].kind == "gain"]
    return np.concatenate([x, x[:, gains].sum(1, keepdims=True)], 1)


def score_test(
    checked: np.ndarray,
    groups: np.ndarray,
    real: np.ndarray,
    real_groups: np.ndarray,
    cols: np.ndarray,
    level: float,
    rng: np.random.Generator,
    boot_idx=None,
    twin: np.ndarray | None = None,
    permutations: int | None = None,
    layout: Layout | None = None,
):
    """The score test of the module docstring on per-block scores checked (n, p) / real (m, p),
    over the parameters `cols` (and, with `layout`, one gain on every channel: COMMON_GAIN);
    paired when `twin` (n,) gives every checked block's real twin. Returns a bias.BiasTest whose
    cells are `test_params(layout, cols)`."""
    from wmcheck.checks import bias as ob

    kw = {} if permutations is None else {"permutations": permutations}

    def cells(scores: np.ndarray) -> np.ndarray:
        return scores[:, cols] if layout is None else test_cells(scores, layout, cols)

    x = cells(checked)
    if twin is not None and len(twin) and (np.asarray(twin) >= 0).all():
        return ob.paired_bias_test(x, cells(real[np.asarray(twin)]), groups, level, rng, boot_idx, **kw)
    return ob.bias_test(x, groups, cells(real), real_groups, level, rng, boot_idx, **kw)
