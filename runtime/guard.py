"""A competence-aware safety wrapper around a deployed policy, driven by the world model.

Owns `Guard` (a plain object for a control loop: `reset(obs)`, then `act(obs, proposed)` every
step) and `GuardedEnv` (the same as a `gymnasium.Wrapper`). At every step the guard:
  1. filters the new observation into the model's latent state (the posterior, given the action
     it applied last step), and scores that observation's one-step prediction (NLL per channel);
  2. (b) competence, from step `context` on (the calibration's context: before it the latent
     state has not converged, and `warmup_controller` acts): the latent state's distance to the
     training latents, in the calibration's units, against the held-out real steps' (1 -
     competence_alpha) quantile; with an ensemble, the heads' disagreement averaged over the last
     `horizon` steps against the real blocks' quantile. Outside for `enter_steps` consecutive
     steps -> the fallback controller acts; inside again for `exit_steps` consecutive steps -> the
     policy acts again (hysteresis);
  3. (c) rollback, from four statistics, the three in-episode ones each tested at `rollback_alpha`
     and the deployment looks at spent levels:
     - one-step: every `rollback_window` steps after the warm-up, the mean one-step NLL of those
       steps gets its conformal p-value against every window of as many consecutive steps in the
       held-out real blocks (`BlockScores.nll_steps`). Under faithful operation a window is
       flagged with probability about rollback_alpha (the real windows overlap, so the
       reference is not exchangeable sample by sample);
     - open loop (`open_loop`): every `horizon` steps once a block's `context + horizon` steps
       have been seen, the latest block is scored exactly as the check scores a block (observe
       the context, imagine the horizon under the applied actions: `Calibration.score`; blocks
       start every `horizon` steps, so they overlap by `context`). The open-loop divergences of
       the episode's blocks so far get the check's one-episode prediction test against the
       held-out real blocks (`stats.episode_outlier_p`, log scale, real episodes as the units).
       A weaker actuator barely moves a one-step prediction, but its error builds up over a
       horizon. The statistic pools the whole episode: it suits a gap present from the start
       (a wrong actuator); a change in the middle of a long episode is the one-step windows' job;
     - corrections (`corrections`): on the same blocks, the check's latency and actuator score
       test (checks/sysid.py): the gradient of the attribution objective with respect to a delay and
       every command's gain, offset and deadband at the identity, one backward pass per block. Per
       parameter, the episode's blocks so far get the same one-episode prediction test against the
       held-out real blocks' scores (two-sided: a gain can be too weak or too strong), Bonferroni
       over the parameters. The direction a score points is what a gain of 0.3 or a late actuator
       changes most, where the open-loop divergence only sees its size;
     `consecutive` flagged tests in a row of any statistic raise the rollback signal (the
     `on_rollback` callback, once per episode);
     - deployment (`deployment_episodes`): after every finished episode, the open-loop and
       corrections' statistics of the last few episodes' blocks, pooled with episodes as the units
       (runtime/deployment.py), for a gap one episode is too short to show. The looks' levels are
       spent so that the chance of any false flagged look in the guard's life is at most
       `deployment_alpha`; `consecutive` flagged looks in a row raise the deployment rollback
       (`Step.deployment_rollback`, the same callback, once per guard);
  4. (a) projects the chosen action into the envelope of the real logs: per-channel bounds (the
     training log's range unless given) and, when given or computed from the training log, a
     rate limit on the per-step change;
  5. records the step (`decisions`), and `write_log` saves the applied trajectory as a wmcheck log
     (source "policy": it can be checked and monitored) and the decisions beside it (JSON).
The open-loop and corrections' statistics of a block take 100-200 ms on a 2-core CPU (the
one-step filter about 1.5 ms). With `block_worker` they are computed in a second process
(runtime/block_worker.py) and `act` does not wait for them: a block's p-values are still
recorded on the step it ended at, but decided (and a rollback raised) at the first step after
its result arrives (`Step.decided_t`); the episode's end waits for the last ones. Call
`close()` (or `GuardedEnv.close()`) to stop the worker.
Only CPU torch; `scripts/bench_guard.py` measures the per-step overhead.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from wmcheck.checks.calibration import load_calibrated
from wmcheck.checks.scoring import support_distance
from wmcheck.checks.stats import conformal_p, episode_outlier_p
from wmcheck.datasets.atomic import write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.windows import Batch
from wmcheck.runtime.block_worker import BlockWorker, block_statistics
from wmcheck.runtime.deployment import DeploymentTest, bonferroni, look_level


@dataclass
class GuardConfig:
    """How the guard decides; the thresholds themselves come from the run's calibration."""

    # None: the calibration's (0.01). A per-step quantile: at 0.01, 32-44 % of faithful 200-step episodes
    # fall back at some step, at 0.001 6-14 % (docs/after-release.md)
    competence_alpha: float | None = None
    enter_steps: int = 2  # consecutive out-of-competence steps before the fallback takes over
    exit_steps: int = 10  # consecutive competent steps before the policy acts again
    rollback_window: int = 8  # steps per rollback window
    rollback_alpha: float = 0.01  # a window's conformal p at or below this is flagged
    consecutive: int = 2  # flagged windows in a row that raise the rollback signal
    warmup_controller: str = "policy"  # who acts in the first `context` steps, before the latent has converged
    samples: int = 8  # latent draws of the one-step predictive mixture: as calibration scored nll_steps
    open_loop: bool = True  # also test each block's open-loop divergence (one block scoring every `horizon` steps)
    corrections: bool = True  # also test each block's latency / actuator scores (checks/sysid.py score test)
    deployment_episodes: int = 4  # the deployment test pools the last this many finished episodes (0: off)
    deployment_alpha: float = 0.05  # the chance of any false deployment look in the guard's life (levels spent)
    block_worker: bool = False  # score blocks in a second process (runtime/block_worker.py): act() does not wait
    seed: int = 0


