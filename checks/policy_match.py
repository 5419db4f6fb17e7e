"""Whether the checked commands follow the real logs' behaviour policy: the condition under which
the corrections' score tests (latency, actuator; sysid.py) have a valid null.

Owns `PolicyPairs` (per step: what a policy could see and what it commanded), `policy_pairs`
(episodes -> pairs), `policy_shift_test` (checked pairs against the held-out real pairs) and its
result `PolicyShift`.

Why it exists. The score tests compare how the model's objective would change under a delay or a
gain on the checked data with how it changes on the held-out real blocks. The model is not exact:
its small errors depend on the state. Under a closed-loop controller the commands are a function of
the state, so they correlate with the model's errors in another way than under the logs' policy,
and a faithful simulator moves the scores as much as a one-step latency does (docs/benchmarks.md:
a PD controller on Pendulum failed the latency or actuator test in 3 of 3 faithful checks). This is
the closed-loop identification problem of system identification. The real blocks are a null only
for checked data whose commands relate to what the controller sees as the logs' commands do.

What is tested. A policy maps what it sees to a command, and that map does not depend on the
simulator it drives: a delay, a gain or noise in the simulator change the states it visits, not
the command it would choose in a given state. So the test is a two-sample test of the commands'
conditional law given the conditions, not of the states (that is the distribution row):
  - conditions at step t: the observation o_t, the exogenous inputs acting during t and the
    previous command u_{t-1} (a behaviour policy that holds a random command for K steps depends
    on it, and through the dynamics o_t depends on u_{t-1} too: leaving it out would make the
    conditional law of u_t depend on the simulator's dynamics);
  - but only u_{t-1} when the real commands do not depend on the rest (`uses_observations`:
    episode-blocked cross-validation, one-standard-error rule), as for open-loop excitation. A
    policy with a hidden state (hold:5 keeps a command for exactly 5 steps, so it depends on the
    time since the last change) is not a function of (o_t, u_{t-1}); when o_t carries some of that
    state, differently under other dynamics, the conditional law given o_t moves with the
    simulator. On HalfCheetah that made the test reject 17 of 28 gapped simulators under the logs'
    own policy (docs/benchmarks.md). Where o_t reveals the hidden state well enough for the
    cross-validation to keep it (a measured actuator force with a first-order lag, in a numpy
    experiment: 36 of 40 checks rejected for another lag), the test still conflates the two;
  - targets: every command channel u_t and its square (the level and the amplitude);
  - each group's conditional means by ridge regression on the conditions and random Fourier
    features of them (both standardised on the held-out real conditions);
  - statistic: the Chow (Wald) statistic of the two groups' coefficients, d' S^-1 d with d the
    difference of the fits and S = G_c^-1 + G_r^-1 its covariance per unit noise variance (G the
    penalised normal equations of each side), summed over the targets;
  - null: whole episodes permuted between the groups (each episode keeps its pairs, so the policy
    it followed travels with it). A group's fit is a sum of its episodes' sufficient statistics,
    so a permutation costs a few small solves. The permutation p-value is exact for this statistic.
Why the Wald form: a simulator moves the states the policy sees, so the two groups' conditions
have different laws and the permutation's exchangeability holds only approximately. A plain
distance between the fits is then inflated where one side has few points (its fit extrapolates,
and a permuted split, a mixture of both, never does): on a lightly damped oscillator under the logs'
own policy with a gain x2 it rejected 30 % of the checks at alpha 0.1. The Wald form weighs the
difference by how well both sides determine it, and rejected none (tests/test_policy_match.py).
`effect` is how far apart the two policies' commands are in a given situation: the root mean
square difference of the two fits over the pooled steps, in standard deviations of the real commands.

The joint law, where the real commands do not depend on the states. The Wald form weighs the
difference by how well both sides determine it, so a checked group whose conditions fill a thin
set is weighed as hardly determined. A scripted input (the same sweep, drive cycle or test
profile in every episode) is the extreme: on Pusher (docs/benchmarks.md, twenty-fifth session)
six checked episodes of one sinusoidal sweep against held random commands gave p = 1.0 (the
observed split the least different of 999), and faithful simulators under the sweep failed on
actuator and on divergence. Where the real commands are open-loop, the pairs (u_{t-1}, u_t) have
the same law under the logs' policy whatever the simulator, so a two-sample test of that joint
law is valid: the random-feature MMD with whole episodes permuted (stats.block_mmd_test), which
gave p = 0.001 there. It does not replace the Wald test (which alone found held commands of 2
steps against 5: p 0.001 against the MMD's 0.23); the two are combined by Bonferroni (twice the
smaller p). Where the real commands depend on the states, the joint law moves with the
simulator and only the conditional test runs.

Where the test is approximate: a closed loop (`PolicyShift.closed_loop`). The conditional law
given (o_t, inputs, u_{t-1}) is the policy's alone only when the policy has no other state and the
regression fits it everywhere both groups go. A controller keeps state (an excitation held for some
steps, an integrator, a filter) and is nonlinear (clipped commands, angles from sines and
cosines), and a simulator that differs visits other states: the two groups' best fits then differ
under the same controller. On the double pendulum under its engineers' LQR (docs/benchmarks.md,
twenty-eighth session) the test rejected 26 of 30 gapped simulators under the logs' own
controller, and 7 of 22 faithful ones under two other LQRs. More history in the conditions (o_{t-1},
u_{t-2}), a squared-residual target, linear terms only and the real conditions' support were tried
there; none made it valid and powerful at once. So the team says it: `declared` ("logs": the
checked commands come from the logs' controller; "other": from another policy), which the decision
follows instead of the test (`--checked-policy`); the report keeps the test's p for information.
Undeclared, a closed loop is taken as another policy whatever the test says (`undetermined` where
it does not reject): a finding the policy moves is then `unverifiable`, never a fail that a faithful
simulator under another controller would give (2 of 6 did on the double pendulum), and the report
says that declaring `logs` gives the check its power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wmcheck.checks.stats import _random_subsets, block_mmd_test, median_bandwidth

DECLARATIONS = ("auto", "logs", "other")  # who says which policy the checked commands follow (PolicyShift.declared)
MAX_STEPS_PER_EPISODE = 200  # pairs kept per episode (evenly spaced): enough for the conditional means
FEATURES = 64  # random Fourier features of the conditions (besides the linear terms)
RIDGE = 1e-3  # ridge penalty per step, relative to the features' mean square
PERMUTATIONS = 999


@dataclass
class PolicyPairs:
    """What a policy could see at each step and what it commanded, normalised, with episode labels."""

    conditions: np.ndarray  # (N, D + E + A) o_t, inputs during t, u_{t-1}
    commands: np.ndarray  # (N, A) u_t
    episode: np.ndarray  # (N,) episode id of each pair

    def __len__(self) -> int:
        return int(self.commands.shape[0])

    def to_arrays(self, prefix: str = "policy_") -> dict[str, np.ndarray]:
        return {
            prefix + "conditions": self.conditions.astype(np.float32),
            prefix + "commands": self.commands.astype(np.float32),
            prefix + "episode": self.episode.astype(np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict, prefix: str = "policy_") -> PolicyPairs | None:
        if prefix + "commands" not in arrays:
            return None
        return cls(arrays[prefix + "conditions"], arrays[prefix + "commands"], arrays[prefix + "episode"])


def policy_pairs(episodes, norm, max_steps: int = MAX_STEPS_PER_EPISODE) -> PolicyPairs | None:
    """The (conditions, command) pairs of every episode's steps t >= 1 (t = 0 has no previous
    command), at most `max_steps` per episode, evenly spaced; None without command channels."""
    if norm.dim("action") == 0:
        return None
    conds, cmds, eps = [], [], []
    for e in episodes:
        n = e.num_steps
        if n < 2:
            continue
        t = np.unique(np.linspace(1, n - 1, min(max_steps, n - 1)).round().astype(int))  # (k,)
        obs = norm.norm_obs(e.observations[t].astype(np.float64))  # (k, D)
        act = norm.norm_action(e.actions.astype(np.float64))  # (N, A)
        inp = norm.norm_input(e.input_array()[t].astype(np.float64)) if norm.dim("input") else np.zeros((len(t), 0))
        conds.append(np.concatenate([obs, inp, act[t - 1]], 1))
        cmds.append(act[t])
        eps.append(np.full(len(t), e.id))
    if not cmds:
        return None
    return PolicyPairs(np.concatenate(conds), np.concatenate(cmds), np.concatenate(eps))


@dataclass
class PolicyShift:
    """The policy-shift test's outcome. `shifted` is the only thing the decision reads."""

    p_value: float = math.nan
    statistic: float = math.nan  # the Chow statistic per step and target (module docstring)
    effect: float = math.nan  # command std apart in a given situation (RMS difference of the fits)
    alpha: float = 0.05
    checked_episodes: int = 0
    real_episodes: int = 0
    testable: bool = True  # False: too few episodes to reach alpha, or no pairs (reason says which)
    reason: str = ""
    conditional_p: float = math.nan  # the Wald test of the conditional means alone
    joint_p: float = math.nan  # the MMD of (u_{t-1}, u_t) pairs (open-loop real commands only; nan: not run)
    closed_loop: bool = False  # the real commands depend on the states (`uses_observations`): the test is approximate
    declared: str = "auto"  # DECLARATIONS: "logs" / "other" is the team's word for it (`--checked-policy`)

    @property
    def rejects(self) -> bool:
        """The test rejects at alpha: the checked commands are not those of the logs' policy."""
        return self.testable and not math.isnan(self.p_value) and self.p_value < self.alpha

    @property
    def undetermined(self) -> bool:
        """Undeclared, on a closed loop, and the test does not reject: on such a loop it cannot tell
        another controller from a simulator that differs under the logs' own (module docstring), so
        nothing says that the checked commands are the logs' policy's."""
        return self.declared == "auto" and self.closed_loop and not self.rejects

    @property
    def shifted(self) -> bool:
        """The decision takes the checked commands as another policy's than the real logs': as the
        team declared it; undeclared, where the test rejects or cannot tell (`undetermined`)."""
        return {"logs": False, "other": True}.get(self.declared, self.rejects or self.closed_loop)

    def to_dict(self) -> dict:
        return {
            "p_value": self.p_value,
            "statistic": self.statistic,
            "effect_std": self.effect,
            "alpha": self.alpha,
            "shifted": self.shifted,
            "testable": self.testable,
            "checked_episodes": self.checked_episodes,
            "real_episodes": self.real_episodes,
            "reason": self.reason,
            "conditional_p": self.conditional_p,
            "joint_p": self.joint_p,
            "test_rejects": self.rejects,
            "undetermined": self.undetermined,
            "closed_loop": self.closed_loop,
            "declared": self.declared,
        }


