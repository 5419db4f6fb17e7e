"""Gymnasium wrappers that give a simulator known sim-to-real gaps, one wrapper per gap family.

Owns the gap families of the taxonomy (product.md): `PhysicsGap` (dynamics),
`StartState` (the state distribution: a start outside the logs), `TerminationGap` (endings),
`ActuatorGap` (actuator), `ActionLatency` (latency, constant or a spike over some steps),
`SensorGap` (sensor_noise) and `VisualGap` (visual: brightness, colour, blur and noise of rendered
frames). Composed by
`wmcheck.checks.reality.make_reality_env`, they make the "reality" against which wmcheck is tested
and benchmarked: a gap we injected is a gap we know.

Every wrapper records its constructor arguments, so `gymnasium.make(env.spec)` rebuilds the same
reality (for registered base envs). Every wrapper keeps its spaces valid, passes `info` through (copied, never mutated), and records what
it applies under `info["reality"]` at reset (`"physics"`, `"start_state"`, `"actuator"`, `"latency"`,
`"sensor"`: JSON-safe). At step, `ActuatorGap` adds `info["reality"]["action_applied"]` (what the simulator received)
and `SensorGap` adds `info["reality"]["observation_clean"]` (the uncorrupted observation): ground
truth for benchmarks, never seen by a recorder, which stores only observations and actions.
Per-channel parameters are scalars (broadcast to every channel) or arrays of the space's shape.
"""

from __future__ import annotations

import copy
import difflib
import numbers
from collections import deque

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wmcheck.datasets.errors import UserError

_SENSOR_RNG_TAG = 0x5E4502  # keeps the sensor noise stream apart from the env's own reset(seed) stream
_PROCESS_RNG_TAG = 0x960CE5  # the process-noise stream, apart from the sensor's and the env's


def _per_channel(value, shape, name: str, default: float) -> np.ndarray:
    """`value` (None, scalar or array) broadcast to `shape` as float64; UserError if it cannot be."""
    x = np.asarray(default if value is None else value, np.float64)
    try:
        x = np.broadcast_to(x, shape).copy()
    except ValueError:
        raise UserError(
            f"{name} has shape {x.shape}, the space has shape {shape}",
            f"give {name} as one number or one value per channel {shape}",
        ) from None
    if np.isnan(x).any():
        raise UserError(f"{name} contains NaN: {value!r}", f"give finite numbers for {name}")
    return x