@dataclass
class Step:
    """One step's decision (the guard's log)."""

    t: int
    proposed: list[float]
    applied: list[float]
    controller: str  # "policy" | "fallback"
    support: float  # latent distance to the training latents (calibration units)
    competent: bool
    nll: float  # one-step predictive NLL of this step's observation (mean over channels)
    projected: bool  # the action was clipped into bounds / rate limits
    window_p: float | None = None  # the conformal p of a window ending here
    block_p: float | None = None  # the open-loop prediction test's p of a block ending here
    score_p: float | None = None  # the corrections' score test's p of a block ending here (Bonferroni)
    decided_t: int | None = None  # the step at which this block's tests were decided (later with the block worker)
    rollback: bool = False
    # set on an episode's last step: the deployment looks' p (runtime/deployment.py) and their rollback
    deployment_block_p: float | None = None
    deployment_score_p: float | None = None
    deployment_level: float | None = None  # the level this look's statistics were tested at (deployment.look_level)
    deployment_rollback: bool = False


@dataclass
class Envelope:
    """Action bounds (A,) low / high and an optional per-step rate limit (A,), physical units."""

    low: np.ndarray
    high: np.ndarray
    rate: np.ndarray | None = None

    def project(self, action: np.ndarray, previous: np.ndarray | None) -> tuple[np.ndarray, bool]:
        a = np.clip(action, self.low, self.high)
        if self.rate is not None and previous is not None:
            a = np.clip(a, previous - self.rate, previous + self.rate)
        return a, bool(np.any(np.abs(a - action) > 1e-9))


def real_windows(nll_steps: np.ndarray, width: int) -> np.ndarray:
    """Means of every `width` consecutive steps of every real block: nll_steps (m, S) -> (m * (S - width + 1),)."""
    x = np.asarray(nll_steps, float)
    if x.ndim != 2 or x.shape[1] < width:
        return np.zeros(0)
    c = np.cumsum(np.pad(x, ((0, 0), (1, 0))), axis=1)  # (m, S + 1)
    return ((c[:, width:] - c[:, :-width]) / width).reshape(-1)


