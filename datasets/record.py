"""Recording gymnasium environments into episodes: simulator rollouts under a chosen policy.

Owns: making the environment (a registered id such as "Pendulum-v1", "module:Class", or a
gymnasium `Env` instance from Python, which stays the caller's: we never close it), making the
policy from a spec, stepping episodes and turning them into `Episode`s in the log's row convention
(N+1 observations, N actions/rewards/flags), and the file metadata (`dt`, channel names).

Policies (`make_policy`):
- "random": uniform samples from the action space;
- "hold:K": a random action held for K steps, then a new one: a piecewise-constant, multi-level
  input, the classic exciting signal for system identification (it shows step responses and
  settling, which white-noise actions at every step hide);
- "module:callable": `callable(observation) -> action`, imported from an importable module;
- "module:model": an object with `.predict(observation, deterministic=True) -> (action, state)`,
  a Stable-Baselines3 model or anything shaped like one; "module:model.predict" works too (the
  state half of the returned pair is dropped, as it is for any callable returning `(array, None)`);
- "path.zip": a Stable-Baselines3 model file, loaded by SB3 itself (`<Algorithm>.load`, trying
  PPO, A2C, SAC, TD3, DDPG and DQN in turn: prediction uses only the stored policy network, so the
  first algorithm that loads the file predicts as the one that saved it). SB3's loader unpickles
  the class references it stored, so load only zips you trust;
- "path.pt": a TorchScript module (`torch.jit.load`) called with the (D,) float32 observation
  tensor, or with a (1, D) batch when the module refuses the unbatched one (as modules traced
  with a batch dimension do, e.g. by SB3's export recipe); the output's batch dimension is
  dropped and a tuple output gives its first element (for Discrete actions: one value per
  class, the largest wins).
Box observations and actions are flattened to float32; Discrete actions are stored one-hot (K
columns). Other spaces are refused with an error naming them.

Success (`make_success`): a "module:callable" or callable `success(episode, final_info) -> bool`
called on each recorded `Episode` and the last step's `info`; without one, the last `info`'s
`is_success` (gymnasium's convention) or `success` key; otherwise unknown (None). The log format has
no per-episode success field, so the recorder keeps it alongside, in memory: `Recorder.outcomes`
maps episode id -> `Outcome`.

Camera frames (`render=(W, H)`): the env is made with render_mode="rgb_array" (and width/height where
it takes them, as MuJoCo envs do), `env.render()` is called after the reset and after every step, and
each frame is resized to H x W (area averaging) and stored as uint8 in the observation group
"image" (N+1, H, W, C). MUJOCO_GL defaults to "egl" (headless rendering) when it is unset. The
camera is set up by one render after a seed-0 reset, before the first episode (see `Recorder`).

Episode i is reset with seed `seed + i` (stored as the episode's seed); random policies are seeded
the same way, so one episode can be reproduced on its own. `dt` comes from `env.unwrapped.dt`, else
1 / metadata["render_fps"], else 1.0 with a warning.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError, first_line
from wmcheck.datasets.progress import progress

PolicyFn = Callable[[np.ndarray], Any]
SuccessFn = Callable[[Episode, dict], Any]
SUCCESS_INFO_KEYS = ("is_success", "success")


@dataclass
class Outcome:
    """Whether one recorded episode succeeded, and who said so."""

    success: bool | None  # None: unknown (no callable, no success key in the env's info)
    source: str | None  # "callable" | "info:is_success" | "info:success" | None


def is_env(obj) -> bool:
    """True for a gymnasium `Env` instance (or anything with reset/step and both spaces)."""
    return all(hasattr(obj, a) for a in ("reset", "step", "observation_space", "action_space"))


def env_name(env) -> str:
    """What reports call an env: the id string itself, else an instance's registered id, else its class."""
    if isinstance(env, str):
        return env
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(getattr(env, "unwrapped", env)).__name__


@contextlib.contextmanager
def opened_env(env: str | Any, env_kwargs: dict | None = None, render: tuple[int, int] | None = None):
    """The env to step: made from an id (rendering frames of size `render` when given) and closed
    afterwards, or the caller's instance, checked and left open."""
    if is_env(env):
        if env_kwargs:
            raise UserError("env_kwargs apply to an env id, not to an Env instance", "make the instance with them")
        if render and getattr(env, "render_mode", None) != "rgb_array":
            raise UserError(
                f"{env_name(env)} was made with render_mode {getattr(env, 'render_mode', None)!r}",
                'make the env with render_mode="rgb_array" to record its frames',
            )
        yield env
        return
    made = make_env(env, env_kwargs) if render is None else make_render_env(env, env_kwargs, render)
    try:
        yield made
    finally:
        made.close()


