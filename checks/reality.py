"""A "reality" with known gaps: a simulator plus a `RealityProfile` of injected sim-to-real gaps.

Owns the profile (what gaps, how large: a JSON-safe, versioned dataclass), building the reality env
from it (`make_reality_env`), one-gap profiles for power / detection benchmarks
(`single_gap_profiles`), and recording from a reality (`record_reality`). The wrappers themselves live
in `wmcheck.checks.reality_wrappers`.

Wrapper order (inside out), as in a real control loop:

    base env <- PhysicsGap <- StartState <- TerminationGap <- ActuatorGap <- ActionLatency <- SensorGap <- VisualGap
                  dynamics    initial state   extra endings     command->effect  transport delay  observation path camera

A command waits `latency_steps` in the FIFO, then the actuator transforms it (so the neutral fill
also feels the actuator's offset, as a real actuator would), then the modified physics integrates
it; the sensors corrupt what comes back, and the camera's frames (`render()`) differ in appearance.
All wrappers are always applied (identity where the profile has no such gap), so `info["reality"]`
at reset always has the keys "physics", "start_state", "actuator", "latency", "sensor" and "visual".

Recording: `record_reality(...)` in memory, or any recorder through a "module:callable" env id,
which `wmcheck.datasets.record.make_env` accepts; from the CLI:

    wmcheck record wmcheck.checks.reality:make_reality_env --out real.h5 \
        --env-kwargs '{"env_id": "Pendulum-v1", "profile": {"latency_steps": 2}}'

(the CLI's --source offers only sim/policy; `record_to_log(..., source="real")` writes a "real" log).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from wmcheck.checks.reality_wrappers import (
    ActionLatency,
    ActuatorGap,
    PhysicsGap,
    SensorGap,
    StartState,
    TerminationGap,
    VisualGap,
    _jsonable,
    _step_window,
)
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.record import make_env, record_episodes

PROFILE_VERSION = 1
REALITY_ENV = "wmcheck.checks.reality:make_reality_env"  # the "module:callable" id recorders accept

Channels = Any  # None, a number (every channel) or a list with one value per channel


@dataclass
class RealityProfile:
    """The gaps a reality has relative to its simulator. None / 0 / {} means "no such gap"."""

    latency_steps: float = 0
    """Actions act this many steps after they are commanded (`ActionLatency`); a fraction of a step
    (Box actions) mixes each command with the one before it, as a delay that is not a whole number of
    control periods does."""
    latency_window: list | None = None
    """[start, stop): the latency holds only over these steps of each episode (a latency spike);
    None = over the whole episode."""
    actuator_gain: Channels = None
    """Effect per unit command (1 = none); per channel. Order: deadband, gain/offset, saturation."""
    actuator_offset: Channels = None
    """Added to the command after the gain, in action units (0 = none)."""
    actuator_deadband: Channels = None
    """|command| <= deadband gives no effect; above it, the command minus the deadband."""
    actuator_saturation: Channels = None
    """The effect is clipped to +-saturation (None = only the action space's bounds)."""
    process_noise_std: Channels = None
    """Std of a random force added to the actuator's effect every step, in action units: the plant's
    process noise (a deterministic simulator has none)."""
    sensor_bias: Channels = None
    """Added to every observation, in observation units."""
    sensor_noise_std: Channels = None
    """Std of white Gaussian observation noise, in observation units."""
    sensor_drift: Channels = None
    """Drift per step, reset each episode: a ramp's slope, or a random walk's increment std."""
    sensor_drift_mode: str = "ramp"
    """"ramp" (deterministic, drift * t) or "walk" (Gaussian random walk)."""
    visual_brightness: float | None = None
    """Rendered frames x this factor (1 = none); frames only, states untouched (`VisualGap`)."""
    visual_colour: Channels = None
    """Per-colour-channel gain of rendered frames, e.g. [1.2, 1.0, 0.8]."""
    visual_blur: float | None = None
    """Gaussian blur of rendered frames, sigma in pixels."""
    visual_noise_std: float | None = None
    """White Gaussian pixel noise of rendered frames, in grey levels (0-255)."""
    termination_bounds: list | None = None
    """Per observation channel, |obs| above which the episode terminates (null = none): an ending the
    other system does not have (`TerminationGap`)."""
    ignore_termination: bool = False
    """The env's own termination is dropped: the episode runs on where the other system ends (an
    engineering simulator without fall detection or a trip; `TerminationGap`)."""
    start_state: list | None = None
    """The plant's state at every reset, one value (or null: the env's own draw) per state variable
    (`StartState`): an out-of-distribution start. None = the env's own start distribution."""
    physics: dict = field(default_factory=dict)
    """Physical parameter changes, `PhysicsGap` kwargs: {"m": 1.2, "dof_damping": {"scale": 1.5}}."""
    seed: int | None = 0
    """Seed of the sensor noise, combined with each episode's reset seed (None: fresh entropy)."""
    name: str = ""
    """A label for benchmarks and reports (e.g. "latency=2"); not a gap."""

    def __post_init__(self):
        if not isinstance(self.ignore_termination, bool):
            raise UserError(
                f"ignore_termination must be true or false, got {self.ignore_termination!r}",
                "give ignore_termination as a JSON boolean",
            )
        if (
            isinstance(self.latency_steps, bool)
            or not isinstance(self.latency_steps, numbers.Real)
            or not math.isfinite(self.latency_steps)
            or self.latency_steps < 0
        ):
            raise UserError(
                f"latency_steps must be a number of steps >= 0, got {self.latency_steps!r}",
                "e.g. latency_steps=2 or latency_steps=1.5",
            )
        whole = int(self.latency_steps) == self.latency_steps
        self.latency_steps = int(self.latency_steps) if whole else float(self.latency_steps)
        if self.latency_window is not None:
            if not self.latency_steps:
                raise UserError(
                    f"latency_window {self.latency_window!r} is given without a latency",
                    "set latency_steps > 0 for the spike, or drop latency_window",
                )
            self.latency_window = list(_step_window(self.latency_window))
        if self.sensor_drift_mode not in ("ramp", "walk"):
            raise UserError(
                f"sensor_drift_mode must be 'ramp' or 'walk', got {self.sensor_drift_mode!r}",
                'use "ramp" (drift * t) or "walk" (random walk)',
            )
        if not isinstance(self.physics, dict) or not all(isinstance(k, str) for k in self.physics):
            raise UserError(
                f"physics must map parameter names to changes, got {self.physics!r}",
                'e.g. {"m": 1.2} or {"dof_damping": {"scale": 1.5}}',
            )
        for f in dataclasses.fields(self):  # numpy in, plain lists/numbers stored: JSON-safe as it stands
            setattr(self, f.name, _jsonable(getattr(self, f.name)))
        for name, ok, rule in (
            ("actuator_deadband", lambda x: x >= 0, ">= 0"),
            ("actuator_saturation", lambda x: x > 0, "> 0"),
            ("sensor_noise_std", lambda x: x >= 0, ">= 0"),
            ("process_noise_std", lambda x: x >= 0, ">= 0"),
            ("visual_brightness", lambda x: x >= 0, ">= 0"),
            ("visual_colour", lambda x: x >= 0, ">= 0"),
            ("visual_blur", lambda x: x >= 0, ">= 0"),
            ("visual_noise_std", lambda x: x >= 0, ">= 0"),
        ):
            v = getattr(self, name)
            if v is not None and not all(ok(x) for x in (v if isinstance(v, list) else [v])):
                raise UserError(f"{name} must be {rule}, got {v!r}", f"give {name} as magnitudes {rule}")

    def to_dict(self) -> dict:
        return {"version": PROFILE_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> RealityProfile:
        d = dict(d)
        version = d.pop("version", PROFILE_VERSION)
        if version != PROFILE_VERSION:
            raise UserError(
                f"reality profile version {version} is not supported (this is version {PROFILE_VERSION})",
                "re-create the profile with this wmcheck",
            )
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise UserError(f"unknown reality profile field(s) {', '.join(unknown)}", f"use: {', '.join(names)}")
        return cls(**d)

    def has_gaps(self) -> bool:
        return bool(self._parts())

    def describe(self) -> str:
        """One line for people, e.g. "latency 2 steps; actuator gain 0.8; physics m x1.2"."""
        text = "; ".join(self._parts()) or "no gaps (the simulator itself)"
        return f"{self.name}: {text}" if self.name else text

    def _parts(self) -> list[str]:
        parts = []
        if self.latency_steps:
            parts.append(f"latency {self.latency_steps:g} step{'s' if self.latency_steps != 1 else ''}")
            if self.latency_window is not None:
                parts[-1] += f" over steps {self.latency_window[0]}-{self.latency_window[1] - 1}"
        if self.start_state is not None:
            parts.append(f"start state {_fmt(self.start_state)}")
        act = [
            f"{k} {_fmt(v)}"
            for k, v in (
                ("gain", self.actuator_gain),
                ("offset", self.actuator_offset),
                ("deadband", self.actuator_deadband),
                ("saturation", self.actuator_saturation),
            )
            if v is not None
        ]
        if act:
            parts.append("actuator " + ", ".join(act))
        if self.process_noise_std is not None:
            parts.append(f"process noise std {_fmt(self.process_noise_std)}")
        sen = [
            f"{k} {_fmt(v)}"
            for k, v in (("bias", self.sensor_bias), ("noise std", self.sensor_noise_std))
            if v is not None
        ]
        if self.sensor_drift is not None:
            sen.append(f"drift {_fmt(self.sensor_drift)}/step ({self.sensor_drift_mode})")
        if sen:
            parts.append("sensor " + ", ".join(sen))
        vis = [
            f"{k} {_fmt(v)}"
            for k, v in (
                ("brightness", self.visual_brightness),
                ("colour", self.visual_colour),
                ("blur", self.visual_blur),
                ("noise std", self.visual_noise_std),
            )
            if v is not None
        ]
        if vis:
            parts.append("visual " + ", ".join(vis))
        if self.physics:
            phys = [
                f"{k} x{_fmt(c['scale'])}"
                if isinstance(c, dict) and "scale" in c
                else f"{k}={_fmt(c['value'] if isinstance(c, dict) else c)}"
                for k, c in self.physics.items()
            ]
            parts.append("physics " + ", ".join(phys))
        if self.termination_bounds is not None:
            parts.append(f"terminates when |obs| > {_fmt(self.termination_bounds)}")
        if self.ignore_termination:
            parts.append("runs on where the env terminates")
        return parts


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def make_reality_env(
    env_id: str, profile: RealityProfile | dict | None = None, env_kwargs: dict | None = None, **render_kwargs
):
    """The env `env_id` (registered id or "module:Class") with the profile's gaps (see module docstring).

    render_kwargs (render_mode, width, height) go to the base env, so recorders can store frames."""
    env_kwargs = {**render_kwargs, **(env_kwargs or {})}
    if profile is None:
        profile = RealityProfile()
    elif isinstance(profile, dict):
        profile = RealityProfile.from_dict(profile)
    env = make_env(env_id, env_kwargs)
    try:
        p = profile
        env = PhysicsGap(env, **p.physics)
        env = StartState(env, p.start_state)
        env = TerminationGap(env, p.termination_bounds, p.ignore_termination)
        env = ActuatorGap(
            env,
            p.actuator_gain,
            p.actuator_offset,
            p.actuator_deadband,
            p.actuator_saturation,
            p.process_noise_std,
            seed=p.seed,
        )
        env = ActionLatency(env, p.latency_steps, window=p.latency_window)
        env = SensorGap(env, p.sensor_bias, p.sensor_noise_std, p.sensor_drift, seed=p.seed, drift=p.sensor_drift_mode)
        return VisualGap(env, p.visual_brightness, p.visual_colour, p.visual_blur, p.visual_noise_std, seed=p.seed)
    except BaseException:
        env.close()
        raise


def reality_env_args(env_id: str, profile: RealityProfile | dict, env_kwargs: dict | None = None) -> tuple[str, dict]:
    """(env id, env kwargs) that make any `wmcheck.datasets.record` function record this reality:
    `rid, kw = reality_env_args("Pendulum-v1", profile); record_to_log(path, rid, policy, env_kwargs=kw)`.
    """
    d = profile.to_dict() if isinstance(profile, RealityProfile) else RealityProfile.from_dict(profile).to_dict()
    return REALITY_ENV, {"env_id": env_id, "profile": d, "env_kwargs": dict(env_kwargs or {})}


def record_reality(
    env_id: str,
    profile: RealityProfile | dict,
    policy="random",
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    env_kwargs: dict | None = None,
    render: tuple[int, int] | None = None,
):
    """`record_episodes` from the reality (same seeding: episode i resets with seed + i); render=(W, H)
    stores its camera frames (visual gaps included)."""
    rid, kw = reality_env_args(env_id, profile, env_kwargs)
    return record_episodes(rid, policy, episodes, max_steps, seed, kw, render=render)


GAP_KINDS = (
    "latency",
    "actuator_gain",
    "actuator_offset",
    "actuator_deadband",
    "sensor_noise",
    "sensor_bias",
    "sensor_drift",
    "dynamics",
    "visual_brightness",
    "visual_blur",
    "visual_noise",
)


def single_gap_profiles(kind: str, severities, parameter: str | None = None, seed: int = 0) -> list[RealityProfile]:
    """One profile per severity, each with exactly one gap. Severity 0 is "no gap" for every kind:

    latency: steps (a whole number); actuator_gain: gain 1 + s; actuator_offset: offset s;
    actuator_deadband: deadband s; sensor_noise: noise std s; sensor_bias: bias s; sensor_drift:
    ramp slope s per step; dynamics: the physical parameter `parameter` scaled by 1 + s (e.g.
    parameter="m" on Pendulum, "dof_damping" on MuJoCo); visual_brightness: frames x (1 + s);
    visual_blur: blur sigma s pixels; visual_noise: pixel noise std s grey levels. Amounts are in raw
    action / observation units, the same on every channel.
    """
    if kind not in GAP_KINDS:
        raise UserError(f"unknown gap kind {kind!r}", f"use one of: {', '.join(GAP_KINDS)}")
    if kind == "dynamics" and not parameter:
        raise UserError(
            "the dynamics gap needs the physical parameter to scale",
            'pass parameter=, e.g. "m" (Pendulum) or "dof_damping" (MuJoCo)',
        )
    profiles = []
    for s in severities:
        s = float(s)
        if kind == "latency":
            if s != int(s):
                raise UserError(f"latency severities are whole steps, got {s}", "e.g. severities=[0, 1, 2, 4]")
            kw = {"latency_steps": int(s)}
        elif kind == "dynamics":
            if 1 + s <= 0:
                raise UserError(f"dynamics severity {s} scales {parameter} by {1 + s}", "give severities > -1")
            kw = {"physics": {parameter: {"scale": 1 + s}} if s else {}}
        else:
            key = {
                "actuator_gain": "actuator_gain",
                "actuator_offset": "actuator_offset",
                "actuator_deadband": "actuator_deadband",
                "sensor_noise": "sensor_noise_std",
                "sensor_bias": "sensor_bias",
                "sensor_drift": "sensor_drift",
                "visual_brightness": "visual_brightness",
                "visual_blur": "visual_blur",
                "visual_noise": "visual_noise_std",
            }[kind]
            kw = {key: (1 + s if kind in ("actuator_gain", "visual_brightness") else s) if s else None}
        label = f"{kind}({parameter})={s:g}" if kind == "dynamics" else f"{kind}={s:g}"
        profiles.append(RealityProfile(**kw, seed=seed, name=label))
    return profiles