def training_envelope(run_dir: str | Path) -> Envelope:
    """The envelope of the log a run was trained on: each command channel's range and its largest
    per-step change within an episode."""
    from wmcheck.checks.calibration import training_log
    from wmcheck.datasets.logformat import open_log

    with open_log(training_log(Path(run_dir))) as log:
        acts = [log.read(i, groups=False).actions for i in log.episode_ids]
    acts = [a for a in acts if len(a) > 1]
    if not acts:
        raise UserError(f"{run_dir}: the training log has no episode of two steps to measure rate limits on")
    allv = np.concatenate(acts)
    rate = np.max([np.abs(np.diff(a, axis=0)).max(0) for a in acts], 0)
    return Envelope(allv.min(0).astype(float), allv.max(0).astype(float), rate.astype(float))


class Guard:
    """See the module docstring. `fallback(obs) -> action` is the validated controller."""

    def __init__(
        self,
        run_dir: str | Path,
        fallback=None,
        config: GuardConfig | None = None,
        envelope: Envelope | None = None,
        on_rollback=None,
    ):
        self.run_dir = Path(run_dir)
        self.cfg = config or GuardConfig()
        self.bundle, self.cal = load_calibrated(self.run_dir, one_model_for="the runtime guard")
        self.model = self.bundle.model.eval()
        self.norm = Normalizer.from_dict(self.bundle.normalizer)
        if self.model.cfg.image_keys:
            raise UserError("the guard does not take camera models yet", "guard a model trained with --no-images")
        if self.norm.dim("input"):
            raise UserError(
                "this model conditions on exogenous inputs; the guard does not take them yet",
                "guard a model trained on commands only",
            )
        self.fallback = fallback
        self.on_rollback = on_rollback
        self.envelope = envelope or self._log_envelope()
        a = self.cfg.competence_alpha if self.cfg.competence_alpha is not None else self.cal.config.competence_alpha
        self.support_bound = self.cal.support_bound(a)
        dis = self.cal.real.disagreement
        self.disagreement_bound = float(np.quantile(dis, 1 - a)) if dis.max() > 0 else None
        self.context, self.window = self.cal.config.context, self.cal.config.horizon
        self.real_nll = real_windows(self.cal.real.nll_steps, self.cfg.rollback_window)
        if not len(self.real_nll):
            raise UserError(
                f"{self.run_dir}: the calibration has no per-step NLL of real blocks (or blocks shorter than "
                f"{self.cfg.rollback_window} steps)",
                f"re-run `wmcheck calibrate {self.run_dir}` (or a smaller rollback_window)",
            )
        self.support_ref = self.cal.support_ref
        # the open-loop test's reference: the held-out real blocks' divergence, by real episode
        groups = (
            self.cal.real_episode if self.cal.real_episode is not None else np.arange(len(self.cal.real.divergence))
        )
        self.real_div = (self.cal.real.divergence, groups)
        self.open_loop = self.cfg.open_loop and len(np.unique(groups)) >= 2
        ref = self.cal.sysid  # the corrections' scores of the same held-out blocks (None: a grid calibration)
        self.corrections = self.cfg.corrections and ref is not None and ref.scores.shape[1] > 0
        self.real_scores = (ref.scores, groups) if self.corrections else None
        self.deployment = None
        if self.cfg.deployment_episodes and (self.open_loop or self.corrections):
            self.deployment = DeploymentTest(
                self.cfg.deployment_episodes,
                self.cal.real.divergence if self.open_loop else None,
                ref.scores if self.corrections else None,
                groups,
            )
        self.deployment_runs = [0, 0]  # flagged looks in a row: open loop, corrections
        self.deployment_rolled_back = False
        self.first_deployment_rollback: int | None = None  # the finished episode whose look raised it
        self.episodes_done = 0
        self._ended = True  # no episode open
        self.worker = None
        if self.cfg.block_worker and (self.open_loop or self.corrections):
            self.worker = BlockWorker(self.run_dir, self.cfg.seed, self.open_loop, self.corrections)
        self.decisions: list[Step] = []
        self._episodes: list[dict] = []
        torch.manual_seed(self.cfg.seed)

    def _log_envelope(self) -> Envelope:
        rng = self.norm.range["action"]
        if rng is None:
            raise UserError(f"{self.run_dir}: the model does not record its training commands' range", "pass envelope=")
        return Envelope(np.asarray(rng[0], float), np.asarray(rng[1], float))

    # ------------------------------------------------------------------ episode
    def reset(self, obs) -> None:
        """Start an episode at observation `obs` (physical units)."""
        self._end_episode()
        self._close_episode()
        self._ended = False
        self._episode_start = len(self.decisions)  # decisions[_episode_start + t] is step t
        self.state = None
        self.t = 0
        self.prev_applied = None
        self.mode = "policy"
        self.out_run = self.in_run = 0
        self.nll_window: deque = deque(maxlen=self.cfg.rollback_window)
        self.dis_window: deque = deque(maxlen=self.window)
        self.flagged_run = self.block_run = self.score_run = 0
        self.episode_div: list[float] = []
        self.episode_scores: list[np.ndarray] = []  # (p,) per block
        self.rolled_back = False
        self._obs = [np.asarray(obs, np.float32)]
        self._acts: list[np.ndarray] = []
        self._filter(np.asarray(obs, np.float32), first=True)

    @torch.inference_mode()
    def _filter(self, obs: np.ndarray, first: bool) -> None:
        """Update the latent state with `obs` (given the last applied action); keep its scores."""
        A = self.norm.dim("action")
        prev = np.zeros(A, np.float32) if first else self.norm.norm_action(self.prev_applied).astype(np.float32)
        batch = Batch(
            self.norm.norm_obs(obs).astype(np.float32)[None, None],
            prev[None, None],
            np.zeros((1, 1, 0), np.float32),
            np.zeros((1, 1), np.float32),
            np.array([[first]]),
            np.array([[False]]),
            np.array([[False]]),
        ).to_torch()
        s = self.model.scores(batch, self.state, samples=self.cfg.samples)
        self.state = s["last"]
        self.last_nll = float(s["nll"][0, 0].mean())
        self.last_dis = float(s["disagreement"][0, 0].mean())
        deter = s["feat"][0, :, : self.model.cfg.deter].numpy()  # (1, deter)
        self.last_support = float(support_distance(deter, self.support_ref, self.cal.support_scale)[0])

    def act(self, obs, proposed) -> np.ndarray:
        """The action to apply at observation `obs` (physical units), given the policy's `proposed`."""
        obs = np.asarray(obs, np.float32)
        proposed = np.asarray(proposed, np.float64).reshape(-1)
        if self.t > 0:
            self._filter(obs, first=False)
            self._obs.append(obs)
        warm = self.t >= self.context
        competent = self._competent() if warm else True
        if self.t == self.context:
            self.mode = "policy"  # a fallback that acted in the warm-up hands over at once
        if warm:
            self._switch(competent)
        else:
            self.mode = "fallback" if self.cfg.warmup_controller == "fallback" else "policy"
        chosen = proposed
        if self.mode == "fallback" and self.fallback is not None:
            chosen = np.asarray(self.fallback(obs), np.float64).reshape(-1)
        applied, projected = self.envelope.project(chosen, self.prev_applied)
        step = Step(
            self.t,
            proposed.tolist(),
            applied.tolist(),
            self.mode if self.fallback is not None else "policy",
            self.last_support,
            competent,
            self.last_nll,
            projected,
        )
        self._collect(step, wait=False)
        self._rollback_check(step)
        self.decisions.append(step)
        self.prev_applied = applied
        self._acts.append(applied.astype(np.float32))
        self.t += 1
        return applied.astype(np.float32)

    def _competent(self) -> bool:
        ok = self.last_support <= self.support_bound
        if self.disagreement_bound is not None:
            self.dis_window.append(self.last_dis)
            if len(self.dis_window) == self.window:
                ok &= float(np.mean(self.dis_window)) <= self.disagreement_bound
        return bool(ok)

    def _switch(self, competent: bool) -> None:
        """Hysteresis between the policy and the fallback."""
        if competent:
            self.in_run, self.out_run = self.in_run + 1, 0
            if self.mode == "fallback" and self.in_run >= self.cfg.exit_steps:
                self.mode = "policy"
        else:
            self.out_run, self.in_run = self.out_run + 1, 0
            if self.mode == "policy" and self.out_run >= self.cfg.enter_steps:
                self.mode = "fallback"

    def _rollback_check(self, step: Step) -> None:
        """The one-step window's test that ends at this step, and the block statistics of a block
        that ends here (computed now, or handed to the block worker); `consecutive` flagged tests
        in a row of any statistic roll back."""
        if self.t < self.context:
            return
        self.nll_window.append(self.last_nll)
        if (self.t - self.context + 1) % self.cfg.rollback_window == 0:
            step.window_p = float(conformal_p(np.mean(self.nll_window), self.real_nll)[0])
            self.flagged_run = self.flagged_run + 1 if step.window_p <= self.cfg.rollback_alpha else 0
        length = self.context + self.window
        block_ends = self.t + 1 >= length and (self.t + 1 - length) % self.window == 0
        if block_ends and (self.open_loop or self.corrections):
            obs, acts = (
                np.array(self._obs[-length:]),
                np.array(self._acts[-(length - 1) :]),
            )  # this step's action is not applied yet
            if self.worker is not None:
                self.worker.submit(self.t, obs, acts)
            else:
                stats = block_statistics(
                    self.model, self.cal, self.norm, obs, acts, self.open_loop, self.corrections, self.cfg.seed
                )
                self._apply_block(step, self.t, *stats)
        self._roll_back_if_flagged(step)

    def _apply_block(self, step: Step, now: int, div: float | None, grad: np.ndarray | None) -> None:
        """Test the episode's blocks so far, with the block that ended at `step` added; the
        p-values go on that step, decided at step `now` (the same step in-process)."""
        step.decided_t = now
        if div is not None:
            self.episode_div.append(div)
            step.block_p = episode_outlier_p(np.array(self.episode_div), *self.real_div, log=True)
            self.block_run = self.block_run + 1 if step.block_p <= self.cfg.rollback_alpha else 0
        if grad is not None:
            self.episode_scores.append(grad)
            step.score_p = self._score_p()
            self.score_run = self.score_run + 1 if step.score_p <= self.cfg.rollback_alpha else 0

    def _roll_back_if_flagged(self, step: Step) -> None:
        if max(self.flagged_run, self.block_run, self.score_run) >= self.cfg.consecutive and not self.rolled_back:
            self.rolled_back = step.rollback = True
            if self.on_rollback is not None:
                self.on_rollback(step)

    def _collect(self, step: Step, wait: bool) -> None:
        """Apply the block worker's results that have arrived (all of them with `wait`) to `step`."""
        if self.worker is None:
            return
        for block_t, stats in self.worker.drain() if wait else self.worker.poll():
            self._apply_block(self.decisions[self._episode_start + block_t], step.t, *stats)

    def _score_p(self) -> float:
        """The corrections' score test of the episode's blocks so far: per parameter a two-sided
        one-episode prediction test against the real blocks' scores, Bonferroni over parameters."""
        x = np.array(self.episode_scores)  # (blocks so far, p)
        real, groups = self.real_scores
        ps = []
        for j in range(x.shape[1]):
            upper = episode_outlier_p(x[:, j], real[:, j], groups, log=False)
            ps.append(2 * min(upper, 1 - upper))
        return bonferroni(ps)

    def close(self) -> None:
        """Stop the block worker (GuardConfig.block_worker); the guard can no longer score blocks."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def finish(self, obs) -> None:
        """The episode's final observation (after its last action), for the log; `GuardedEnv` calls
        it when the env terminates or truncates."""
        if len(self._obs) == len(self._acts):
            self._obs.append(np.asarray(obs, np.float32))
        self._end_episode()

    def _end_episode(self) -> None:
        """Once per episode: hand its blocks to the deployment test and record its look on the
        episode's last step (`consecutive` flagged looks in a row raise the deployment rollback)."""
        if self._ended:
            return
        self._ended = True
        self.episodes_done += 1
        if len(self.decisions) <= self._episode_start:  # no step in this episode: nothing to look at
            return
        step = self.decisions[-1]
        self._collect(step, wait=True)  # the episode's last blocks, before its deployment look
        self._roll_back_if_flagged(step)
        if self.deployment is None:
            return
        looks = self.deployment.add(self.episode_div, self.episode_scores)
        step.deployment_block_p, step.deployment_score_p = looks
        if looks == (None, None):
            return
        level = look_level(self.cfg.deployment_alpha, self.deployment.looks, self.deployment.statistics)
        step.deployment_level = level
        for i, p in enumerate(looks):
            if p is not None:
                self.deployment_runs[i] = self.deployment_runs[i] + 1 if p <= level else 0
        if max(self.deployment_runs) >= self.cfg.consecutive and not self.deployment_rolled_back:
            self.deployment_rolled_back = step.deployment_rollback = True
            self.first_deployment_rollback = self.episodes_done
            if self.on_rollback is not None:
                self.on_rollback(step)

    # ------------------------------------------------------------------ log
    def _close_episode(self) -> None:
        """Keep the episode for `write_log`: N actions and N + 1 observations (without a final
        observation, the last action is dropped)."""
        acts = getattr(self, "_acts", [])
        n = min(len(acts), len(self._obs) - 1) if acts else 0
        if n > 0:
            self._episodes.append({"obs": np.array(self._obs[: n + 1]), "acts": np.array(acts[:n])})
            self._obs = self._obs[n:]  # an episode that goes on after write_log starts from its latest row
        self._acts = []

    def write_log(self, path: str | Path) -> tuple[Path, Path]:
        """The applied trajectories as a wmcheck log (source "policy") and the decisions as JSON beside it."""
        from wmcheck.datasets.episode import Episode, LogMeta
        from wmcheck.datasets.logformat import write_log

        self._close_episode()
        path = Path(path)
        ch = self.bundle.channels
        eps = [
            Episode(e["obs"].astype(np.float32), e["acts"].astype(np.float32), id=i)
            for i, e in enumerate(self._episodes)
        ]
        meta = LogMeta(
            source="policy",
            dt=ch.get("dt"),
            observation_names=list(ch.get("observation_names", [])),
            action_names=list(ch.get("action_names", [])),
            units=dict(ch.get("units", {})),
        )
        write_log(path, eps, meta)
        side = path.with_suffix(".decisions.json")
        write_text_atomic(side, json.dumps([vars(s) for s in self.decisions]))
        return path, side

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        d = self.decisions
        return {
            "steps": len(d),
            "fallback_steps": sum(s.controller == "fallback" for s in d),
            "projected_steps": sum(s.projected for s in d),
            "rollbacks": sum(s.rollback for s in d),
            "first_fallback": next((s.t for s in d if s.controller == "fallback"), None),
            "first_rollback": next((s.t for s in d if s.rollback), None),
            "episodes": self.episodes_done,
            "deployment_rollback_episode": self.first_deployment_rollback,
        }


class GuardedEnv(gym.Wrapper):
    """A gymnasium env whose actions pass through a `Guard`: `step(proposed)` applies
    `guard.act(last_obs, proposed)`; `info["guard"]` says what the guard did."""

    def __init__(self, env, guard: Guard):
        super().__init__(env)
        self.guard = guard
        self._obs = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.guard.reset(obs)
        self._obs = obs
        return obs, info

    def close(self):
        self.guard.close()
        return super().close()

    def step(self, action):
        applied = self.guard.act(self._obs, action)
        obs, reward, term, trunc, info = self.env.step(applied)
        self._obs = obs
        if term or trunc:
            self.guard.finish(obs)
        step = self.guard.decisions[-1]
        return (
            obs,
            reward,
            term,
            trunc,
            {**info, "guard": {"applied": applied, "controller": step.controller, "rollback": step.rollback}},
        )