def _features(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, 1 + d + F): a constant, the standardised conditions and their random Fourier features."""
    rff = np.sqrt(2.0) * np.cos(x @ W + b)  # unit mean square, like the standardised linear terms
    return np.concatenate([np.ones((len(x), 1)), x, rff], 1)


def _scale(ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) per column of `ref`, a constant column's std taken as 1: standardise with them."""
    sd = ref.std(0)
    return ref.mean(0), np.where(sd > 1e-9, sd, 1.0)


def _targets(pairs: PolicyPairs) -> np.ndarray:
    return np.concatenate([pairs.commands, pairs.commands**2], 1)  # (N, 2A): level and amplitude


LOOP_FOLDS = 4  # folds of `uses_observations`; with fewer real episodes it cannot tell a closed loop


def uses_observations(
    real: PolicyPairs, rng: np.random.Generator, folds: int = LOOP_FOLDS, features: int = FEATURES
) -> bool:
    """Whether the real logs' commands depend on what the policy observes beyond its previous command:
    episode-blocked cross-validation of the conditional means with all conditions against the
    previous command alone, with the one-standard-error rule (the simpler model unless the full one
    predicts held-out episodes better by more than the folds' spread). False for open-loop
    excitation (random commands held K steps), True for a controller."""
    A = real.commands.shape[1]
    ids = np.unique(real.episode)
    if len(ids) < folds:
        return True
    fold = np.searchsorted(ids, real.episode) % folds  # (N,) episodes dealt to folds
    y = _targets(real)
    ym, ys = _scale(y)
    y = (y - ym) / ys

    def cv_errors(x: np.ndarray) -> np.ndarray:  # (folds,) held-out mean squared error
        xm, xs = _scale(x)
        x = (x - xm) / xs
        W = rng.normal(size=(x.shape[1], features)) / median_bandwidth(x, rng)
        phi = _features(x, W, rng.uniform(0, 2 * np.pi, size=features))
        out = np.empty(folds)
        for f in range(folds):
            tr, te = fold != f, fold == f
            G = phi[tr].T @ phi[tr]
            G += RIDGE * np.trace(G) / len(G) * np.eye(len(G))
            out[f] = float(((phi[te] @ np.linalg.solve(G, phi[tr].T @ y[tr]) - y[te]) ** 2).mean())
        return out

    gain = cv_errors(real.conditions[:, -A:]) - cv_errors(real.conditions)  # (folds,) > 0: observations help
    return bool(gain.mean() > gain.std(ddof=1) / math.sqrt(folds))