def make_env(env_id: str, env_kwargs: dict | None = None):
    """A gymnasium env from a registered id or "module:Class"; UserError if it cannot be made."""
    import gymnasium as gym

    if not isinstance(env_id, str):
        raise UserError(f"{env_id!r} is not an environment id", 'give a gymnasium id such as "Pendulum-v1"')
    kwargs = dict(env_kwargs or {})
    if ":" in env_id and env_id.split(":", 1)[0] and env_id not in gym.registry:
        mod_name, _, cls_name = env_id.partition(":")
        cls = _import_attr(mod_name, cls_name, "environment", env_id)
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise UserError(f"cannot create {env_id} with {kwargs}: {exc}", "check --env-kwargs") from None
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise UserError(
            f"{env_id} needs a package that is not installed: {exc}",
            "for MuJoCo environments: pip install 'wmcheck[mujoco]'",
        ) from None
    except gym.error.Error as exc:  # NameNotFound, VersionNotFound, DeprecatedEnv, ...
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(
            f"cannot make environment {env_id!r}: {exc}", f"give a registered gymnasium id{hint} or module:Class"
        ) from None
    except TypeError as exc:
        raise UserError(f"cannot create {env_id} with {kwargs}: {exc}", "check --env-kwargs") from None


def env_dt(env) -> tuple[float, str | None]:
    """(step period in seconds, warning or None)."""
    dt = getattr(env.unwrapped, "dt", None)
    if _positive(dt):
        return float(dt), None
    fps = (getattr(env, "metadata", None) or {}).get("render_fps")
    if _positive(fps):
        return 1.0 / float(fps), None
    return 1.0, (
        f"{env.spec.id if env.spec else type(env.unwrapped).__name__} has no dt and no render_fps: "
        "dt recorded as 1.0 s; time in reports will be in steps"
    )


def _positive(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x)) and float(x) > 0
    except (TypeError, ValueError):
        return False


@dataclass
class SpaceCodec:
    """Flattens observations, encodes actions as stored float32 rows."""

    obs_dim: int
    action_dim: int
    discrete: int | None  # number of classes of a Discrete action space, else None

    @classmethod
    def for_env(cls, env) -> SpaceCodec:
        from gymnasium import spaces

        o, a = env.observation_space, env.action_space
        if not isinstance(o, spaces.Box):
            raise UserError(
                f"observation space {o} is not supported",
                "record environments with Box observations "
                "(wrap Dict observations with gymnasium.wrappers.FlattenObservation)",
            )
        if isinstance(a, spaces.Box):
            return cls(int(np.prod(o.shape)), int(np.prod(a.shape)), None)
        if isinstance(a, spaces.Discrete):
            return cls(int(np.prod(o.shape)), int(a.n), int(a.n))
        raise UserError(f"action space {a} is not supported", "record environments with Box or Discrete actions")

    def obs(self, x) -> np.ndarray:
        return np.asarray(x, np.float32).reshape(-1)  # (D,)

    def action(self, a, env) -> tuple[Any, np.ndarray]:
        """(the action to pass to env.step, its stored float32 row)."""
        if self.discrete is not None:
            start = int(env.action_space.start)
            x = np.asarray(a)
            idx = int(x.reshape(-1)[0]) - start if x.size == 1 else int(np.argmax(x))  # scores: best class
            if not 0 <= idx < self.discrete:
                raise UserError(
                    f"the policy returned action {a!r}, outside {env.action_space}",
                    "return an integer class index (or one score per class)",
                )
            row = np.zeros(self.discrete, np.float32)
            row[idx] = 1.0
            return start + idx, row
        row = np.asarray(a, np.float32).reshape(-1)
        if row.size != self.action_dim:
            raise UserError(
                f"the policy returned an action of {row.size} values, the action space has "
                f"{self.action_dim} {env.action_space.shape}",
                "return one value per action dimension",
            )
        return row.reshape(env.action_space.shape), row


class _Random:
    """Uniform samples from the action space; with hold > 1, each sample is kept for `hold` steps."""

    def __init__(self, space, hold: int = 1):
        self.space, self.hold, self.t, self.current = space, hold, 0, None

    def reset(self, seed: int) -> None:
        self.space.seed(seed)
        self.t = 0

    def __call__(self, obs):
        if self.t % self.hold == 0:
            self.current = self.space.sample()
        self.t += 1
        return self.current


