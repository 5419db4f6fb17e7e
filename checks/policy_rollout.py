"""A policy run closed loop inside the world model, from the simulator episodes' initial conditions.

Owns `closed_loop`: for each recorded simulator episode, the model observes the episode's first
`context` steps (the simulator's observations and the policy's own commands); from then on the
policy acts on the model: decode the predicted observation (the decoder's mean, de-normalised with
the run's Normalizer), call the policy on it, encode its action as the recorder stores it,
normalise, imagine one step. The reward head gives the model's reward of every imagined step; the
continue head ends an imagined episode where the model predicts termination. `samples` rollouts per
episode draw different latents, so their spread is the model's own uncertainty about what reality
would do under this policy. Uses only the world model's public surface (observe, imagine, decode)
and its reward / continue heads.

Row convention as in the log: an episode of N steps has N + 1 observation rows; reward r_t is the
reward of step t (from o_t under a_t to o_{t+1}). The first imagined row is `context`, reached from
the last observed state under the logged command a_{context-1} (the policy's own action on o_{context-1},
which the model saw); rewards r_t for t < context - 1 are the simulator's in both returns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from wmcheck.datasets.episode import Episode
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.progress import progress
from wmcheck.datasets.record import SpaceCodec
from wmcheck.datasets.windows import Batch, episode_steps
from wmcheck.worldmodel.rssm import State


@dataclass
class ClosedLoopConfig:
    samples: int = 8
    """Model rollouts per simulator episode (different latent draws)."""
    chunk: int = 256
    """Rollouts imagined in parallel (one policy call per rollout and step either way)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"samples must be >= 2 (the model's spread needs two rollouts), got {self.samples}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


@dataclass
class ClosedLoop:
    """The model's closed-loop rollouts, S per simulator episode, padded to the longest episode."""

    episode_ids: list[int]
    context: int  # first imagined observation row
    obs: np.ndarray  # (n, S, T, D) raw; rows < context are the simulator's, rows > N_i are NaN
    actions: np.ndarray  # (n, S, T - 1, A) raw stored action rows (NaN past the episode's end)
    rewards: np.ndarray  # (n, S, T - 1) the simulator's before context - 1, the model's after; 0 where not alive
    alive: np.ndarray  # (n, S, T - 1) bool: step t inside the episode and before a predicted termination
    lengths: np.ndarray  # (n,) steps N_i of each simulator episode

    def returns(self) -> np.ndarray:
        """(n, S) undiscounted episode returns of the model's rollouts."""
        return np.where(self.alive, self.rewards, 0.0).sum(-1)


def closed_loop(
    model,
    norm: Normalizer,
    episodes: list[Episode],
    policy,
    codec: SpaceCodec,
    env,
    context: int,
    cfg: ClosedLoopConfig | None = None,
) -> ClosedLoop:
    """Roll `policy` out inside `model` from each episode's first `context` steps (module docstring).

    `policy`, `codec` and `env` are the ones that recorded the episodes (`datasets.record`): the
    policy maps a raw observation to an action, the codec turns it into the stored row. A policy
    with a `reset(seed)` method is stateful: each rollout gets its own copy, reset with the
    episode's seed.
    """
    cfg = cfg or ClosedLoopConfig()
    short = [e.id for e in episodes if e.num_steps < context]
    if short:
        raise UserError(
            f"episodes {short[:5]} have fewer than {context} steps: the model cannot observe their context",
            f"record episodes of at least {context + 1} steps",
        )
    n, S = len(episodes), cfg.samples
    D, A, E = norm.dims
    T = max(e.num_steps for e in episodes) + 1
    obs = np.full((n, S, T, D), np.nan, np.float32)
    actions = np.full((n, S, T - 1, A), np.nan, np.float32)
    rewards = np.zeros((n, S, T - 1), np.float32)
    alive = np.zeros((n, S, T - 1), bool)
    rows = [(i, s) for i in range(n) for s in range(S)]
    torch.manual_seed(cfg.seed)
    model.eval()
    starts = range(0, len(rows), cfg.chunk)
    for c0 in progress(starts, len(starts), f"policy in the model ({n} episodes x {S} rollouts)"):
        chunk = rows[c0 : c0 + cfg.chunk]
        out = _rollout_chunk(model, norm, [episodes[i] for i, _ in chunk], policy, codec, env, context)
        Tc = out[0].shape[1]  # this chunk's longest episode (+1): the rest stays padding
        for j, (i, s) in enumerate(chunk):
            obs[i, s, :Tc], actions[i, s, : Tc - 1], rewards[i, s, : Tc - 1], alive[i, s, : Tc - 1] = (
                x[j] for x in out
            )
    return ClosedLoop(
        [int(e.id) for e in episodes], context, obs, actions, rewards, alive, np.array([e.num_steps for e in episodes])
    )