def _previous_command_only(pairs: PolicyPairs) -> PolicyPairs:
    A = pairs.commands.shape[1]
    return PolicyPairs(pairs.conditions[:, -A:], pairs.commands, pairs.episode)


def policy_shift_test(
    checked: PolicyPairs | None,
    real: PolicyPairs | None,
    alpha: float,
    rng: np.random.Generator,
    permutations: int = PERMUTATIONS,
    features: int = FEATURES,
    declared: str = "auto",
) -> PolicyShift:
    """Do the checked commands follow the real logs' policy? (module docstring); `declared`: the
    team's word for it (DECLARATIONS), which `PolicyShift.shifted` follows over the test's."""
    if checked is None or real is None or not len(checked) or not len(real):
        return PolicyShift(
            alpha=alpha,
            testable=False,
            reason="no command channels, or no step with a previous command",
            declared=declared,
        )
    open_loop = not uses_observations(real, np.random.default_rng(rng.integers(2**32)))
    if open_loop:
        # the real commands do not depend on the states: condition on the previous command only,
        # so that a simulator that moves the states cannot move the test (module docstring)
        checked, real = _previous_command_only(checked), _previous_command_only(real)
    c_ids, c_owner = np.unique(checked.episode, return_inverse=True)
    r_ids, r_owner = np.unique(real.episode, return_inverse=True)
    n_c, n_r = len(c_ids), len(r_ids)
    closed_loop = not open_loop and n_r >= LOOP_FOLDS  # fewer: a closed loop is assumed to condition on, not known
    out = PolicyShift(alpha=alpha, checked_episodes=n_c, real_episodes=n_r, closed_loop=closed_loop, declared=declared)
    if math.comb(n_c + n_r, n_c) < 1.0 / alpha:  # no split of so few episodes can reach alpha
        out.testable, out.reason = False, f"{n_c} checked and {n_r} real episodes are too few to reach p < {alpha:g}"
        return out
    mu, sd = _scale(real.conditions)
    xr, xc = (real.conditions - mu) / sd, (checked.conditions - mu) / sd  # (Nr, d), (Nc, d)
    yr_raw, yc_raw = _targets(real), _targets(checked)  # (N, 2A)
    ym, ys = _scale(yr_raw)
    y = (np.concatenate([yc_raw, yr_raw]) - ym) / ys  # (N, K) checked first
    x = np.concatenate([xc, xr])  # (N, d)
    bw = median_bandwidth(xr, rng)
    W = rng.normal(size=(x.shape[1], features)) / bw  # (d, F)
    b = rng.uniform(0, 2 * np.pi, size=features)
    phi = _features(x, W, b)  # (N, P_)
    owner = np.concatenate([c_owner, n_c + r_owner])  # (N,) unit of each pair: checked episodes first
    U, P_ = n_c + n_r, phi.shape[1]
    A = np.zeros((U, P_, P_))  # per episode: phi' phi
    B = np.zeros((U, P_, y.shape[1]))  # per episode: phi' y
    order = np.argsort(owner, kind="stable")  # each episode's pairs contiguous, in their own order
    bounds = np.searchsorted(owner[order], np.arange(U + 1))
    phi_o, y_o = phi[order], y[order]
    n = np.diff(bounds).astype(float)
    for u in range(U):
        f, t = phi_o[bounds[u] : bounds[u + 1]], y_o[bounds[u] : bounds[u + 1]]
        A[u], B[u] = f.T @ f, f.T @ t
    M = A.sum(0) / n.sum()  # (P_, P_) the pooled steps' second moment: where the means are compared
    ridge = RIDGE * np.trace(M) / P_ * np.eye(P_)
    in_c = np.zeros((permutations + 1, U))  # row 0: the observed split
    in_c[0, :n_c] = 1.0
    in_c[np.arange(1, permutations + 1)[:, None], _random_subsets(rng, permutations, U, n_c)] = 1.0
    stats = np.empty(permutations + 1)
    A_all, B_all = A.sum(0), B.sum(0)
    A_flat, B_flat = A.reshape(U, -1), B.reshape(U, -1)  # group sums as matrix products (BLAS)
    for i in range(0, permutations + 1, 128):  # chunks bound the (chunk, P_, P_) memory
        z = in_c[i : i + 128]
        A_c, B_c, n_cs = (z @ A_flat).reshape(-1, P_, P_), (z @ B_flat).reshape(-1, P_, y.shape[1]), z @ n
        G_c = A_c + n_cs[:, None, None] * ridge  # (p, P_, P_) each side's penalised normal equations
        G_r = (A_all - A_c) + (n.sum() - n_cs)[:, None, None] * ridge
        d = np.linalg.solve(G_c, B_c) - np.linalg.solve(G_r, B_all - B_c)  # (p, P_, K) coefficient difference
        S = np.linalg.inv(G_c) + np.linalg.inv(G_r)  # the difference's covariance, per unit noise variance
        stats[i : i + 128] = np.einsum("pik,pik->p", d, np.linalg.solve(S, d)) / (y.shape[1] * n.sum())
        if i == 0:  # the observed split's effect: mean squared difference of the fits over the pooled steps
            out.effect = float(math.sqrt(max(np.einsum("ik,ij,jk->", d[0], M, d[0]) / y.shape[1], 0.0)))
    out.statistic = float(stats[0])
    out.conditional_p = out.p_value = float((1 + np.sum(stats[1:] >= stats[0])) / (permutations + 1))
    if open_loop:  # the pairs' joint law is the policy's alone: test it too (module docstring)
        out.joint_p = joint_law_p(checked, real, rng, permutations)
        out.p_value = min(1.0, 2.0 * min(out.conditional_p, out.joint_p))
    return out


def joint_law_p(checked: PolicyPairs, real: PolicyPairs, rng: np.random.Generator, permutations: int) -> float:
    """The MMD two-sample test of the (conditions, command) pairs with whole episodes permuted: the
    pairs' joint law, valid only where it does not depend on the simulator (open-loop real
    commands, conditions = the previous command). Both sides standardised on the real pairs."""
    x_c = np.concatenate([checked.conditions, checked.commands], 1)  # (Nc, 2A)
    x_r = np.concatenate([real.conditions, real.commands], 1)  # (Nr, 2A)
    mu, sd = _scale(x_r)

    def episodes(x: np.ndarray, ep: np.ndarray) -> list[np.ndarray]:
        return [(x[ep == e] - mu) / sd for e in np.unique(ep)]

    return block_mmd_test(episodes(x_c, checked.episode), episodes(x_r, real.episode), rng, permutations)[1]