class _TorchScript:
    """A TorchScript policy; whether it takes an unbatched (D,) or a batched (1, D) observation is
    found at the first call and kept."""

    def __init__(self, path: Path):
        import torch

        try:
            self.module = torch.jit.load(str(path), map_location="cpu").eval()
        except (RuntimeError, ValueError) as exc:
            raise UserError(
                f"{path} is not a TorchScript module: {exc}", "save the policy with torch.jit.script(policy).save(path)"
            ) from None
        self.torch, self.path, self.batched = torch, path, None  # None: not called yet

    def __call__(self, obs):
        x = self.torch.as_tensor(np.asarray(obs, np.float32).reshape(-1))  # (D,)
        with self.torch.no_grad():
            if self.batched is None:
                self.batched = self._needs_batch(x)
            out = self.module(x[None] if self.batched else x)  # (1, A) | (A,)
        out = out[0] if isinstance(out, (tuple, list)) else out  # (actions, values, log_prob) exports
        out = out.detach().cpu().numpy()
        return out[0] if self.batched and out.ndim > 1 else out

    def _needs_batch(self, x) -> bool:
        try:
            self.module(x)
            return False
        except (RuntimeError, IndexError, ValueError) as unbatched:  # TorchScript raises RuntimeError subclasses
            try:
                self.module(x[None])
            except (RuntimeError, IndexError, ValueError):
                raise UserError(
                    f"the TorchScript policy {self.path} fails on a ({x.numel()},) observation and on a "
                    f"(1, {x.numel()}) batch: {first_line(unbatched)}",
                    "export a module taking the flattened float32 observation, with or without a batch dimension",
                ) from None
            return True


_SB3_ALGORITHMS = ("PPO", "A2C", "SAC", "TD3", "DDPG", "DQN")


def _load_sb3(path: Path):
    """A Stable-Baselines3 model from its .zip, loaded by SB3 (module docstring)."""
    try:
        import stable_baselines3 as sb3
    except ImportError:
        raise UserError(
            f"{path} looks like a Stable-Baselines3 model, but stable-baselines3 is not installed",
            "pip install stable-baselines3, or export the policy with torch.jit and pass the .pt file",
        ) from None
    failures = []
    for name in _SB3_ALGORITHMS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SB3 warns about schedules it cannot restore; predict needs none
                return getattr(sb3, name).load(str(path), device="cpu")
        except Exception as exc:  # a file of another algorithm, or no SB3 file at all
            failures.append(f"{name}: {first_line(exc)}")
    raise UserError(
        f"{path} could not be loaded by Stable-Baselines3 ({'; '.join(failures[:2])}; ...)",
        "give a model saved with model.save(path) by one of "
        + ", ".join(_SB3_ALGORITHMS)
        + ", or import it yourself and pass module:model",
    )


class _Predicting:
    """An object with `.predict(obs, deterministic=True) -> (action, state)` (an SB3 model) as a policy."""

    def __init__(self, predict: Callable):
        self.predict = predict
        self.kwargs = {"deterministic": True} if _takes_keyword(predict, "deterministic") else {}

    def __call__(self, obs):
        return _action_of(self.predict(obs, **self.kwargs))