def _jsonable(x):
    """Numpy scalars/arrays (nested in dicts, lists) as plain Python numbers and lists."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return x


def _with_reality(info: dict, key: str, value) -> dict:
    """A copy of `info` whose `info["reality"][key]` is `value` (earlier wrappers' entries kept)."""
    info = dict(info)
    reality = dict(info.get("reality", {}))
    reality[key] = value
    info["reality"] = reality
    return info


class ActionLatency(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """The action applied at step t is the one commanded at step t - `steps` (a transport delay).

    A FIFO of actions, refilled at every reset with the neutral action: for a Box space, zeros
    clipped into the space (0 where 0 is allowed, else the bound nearest 0); for Discrete, the
    first class (`space.start`), which is rarely "neutral" (CartPole: push left), so pass `neutral=`.
    `steps=0` is the identity.

    A fractional delay k + f (0 < f < 1, Box spaces only) is a delay that is not a whole number of
    control periods, as real transport delays are: the command held over step t is u_{t-k-1} for the
    first fraction f of the period and u_{t-k} for the rest, which the step applies as their
    time-weighted mean f u_{t-k-1} + (1 - f) u_{t-k}. That mean is exactly the delayed hold only
    for a step that uses the command's mean over the period (one Euler step, as Pendulum's); a
    system integrated over sub-steps (HalfCheetah's 5) weights the two parts differently, so there
    it approximates a delay of (k + f) dt. An actuator gap wrapped around it acts on the mixed
    command.

    `window=(start, stop)` makes it a latency spike: the delay holds for the steps t of each episode
    with start <= t < stop (t counts from 0 at reset) and is 0 elsewhere, as a congested network
    link delivers commands late for a while. The FIFO is fed at every step, so the spike's first
    step applies the command of `steps` steps before, not the neutral fill; when the spike ends, the
    commands still in the FIFO are dropped (stale packets), and the current command acts at once.
    """

    def __init__(self, env: gym.Env, steps: float, neutral=None, window=None):
        gym.utils.RecordConstructorArgs.__init__(self, steps=steps, neutral=neutral, window=window)
        gym.Wrapper.__init__(self, env)
        if isinstance(steps, bool) or not isinstance(steps, numbers.Real) or not np.isfinite(steps) or steps < 0:
            raise UserError(f"latency steps must be a number >= 0, got {steps!r}", "e.g. steps=2 or steps=1.5")
        self.window = None if window is None else _step_window(window)
        self.whole = int(np.floor(steps))
        self.fraction = float(steps) - self.whole
        if self.fraction and not isinstance(env.action_space, spaces.Box):
            raise UserError(
                f"a fractional latency ({steps!r} steps) mixes neighbouring commands, which needs a Box action "
                f"space, not {env.action_space}",
                "use a whole number of steps",
            )
        self.steps = self.whole if not self.fraction else float(steps)
        self.neutral = self.neutral_action(env.action_space) if neutral is None else neutral
        self._fifo: deque = self._filled()

    def _filled(self) -> deque:
        return deque(copy.deepcopy(self.neutral) for _ in range(self.whole + (1 if self.fraction else 0)))

    @staticmethod
    def neutral_action(space: spaces.Space):
        if isinstance(space, spaces.Box):
            return np.clip(np.zeros(space.shape), space.low, space.high).astype(space.dtype)
        if isinstance(space, spaces.Discrete):
            return space.start
        raise UserError(f"ActionLatency has no neutral action for {space}", "pass neutral=<an action>")

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._fifo = self._filled()
        self._t = 0
        applied = {"steps": self.steps, "neutral_action": _jsonable(self.neutral)}
        if self.window is not None:
            applied["window"] = list(self.window)
        return obs, _with_reality(info, "latency", applied)

    def step(self, action):
        if self.steps == 0:
            return self.env.step(action)
        t, self._t = self._t, self._t + 1
        self._fifo.append(copy.deepcopy(action))  # the caller may reuse its action buffer
        older = self._fifo.popleft()  # u_{t-k} (whole) or u_{t-k-1} (fractional)
        if self.window is not None and not self.window[0] <= t < self.window[1]:
            return self.env.step(action)  # outside the spike: no delay
        if not self.fraction:
            return self.env.step(older)
        held = self.fraction * np.asarray(older, float) + (1.0 - self.fraction) * np.asarray(self._fifo[0], float)
        return self.env.step(held.astype(self.env.action_space.dtype))


def _step_window(window) -> tuple[int, int]:
    """(start, stop) as whole steps with 0 <= start < stop; UserError otherwise."""
    ok = (
        isinstance(window, (list, tuple))
        and len(window) == 2
        and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in window)
        and 0 <= window[0] < window[1]
    )
    if not ok:
        raise UserError(
            f"a latency window must be [start, stop) in whole steps with 0 <= start < stop, got {window!r}",
            "e.g. window=[80, 140] for a spike over steps 80-139",
        )
    return int(window[0]), int(window[1])


class StartState(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Every episode starts from a given plant state instead of the env's own draw: an
    out-of-distribution start (a plant switched on, or handed over, in a state its logs never had).

    `state` has one entry per state variable, None keeping the env's own draw for that variable.
    The state is the classic-control envs' `unwrapped.state` (Pendulum: theta, theta_dot;
    MountainCar: position, velocity) or a MuJoCo env's qpos then qvel (`set_state`). The reset's
    observation is recomputed from the new state. `state=None` is the identity.
    """

    def __init__(self, env: gym.Env, state=None):
        gym.utils.RecordConstructorArgs.__init__(self, state=state)
        gym.Wrapper.__init__(self, env)
        if state is not None and (
            not isinstance(state, (list, tuple))
            or not all(x is None or (isinstance(x, numbers.Real) and np.isfinite(x)) for x in state)
        ):
            raise UserError(
                f"a start state must be a list of numbers (or null to keep the env's draw), got {state!r}",
                "e.g. state=[0.3, 0.0] for MountainCar's position and velocity",
            )
        self.state = None if state is None else list(state)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self.state is None:
            return obs, _with_reality(info, "start_state", None)
        base = self.env.unwrapped
        mujoco = hasattr(base, "set_state") and hasattr(base, "data")
        if mujoco:
            current = np.concatenate([base.data.qpos, base.data.qvel]).astype(np.float64)
        elif getattr(base, "state", None) is not None:
            current = np.asarray(base.state, np.float64).ravel()
        else:
            raise UserError(
                f"{type(base).__name__} has no settable state (`state`, or MuJoCo's `set_state`)",
                "use a classic-control or MuJoCo env, or start the episodes through the env's own options",
            )
        if len(self.state) != current.size:
            raise UserError(
                f"the start state has {len(self.state)} entries, {type(base).__name__}'s state has {current.size}",
                "give one value (or null) per state variable",
            )
        new = np.array([c if x is None else float(x) for x, c in zip(self.state, current)])
        if mujoco:
            nq = base.data.qpos.size
            base.set_state(new[:nq], new[nq:])
        else:
            base.state = new.astype(np.asarray(base.state).dtype).reshape(np.shape(base.state))
        if hasattr(base, "_get_obs"):
            obs = base._get_obs()
        elif base.observation_space.shape == new.shape:
            obs = new.astype(base.observation_space.dtype)
        else:
            raise UserError(
                f"{type(base).__name__}'s observation cannot be recomputed from its state",
                "use an env whose observation is its state or that has _get_obs",
            )
        return obs, _with_reality(info, "start_state", _jsonable(new))


class ActuatorGap(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Commands differ from effects: per channel, in this order,

        dead zone   a <- 0 if |a| <= deadband else a - sign(a) * deadband   (the continuous dead-zone
                    model of control texts: no jump at the edge, so a command of deadband + e gives e)
        gain/offset a <- gain * a + offset
        process     a <- a + N(0, noise_std^2): a random force on the plant every step (process noise:
                    what makes a real system's transitions random, which a deterministic simulator
                    lacks); its own RNG, reseeded from (reset seed, `seed`) like SensorGap's
        saturation  a <- clip(a, -saturation, +saturation)
        space       a <- clip(a, low, high) of the action space, cast to its dtype.

    None means "no such gap" (gain 1, offset 0, deadband 0, no noise, no saturation). Box actions only;
    with no parameter given it is the identity on any space.
    """

    def __init__(
        self,
        env: gym.Env,
        gain=None,
        offset=None,
        deadband=None,
        saturation=None,
        noise_std=None,
        seed: int | None = None,
    ):
        gym.utils.RecordConstructorArgs.__init__(
            self, gain=gain, offset=offset, deadband=deadband, saturation=saturation, noise_std=noise_std, seed=seed
        )
        gym.ActionWrapper.__init__(self, env)
        self.active = any(v is not None for v in (gain, offset, deadband, saturation, noise_std))
        space = env.action_space
        if self.active and not isinstance(space, spaces.Box):
            raise UserError(
                f"ActuatorGap needs a Box action space, {type(env.unwrapped).__name__} has {space}",
                "drop the actuator gap for discrete actions (use ActionLatency or PhysicsGap)",
            )
        shape = getattr(space, "shape", ())
        self.gain = _per_channel(gain, shape, "actuator gain", 1.0)
        self.offset = _per_channel(offset, shape, "actuator offset", 0.0)
        self.deadband = _per_channel(deadband, shape, "actuator deadband", 0.0)
        self.saturation = _per_channel(saturation, shape, "actuator saturation", np.inf)
        self.noise_std = _per_channel(noise_std, shape, "process noise std", 0.0)
        self.seed = seed
        self.rng = np.random.default_rng(None if seed is None else [_PROCESS_RNG_TAG, int(seed)])
        if (self.noise_std < 0).any():
            raise UserError(f"process noise std must be >= 0, got {noise_std!r}", "give it in action units, e.g. 0.1")
        if (self.deadband < 0).any() or (self.saturation <= 0).any():
            raise UserError(
                f"actuator deadband must be >= 0 and saturation > 0, got {deadband!r} and {saturation!r}",
                "give magnitudes in action units, e.g. deadband=0.05, saturation=1.5",
            )

    def action(self, action):
        if not self.active:
            return action
        space = self.env.action_space
        a = np.asarray(action, np.float64).reshape(space.shape)
        a = np.where(np.abs(a) <= self.deadband, 0.0, a - np.sign(a) * self.deadband)
        a = self.gain * a + self.offset
        if (self.noise_std > 0).any():
            a = a + self.rng.standard_normal(a.shape) * self.noise_std
        a = np.clip(a, -self.saturation, self.saturation)
        return np.clip(a, space.low, space.high).astype(space.dtype)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            tail = [] if self.seed is None else [int(self.seed)]
            self.rng = np.random.default_rng([_PROCESS_RNG_TAG, int(seed), *tail])
        params = {
            "gain": self.gain,
            "process_noise_std": self.noise_std,
            "offset": self.offset,
            "deadband": self.deadband,
            "saturation": None if np.isinf(self.saturation).all() else self.saturation,
        }
        return obs, _with_reality(info, "actuator", _jsonable(params))

    def step(self, action):
        applied = self.action(action)
        obs, reward, terminated, truncated, info = self.env.step(applied)
        if self.active:
            info = _with_reality(info, "action_applied", applied.tolist())
        return obs, reward, terminated, truncated, info


class SensorGap(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Observations differ from the state: per channel, obs = clean + bias + drift(t) + noise.

    - noise: Gaussian, std `noise_std`, white, from the wrapper's own RNG. `reset(seed=s)` reseeds it
      from (s, `seed`), so a recording is reproducible from its episode seeds, differs across episode
      seeds, and differs across wrapper seeds; `reset()` without a seed continues the stream.
    - drift: zero at every reset, then `drift="ramp"` (default): drift_per_step * t, a deterministic
      linear ramp of known size; or `drift="walk"`: a Gaussian random walk whose increments have std
      drift_per_step (gyro-bias style; size ~ drift_per_step * sqrt(t)).
    The observation space widens to match: channels with noise or drift become unbounded, bias-only
    channels shift by the bias. Box observations only; with no parameter given it is the identity.
    """

    def __init__(
        self, env: gym.Env, bias=None, noise_std=None, drift_per_step=None, seed: int | None = None, drift: str = "ramp"
    ):
        gym.utils.RecordConstructorArgs.__init__(
            self, bias=bias, noise_std=noise_std, drift_per_step=drift_per_step, seed=seed, drift=drift
        )
        gym.ObservationWrapper.__init__(self, env)
        self.active = any(v is not None for v in (bias, noise_std, drift_per_step))
        space = env.observation_space
        if self.active and not isinstance(space, spaces.Box):
            raise UserError(
                f"SensorGap needs a Box observation space, got {space}",
                "flatten Dict observations first (gymnasium.wrappers.FlattenObservation)",
            )
        if drift not in ("ramp", "walk"):
            raise UserError(f"sensor drift mode must be 'ramp' or 'walk', got {drift!r}", "use drift='ramp'")
        shape = getattr(space, "shape", ())
        self.bias = _per_channel(bias, shape, "sensor bias", 0.0)
        self.noise_std = _per_channel(noise_std, shape, "sensor noise_std", 0.0)
        self.drift_per_step = _per_channel(drift_per_step, shape, "sensor drift_per_step", 0.0)
        if (self.noise_std < 0).any() or (drift == "walk" and (self.drift_per_step < 0).any()):
            raise UserError(
                "sensor noise_std (and a walk's drift_per_step) must be >= 0",
                "give standard deviations in observation units",
            )
        self.drift_mode, self.seed = drift, seed
        self.rng = np.random.default_rng(None if seed is None else [_SENSOR_RNG_TAG, int(seed)])
        self._t, self._walk = 0, np.zeros(shape)
        if self.active:
            unbounded = (self.noise_std > 0) | (self.drift_per_step != 0)
            low = np.where(unbounded, -np.inf, space.low + self.bias)
            high = np.where(unbounded, np.inf, space.high + self.bias)
            self.observation_space = spaces.Box(low.astype(space.dtype), high.astype(space.dtype), shape, space.dtype)

    def observation(self, observation):
        """The corrupted observation at the current step count (draws noise: call once per step)."""
        if not self.active:
            return observation
        if self.drift_mode == "ramp":
            drift = self.drift_per_step * self._t
        else:
            drift = self._walk
        noise = self.rng.standard_normal(self._walk.shape) * self.noise_std
        return (np.asarray(observation, np.float64) + self.bias + drift + noise).astype(self.observation_space.dtype)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            tail = [] if self.seed is None else [int(self.seed)]
            self.rng = np.random.default_rng([_SENSOR_RNG_TAG, int(seed), *tail])
        self._t, self._walk = 0, np.zeros_like(self._walk)
        params = {
            "bias": self.bias,
            "noise_std": self.noise_std,
            "drift_per_step": self.drift_per_step,
            "drift": self.drift_mode,
            "seed": self.seed,
        }
        info = _with_reality(info, "sensor", _jsonable(params))
        if self.active:
            info = _with_reality(info, "observation_clean", _jsonable(obs))
        return self.observation(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not self.active:
            return obs, reward, terminated, truncated, info
        self._t += 1
        if self.drift_mode == "walk":
            self._walk = self._walk + self.rng.standard_normal(self._walk.shape) * self.drift_per_step
        info = _with_reality(info, "observation_clean", _jsonable(obs))
        return self.observation(obs), reward, terminated, truncated, info


# ---- physics ----------------------------------------------------------------------------------------

_MJ_PREFIXES = ("body_", "dof_", "geom_", "jnt_", "actuator_", "tendon_", "pair_", "opt.")
# Computed from the other fields by mj_setConst, which PhysicsGap runs: a change to them would be undone.
_MJ_DERIVED = {
    "body_subtreemass",
    "body_invweight0",
    "dof_invweight0",
    "dof_M0",
    "tendon_invweight0",
    "tendon_length0",
    "actuator_acc0",
    "actuator_length0",
    "flexedge_invweight0",
    "flexedge_length0",
}


def _is_mujoco(unwrapped) -> bool:
    model = getattr(unwrapped, "model", None)
    return model is not None and type(model).__name__ == "MjModel"


def _available(unwrapped) -> list[str]:
    """The names PhysicsGap accepts for this env (for MuJoCo: the physical groups of float fields)."""
    if _is_mujoco(unwrapped):
        m = unwrapped.model
        fields = [
            n
            for n in dir(m)
            if not n.startswith("_")
            and n not in _MJ_DERIVED
            and isinstance(getattr(m, n), np.ndarray)
            and getattr(m, n).dtype.kind == "f"
        ]
        opts = [
            f"opt.{n}"
            for n in dir(m.opt)
            if not n.startswith("_") and isinstance(getattr(m.opt, n), (float, np.ndarray))
        ]
        return sorted(fields + opts)
    return sorted(
        k
        for k, v in vars(unwrapped).items()
        if not k.startswith("_") and isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
    )


def _new_value(name: str, current, change):
    """The value that `change` (number/array: absolute; {"scale": s} or {"value": v}) gives `name`."""
    if isinstance(change, dict):
        if set(change) == {"scale"}:
            return np.asarray(current, np.float64) * np.asarray(change["scale"], np.float64)
        if set(change) == {"value"}:
            change = change["value"]
        else:
            raise UserError(
                f"physics change for {name} has keys {sorted(change)}",
                'give a number or array (absolute), {"scale": s} or {"value": v}',
            )
    return np.asarray(change, np.float64)


class TerminationGap(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """An ending the other system does not have: the episode terminates as soon as |obs_c| exceeds
    bounds[c] for some channel c (None = no bound on that channel), on the true state, before the
    sensors. A simulator whose pole "falls" where the real one never does, or a safety cut-off the
    real plant lacks. With `ignore` the env's own termination is dropped first (only the bounds end
    an episode): a simulator that runs on where the other system falls. With no bound given and
    `ignore` False it is the identity."""

    def __init__(self, env: gym.Env, bounds=None, ignore: bool = False):
        gym.utils.RecordConstructorArgs.__init__(self, bounds=bounds, ignore=ignore)
        gym.Wrapper.__init__(self, env)
        self.ignore = bool(ignore)
        shape = getattr(env.observation_space, "shape", ())
        self.bounds = None
        if bounds is not None:
            if not isinstance(bounds, (list, tuple)) or len(bounds) != int(np.prod(shape)):
                raise UserError(
                    f"termination bounds need one value (or null) per observation channel {shape}, got {bounds!r}",
                    "e.g. [null, null, 4.0]",
                )
            self.bounds = np.array([np.inf if b is None else float(b) for b in bounds])

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.ignore and terminated:
            terminated = False
            info = _with_reality(info, "termination_ignored", True)
        if self.bounds is not None and bool((np.abs(np.asarray(obs, float).ravel()) > self.bounds).any()):
            terminated = True
            info = _with_reality(info, "terminated_by_bound", True)
        return obs, reward, terminated, truncated, info


class PhysicsGap(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Physical parameters differ: `PhysicsGap(env, m=1.2, l={"scale": 1.1})`.

    Classic control: public numeric attributes of `env.unwrapped` (Pendulum `m`, `l`, `g`,
    `max_torque`; CartPole `masspole`, `length`, `force_mag`, ... ; CartPole's derived `total_mass` and
    `polemass_length` are recomputed unless given). MuJoCo: float fields of `env.unwrapped.model`
    (`dof_damping`, `geom_friction`, `body_mass`, ...) and `opt.<field>` (pass these through
    `**{"opt.gravity": [...]}`); scalars and arrays broadcast to the field's shape, then
    `mj_setConst` refreshes the derived constants (subtree masses, inverse weights) on scratch data.
    Applied once, at construction: resets leave them in place (classic envs do not touch their
    parameters; MuJoCo's reset only resets mjData). Wrap before the first reset.
    """

    def __init__(self, env: gym.Env, **changes):
        gym.utils.RecordConstructorArgs.__init__(self, **changes)
        gym.Wrapper.__init__(self, env)
        u = env.unwrapped
        available = _available(u)
        unknown = [n for n in changes if n not in available]
        if unknown:
            close = sorted({c for n in unknown for c in difflib.get_close_matches(n, available, n=3)})
            shown = (
                available
                if not _is_mujoco(u)
                else [
                    n for n in available if n.startswith(_MJ_PREFIXES) and not n.endswith(("_user", "_rgba", "_aabb"))
                ]
            )
            derived = [n for n in unknown if n in _MJ_DERIVED]
            raise UserError(
                f"{type(u).__name__} has no physical parameter {', '.join(map(repr, unknown))}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
                + (f"; {', '.join(derived)} are derived by MuJoCo from the others" if derived else ""),
                f"use one of: {', '.join(shown)}",
            )
        self.changes = dict(changes)
        self.applied = {}  # name -> {"before": ..., "after": ...}, JSON-safe
        for name, change in changes.items():
            owner, attr = (
                (u.model.opt, name[4:])
                if name.startswith("opt.")
                else ((u.model, name) if _is_mujoco(u) else (u, name))
            )
            before = np.array(getattr(owner, attr), np.float64)
            after = _new_value(name, before, change)
            try:
                after = np.broadcast_to(after, before.shape).copy()
            except ValueError:
                raise UserError(
                    f"physics change for {name} has shape {after.shape}, the parameter has shape {before.shape}",
                    "give one number or an array of the parameter's shape",
                ) from None
            if isinstance(getattr(owner, attr), np.ndarray):
                getattr(owner, attr)[...] = after
            else:
                setattr(owner, attr, after.item() if after.ndim == 0 else after)
            self.applied[name] = {"before": before.tolist(), "after": after.tolist()}
        if changes and _is_mujoco(u):
            import mujoco

            mujoco.mj_setConst(u.model, mujoco.MjData(u.model))  # scratch data: the env's state is untouched
        if type(u).__name__ == "CartPoleEnv":  # step() uses these products, computed once in __init__
            if "total_mass" not in changes:
                u.total_mass = u.masspole + u.masscart
            if "polemass_length" not in changes:
                u.polemass_length = u.masspole * u.length

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, _with_reality(info, "physics", copy.deepcopy(self.applied))


# ---- visual -----------------------------------------------------------------------------------------


def _gaussian_blur(frame: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of an (H, W, C) float frame (edges replicated); sigma in pixels."""
    radius = max(1, int(np.ceil(3 * sigma)))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k /= k.sum()
    out = np.pad(frame, ((radius, radius), (0, 0), (0, 0)), mode="edge")
    out = sum(k[i] * out[i : i + frame.shape[0]] for i in range(len(k)))  # rows
    out = np.pad(out, ((0, 0), (radius, radius), (0, 0)), mode="edge")
    return sum(k[i] * out[:, i : i + frame.shape[1]] for i in range(len(k)))  # columns


class VisualGap(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Rendered frames differ from the camera's: the visual gap. Only `render()` changes; states,
    dynamics and vector observations are untouched, so a check must find this gap in the images.

    In order, on the frame as float in [0, 255]: per-channel colour gain `colour` (e.g. [1.2, 1, 0.8]
    warms the image), global `brightness` factor, Gaussian `blur` (sigma in pixels), white Gaussian
    `noise_std` (grey levels, from the wrapper's RNG, reseeded by reset(seed) as `SensorGap` does),
    then clipped back to uint8. With no parameter given it is the identity. The frames must be
    (H, W, C) uint8 (render_mode="rgb_array").
    """

    def __init__(
        self,
        env: gym.Env,
        brightness: float | None = None,
        colour=None,
        blur: float | None = None,
        noise_std: float | None = None,
        seed: int | None = 0,
    ):
        gym.utils.RecordConstructorArgs.__init__(
            self, brightness=brightness, colour=colour, blur=blur, noise_std=noise_std, seed=seed
        )
        gym.Wrapper.__init__(self, env)
        for name, v in (("brightness", brightness), ("blur", blur), ("noise_std", noise_std)):
            if v is not None and not (np.isfinite(v) and v >= 0):
                raise UserError(f"visual {name} must be a number >= 0, got {v!r}", f"e.g. {name}=1.3")
        self.brightness, self.blur, self.noise_std, self.seed = brightness, blur, noise_std, seed
        self.colour = None if colour is None else np.asarray(colour, np.float64).reshape(-1)
        if self.colour is not None and (self.colour < 0).any():
            raise UserError(f"visual colour gains must be >= 0, got {colour!r}", "e.g. colour=[1.2, 1.0, 0.8]")
        self.active = any(v is not None for v in (brightness, colour, blur, noise_std))
        self.rng = np.random.default_rng(None if seed is None else [_SENSOR_RNG_TAG + 1, int(seed)])

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            tail = [] if self.seed is None else [int(self.seed)]
            self.rng = np.random.default_rng([_SENSOR_RNG_TAG + 1, int(seed), *tail])
        params = {
            "brightness": self.brightness,
            "colour": self.colour,
            "blur": self.blur,
            "noise_std": self.noise_std,
            "seed": self.seed,
        }
        return obs, _with_reality(info, "visual", _jsonable(params))

    def render(self):
        frame = self.env.render()
        return self.transform(frame) if self.active and frame is not None else frame

    def transform(self, frame: np.ndarray) -> np.ndarray:
        """The visual gap applied to one (H, W, C) uint8 frame."""
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.dtype != np.uint8:
            raise UserError(
                f"VisualGap needs (H, W, C) uint8 frames, the env rendered {frame.shape} {frame.dtype}",
                'make the env with render_mode="rgb_array"',
            )
        x = frame.astype(np.float64)  # (H, W, C)
        if self.colour is not None:
            if self.colour.size not in (1, x.shape[2]):
                raise UserError(
                    f"visual colour has {self.colour.size} gains for {x.shape[2]} channels",
                    "give one gain per colour channel",
                )
            x = x * self.colour
        if self.brightness is not None:
            x = x * self.brightness
        if self.blur:
            x = _gaussian_blur(x, float(self.blur))
        if self.noise_std:
            x = x + self.rng.standard_normal(x.shape) * self.noise_std
        return np.clip(np.rint(x), 0, 255).astype(np.uint8)