@torch.no_grad()
def _rollout_chunk(model, norm: Normalizer, eps: list[Episode], policy, codec: SpaceCodec, env, C: int):
    """B rollouts (one per entry of `eps`, episodes may repeat): raw obs (B, T, D), actions (B, T-1, A),
    rewards (B, T-1), alive (B, T-1)."""
    B = len(eps)
    D, A, E = norm.dims
    T = max(e.num_steps for e in eps) + 1
    steps = [episode_steps(e, norm) for e in eps]
    ctx = Batch(
        *(
            np.stack([getattr(s, f)[:C] for s in steps])
            for f in ("obs", "prev_action", "prev_input", "reward", "is_first", "is_last", "is_terminal")
        )
    ).to_torch()  # (B, C, ...)
    _, state = model.observe(ctx)  # carry at row C - 1
    obs = np.full((B, T, D), np.nan, np.float32)
    actions = np.full((B, T - 1, A), np.nan, np.float32)
    rewards = np.zeros((B, T - 1), np.float32)
    alive = np.zeros((B, T - 1), bool)
    for b, e in enumerate(eps):
        obs[b, :C] = e.observations[:C]
        actions[b, : C - 1] = e.actions[: C - 1]
        rewards[b, : C - 1] = e.reward_array()[: C - 1]
        alive[b, : C - 1] = True
    lengths = np.array([e.num_steps for e in eps])
    policies = _per_rollout(policy, eps)
    # the command at row C - 1 is the policy's own action on the observed o_{C-1}: the logged one
    act_norm = np.stack([s.prev_action[C] for s in steps])  # (B, A)
    actions[:, C - 1] = np.stack([e.actions[C - 1] for e in eps])
    ended = np.zeros(B, bool)  # the model predicted termination
    cont_target = 1.0 - 1.0 / model.cfg.cont_horizon
    obs_shape = env.observation_space.shape
    for t in range(C - 1, T - 1):  # step t: row t -> row t + 1 under a_t
        inp = np.stack([s.prev_input[t + 1] if t + 1 < len(s) else np.zeros(E, np.float32) for s in steps])  # (B, E)
        imagined = model.imagine(
            state, torch.as_tensor(act_norm[:, None]), torch.as_tensor(inp[:, None])
        )  # (B, 1, ...)
        state = State(imagined.deter[:, 0], imagined.stoch[:, 0])  # (B, ...)
        mean, _ = model.decode(imagined)  # (B, 1, D) symlog of normalised obs
        nxt = norm.denorm_obs(model.to_obs(mean)[:, 0].float().numpy())  # (B, D) raw
        feat = imagined.feat()
        r = model.twohot.mean(model.reward(feat))[:, 0].float().numpy()  # (B,)
        cont = torch.sigmoid(model.cont(feat))[:, 0].float().numpy()  # (B,)
        inside = t < lengths  # (B,) step t exists in the simulator episode
        live = inside & ~ended
        alive[:, t] = live
        rewards[:, t] = np.where(live, r, 0.0)
        obs[inside, t + 1] = nxt[inside]
        ended |= live & (cont < 0.5 * cont_target)
        if t + 1 >= T - 1:
            break
        for b in np.flatnonzero(t + 1 < lengths):
            raw = nxt[b].reshape(obs_shape) if int(np.prod(obs_shape)) == D else nxt[b]
            try:
                a = policies[b](raw)
            except Exception as exc:  # a user's policy: name the state it failed on
                raise UserError(
                    f"the policy failed on a model-predicted observation {np.round(nxt[b], 4).tolist()} "
                    f"(episode {eps[b].id}, step {t + 1}): {type(exc).__name__}: {exc}",
                    "make the policy accept any observation of the space's shape",
                ) from None
            actions[b, t + 1] = codec.action(a, env)[1]
        act_norm = norm.norm_action(np.nan_to_num(actions[:, t + 1])).astype(np.float32)  # (B, A)
    return obs, actions, rewards, alive


def _per_rollout(policy, eps: list[Episode]) -> list:
    """One policy per rollout: the same callable, or for stateful policies (with `reset`) a copy
    reset with the episode's seed, as the recorder resets it."""
    if not hasattr(policy, "reset"):
        return [policy] * len(eps)
    out = []
    for e in eps:
        p = copy.deepcopy(policy)
        p.reset(e.seed if e.seed is not None else int(e.id))
        out.append(p)
    return out