def _takes_keyword(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it plainly
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


class _Returning:
    """A plain callable policy whose `(action, state)` pairs are reduced to the action."""

    def __init__(self, fn: Callable):
        self.fn = fn
        if hasattr(fn, "reset"):
            self.reset = fn.reset

    def __call__(self, obs):
        return _action_of(self.fn(obs))


def _action_of(out):
    """The action of a policy's output: `(array, None)` / `(array, state tuple)` (SB3's predict) give
    the array; anything else is the action itself."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], np.ndarray):
        if out[1] is None or isinstance(out[1], tuple):
            return out[0]
    return out


def _as_policy(obj, spec: str) -> PolicyFn:
    """A user object as a policy: a predictor (has `.predict`, not callable), a `predict` method, or
    a callable."""
    if not callable(obj) and callable(getattr(obj, "predict", None)):
        return _Predicting(obj.predict)
    if callable(obj) and getattr(obj, "__name__", None) == "predict" and hasattr(obj, "__self__"):
        return _Predicting(obj)
    if callable(obj):
        return _Returning(obj)
    raise UserError(
        f"{spec} is neither callable nor has a .predict method",
        "point at a function taking an observation and returning an action, or at a model with .predict",
    )


def make_policy(spec: str | PolicyFn, env) -> PolicyFn:
    """A policy from its spec (see the module docstring). Python objects (callables, SB3 models) are
    wrapped so that their `(action, state)` outputs become actions."""
    if not isinstance(spec, str):
        return _as_policy(spec, repr(spec))
    if spec == "random":
        return _Random(env.action_space)
    if spec.startswith("hold:"):
        try:
            k = int(spec[5:])
        except ValueError:
            k = 0
        if k < 1:
            raise UserError(f"--policy {spec}: K must be a whole number >= 1", "e.g. --policy hold:10")
        return _Random(env.action_space, hold=k)
    if spec.endswith(".zip"):
        if not Path(spec).is_file():
            raise UserError(f"policy file {spec} does not exist", "check the path")
        return _Predicting(_load_sb3(Path(spec)).predict)
    if spec.endswith((".pt", ".pth", ".ts")) or Path(spec).is_file():
        if not Path(spec).is_file():
            raise UserError(f"policy file {spec} does not exist", "check the path")
        return _TorchScript(Path(spec))
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        return _as_policy(_import_attr(mod_name, attr, "policy", spec), spec)
    raise UserError(
        f"unknown policy {spec!r}",
        "use random, hold:K, module:callable, module:model (an SB3 model), an SB3 .zip or a TorchScript .pt file",
    )


def make_success(spec: str | SuccessFn | None) -> SuccessFn | None:
    """A success rule from "module:callable" (or a callable); None means "read the env's info"."""
    if spec is None or callable(spec):
        return spec
    if ":" not in spec:
        raise UserError(
            f"unknown success rule {spec!r}", "give module:callable, a function (episode, final_info) -> bool"
        )
    mod_name, _, attr = spec.partition(":")
    fn = _import_attr(mod_name, attr, "success", spec)
    if not callable(fn):
        raise UserError(f"{spec} is not callable", "point at a function (episode, final_info) -> bool")
    return fn


def episode_outcome(episode: Episode, final_info: dict, success: SuccessFn | None) -> Outcome:
    """The episode's success from the rule, else from the env's last info, else unknown."""
    if success is not None:
        try:
            value = success(episode, final_info)
        except Exception as exc:  # a user callable: name it and the episode
            raise UserError(
                f"the success rule failed on episode {episode.id}: {type(exc).__name__}: {exc}",
                "fix the success callable; it receives (episode, final_info)",
            ) from None
        return Outcome(_as_bool(value, "the success rule"), "callable")
    for key in SUCCESS_INFO_KEYS:
        if key in (final_info or {}):
            return Outcome(_as_bool(final_info[key], f"info[{key!r}]"), f"info:{key}")
    return Outcome(None, None)


def _as_bool(value, what: str) -> bool:
    try:
        return bool(np.asarray(value).reshape(-1)[0]) if np.ndim(value) else bool(value)
    except (TypeError, ValueError, IndexError):
        raise UserError(f"{what} returned {value!r}, not a truth value", "return True or False") from None


def _import_attr(mod_name: str, attr: str, what: str, spec: str):
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UserError(
            f"cannot import the {what} module {mod_name!r} ({spec}): {exc}",
            "the module must be importable (installed, or on PYTHONPATH)",
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"module {mod_name!r} has no {attr!r} ({spec})", f"check the {what} name")
        obj = getattr(obj, part)
    return obj


IMAGE_KEY = "image"


def parse_render_size(spec: str) -> tuple[int, int]:
    """ "64x48" -> (64, 48) = (W, H); UserError otherwise."""
    w, _, h = str(spec).lower().partition("x")
    try:
        size = (int(w), int(h))
    except ValueError:
        size = (0, 0)
    if min(size) < 1:
        raise UserError(f"--render {spec!r} is not a frame size WxH", "e.g. --render 64x64")
    return size


def resize_frame(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w, C) uint8 -> (H, W, C) uint8 for size (W, H): area averaging when shrinking (each output
    pixel is the mean of the input pixels it covers), bilinear when enlarging; unchanged if equal."""
    W, H = size
    if frame.shape[:2] == (H, W):
        return frame
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].float()  # (1, C, h, w)
    if H <= frame.shape[0] and W <= frame.shape[1]:
        y = F.interpolate(x, size=(H, W), mode="area")  # (1, C, H, W)
    else:
        y = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)
    return y[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def make_render_env(env_id: str, env_kwargs: dict | None, size: tuple[int, int]):
    """The env made to render rgb_array frames: with width/height where it takes them, else without."""
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless; read when the first renderer is created
    kwargs = dict(env_kwargs or {})
    attempts = [{"render_mode": "rgb_array", "width": size[0], "height": size[1]}, {"render_mode": "rgb_array"}, {}]
    last = None
    for extra in attempts:
        try:
            env = make_env(env_id, {**extra, **kwargs})
            break
        except UserError as exc:  # the env does not take these keyword arguments
            last = exc
    else:
        raise last
    if getattr(env, "render_mode", None) != "rgb_array":
        env.close()
        raise UserError(
            f"{env_id} does not render rgb_array frames (render_mode {getattr(env, 'render_mode', None)!r})",
            'pass "render_mode": "rgb_array" in --env-kwargs to an env that supports it',
        )
    return env


class Recorder:
    """One environment and policy; `meta()` for the file, `episodes(n)` to record them one by one.

    render=(W, H) also stores the rendered frames (module docstring)."""

    def __init__(
        self,
        env_id: str | Any,
        policy: str | PolicyFn = "random",
        seed: int = 0,
        env_kwargs: dict | None = None,
        max_steps: int | None = None,
        success: str | SuccessFn | None = None,
        render: tuple[int, int] | None = None,
        shadow: str | PolicyFn | None = None,
    ):
        if max_steps is not None and max_steps < 1:
            raise UserError(f"max_steps must be >= 1, got {max_steps}", "e.g. --max-steps 200")
        self.env_id = env_name(env_id)
        self.env_kwargs = dict(env_kwargs) if env_kwargs else None
        self.render = None if render is None else (int(render[0]), int(render[1]))
        self._env = contextlib.ExitStack()  # closes the env if we made it (opened_env)
        self.env = self._env.enter_context(opened_env(env_id, env_kwargs, self.render))
        try:
            self.codec = SpaceCodec.for_env(self.env)
            self.policy = make_policy(policy, self.env)
            # shadow mode: a candidate policy proposes at every observation; `policy` acts
            self.shadow = None if shadow is None else make_policy(shadow, self.env)
            self.success = make_success(success)
            self.outcomes: dict[int, Outcome] = {}
            limit = self.env.spec.max_episode_steps if self.env.spec is not None else None
            if max_steps is None and limit is None:
                raise UserError(f"{self.env_id} has no time limit, so episodes may never end", "give --max-steps M")
            self.seed, self.max_steps = int(seed), max_steps
            self.dt, self.dt_warning = env_dt(self.env)
            if self.render:
                # Renderers may set their camera up from the first rendered state (gymnasium's MuJoCo
                # viewer aims its free camera at the median geom position then): render once from the
                # seed-0 reset, so every recording of this env sees through the same camera whatever
                # its first episode's seed. Episodes reseed at their own reset, so nothing else changes.
                self.env.reset(seed=0)
                self._frame()
        except BaseException:
            self.close()
            raise
        if self.dt_warning:
            warnings.warn(self.dt_warning, stacklevel=2)

    def meta(self, source: str = "sim") -> LogMeta:
        env_id, env_kwargs = self._registered_env()
        return LogMeta(
            source=source,
            dt=self.dt,
            observation_names=[f"obs_{i}" for i in range(self.codec.obs_dim)],
            action_names=[f"act_{i}" for i in range(self.codec.action_dim)],
            env_id=env_id,
            env_kwargs=env_kwargs,
        )

    def _registered_env(self) -> tuple[str | None, dict | None]:
        """The gymnasium id (and kwargs) the log names so `wmcheck export` can write the env's spaces
        and spec: only a registered id, and kwargs only when they are JSON (else neither is claimed)."""
        import gymnasium as gym

        spec = getattr(self.env, "spec", None)
        if spec is None or spec.id not in gym.registry:
            return None, None
        kwargs = self.env_kwargs if self.env_kwargs is not None else dict(spec.kwargs)  # an instance's own
        kwargs = {k: v for k, v in kwargs.items() if k != "render_mode"} or None  # how we recorded, not the env
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError):
            return None, None
        return spec.id, kwargs

    def episodes(self, n: int, first_id: int = 0) -> Iterator[Episode]:
        for i in range(n):
            yield self.episode(first_id + i)

    def episode(self, ep_id: int) -> Episode:
        seed = self.seed + ep_id
        for p in (self.policy, self.shadow):
            if hasattr(p, "reset"):
                p.reset(seed)
        obs, _ = self.env.reset(seed=seed)
        observations, actions, rewards, terms, truncs = [self.codec.obs(obs)], [], [], [], []
        proposed = []
        t, info = 0, {}
        frames = [self._frame()] if self.render else []
        while self.max_steps is None or t < self.max_steps:
            if self.shadow is not None:
                proposed.append(self.codec.action(self.shadow(obs), self.env)[1])
            a, row = self.codec.action(self.policy(obs), self.env)
            obs, r, term, trunc, info = self.env.step(a)
            observations.append(self.codec.obs(obs))
            actions.append(row)
            rewards.append(float(r))
            terms.append(bool(term))
            truncs.append(bool(trunc))
            if self.render:
                frames.append(self._frame())
            t += 1
            if term or trunc:
                break
        truncs[-1] = truncs[-1] or not terms[-1]  # stopped by max_steps: truncated
        obs_arr = np.stack(observations)  # (N+1, D)
        if not np.isfinite(obs_arr).all():
            bad = int(np.argmax(~np.isfinite(obs_arr).all(axis=1)))
            raise UserError(
                f"{self.env_id} returned a non-finite observation at row {bad} of episode {ep_id}",
                "the simulation diverged: lower --max-steps or check the environment",
            )
        episode = Episode(
            observations=obs_arr,
            actions=np.stack(actions),  # (N, A)
            rewards=np.asarray(rewards, np.float32),
            terminations=np.asarray(terms, bool),
            truncations=np.asarray(truncs, bool),
            id=ep_id,
            seed=seed,
            obs_groups={IMAGE_KEY: np.stack(frames)} if self.render else {},
            proposed_actions=np.stack(proposed) if self.shadow is not None else None,  # (N, A)
        )  # (N+1, H, W, C)
        self.outcomes[ep_id] = episode_outcome(episode, info, self.success)
        return episode

    def _frame(self) -> np.ndarray:
        import gymnasium as gym

        try:
            frame = self.env.render()
        except gym.error.DependencyNotInstalled as exc:
            raise UserError(
                f"{self.env_id} cannot render: {exc}", "install the renderer it names, or record without --render"
            ) from None
        frame = np.asarray(frame) if frame is not None else None
        if frame is None or frame.ndim != 3 or frame.dtype != np.uint8:
            raise UserError(
                f"{self.env_id} rendered {None if frame is None else (frame.shape, frame.dtype)}, "
                "not an (H, W, C) uint8 frame",
                'record envs that support render_mode="rgb_array"',
            )
        return resize_frame(frame, self.render)

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def record_episodes(
    env_id: str | Any,
    policy: str | PolicyFn = "random",
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    env_kwargs: dict | None = None,
    render: tuple[int, int] | None = None,
    shadow: str | PolicyFn | None = None,
) -> list[Episode]:
    """Record `episodes` episodes in memory (for benchmarks and tests); with `shadow`, the candidate
    policy's proposals at every observation as `proposed_actions` while `policy` acts."""
    with Recorder(env_id, policy, seed, env_kwargs, max_steps, render=render, shadow=shadow) as rec:
        return list(rec.episodes(episodes))


def record_to_log(
    path,
    env_id: str | Any,
    policy: str | PolicyFn = "random",
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    env_kwargs: dict | None = None,
    source: str = "sim",
    success: str | SuccessFn | None = None,
    outcomes: dict[int, Outcome] | None = None,
    render: tuple[int, int] | None = None,
    shadow: str | PolicyFn | None = None,
) -> tuple[LogMeta, int]:
    """Record straight into a log file through LogWriter (atomic); returns (meta, total steps).
    Each episode's `Outcome` (success) is added to `outcomes` when a dict is given."""
    from wmcheck.datasets.logformat import LogWriter

    if episodes < 1:
        raise UserError(f"episodes must be >= 1, got {episodes}", "e.g. --episodes 10")
    steps = 0
    with Recorder(env_id, policy, seed, env_kwargs, max_steps, success, render, shadow) as rec:
        meta = rec.meta(source)
        with LogWriter(path, meta) as writer:
            for ep in progress(rec.episodes(episodes), episodes, f"recording {rec.env_id}"):
                writer.add(ep)
                steps += ep.num_steps
        if outcomes is not None:
            outcomes.update(rec.outcomes)
    return meta, steps
