"""A hand-engineered power-curve simulator of a La Haute Borne wind turbine (Senvion MM82).

Owns the turbine physics (`TurbineParams`, `turbine_power`), a gymnasium environment driven by
exogenous wind and temperature series (`WindTurbineSim`), and the replay of logged periods
through it (`replay_episode`, `replay_log`) with the logged commands or with a policy.

It is deliberately the kind of model an engineering team writes from a datasheet, so that
wmcheck has something realistic to find:
- air density from the outdoor temperature (ideal gas, fixed site pressure);
- rotor aerodynamics from the widely used analytic Cp(lambda, beta) surface (Heier's
  coefficients), variable rotor speed between the datasheet limits, so the tip-speed ratio is
  optimal in partial load and falls above the speed limit;
- a cos^k loss for yaw misalignment; cut-in and cut-out wind speeds; rated power as a cap;
- 10-minute means are treated as steady wind (no turbulence, no cut-in hysteresis, no nacelle
  anemometer transfer function, no icing, wakes or curtailment).

Step convention (the log's `step_values: end`, like the SCADA import): the command chosen at
step t (pitch angle, nacelle heading) acts during the next 10-minute interval, whose wind and
temperature are the exogenous row t; the power averaged over that interval is observation t+1.
The controller observes the last interval: [power kW, wind speed m/s, wind direction relative to
the nacelle deg, outdoor temperature degC, nacelle heading deg].
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from wmcheck.datasets.episode import Episode, LogMeta
from wmcheck.datasets.errors import UserError

OBS_NAMES = ["P_avg", "Ws_avg", "Va_avg", "Ot_avg", "Ya_avg"]  # what the controller sees
ACTION_NAMES = ["Ba_avg", "Ya_avg"]  # pitch angle, nacelle heading: the commands
INPUT_NAMES = ["Ws_avg", "Va_avg", "Ot_avg"]  # exogenous inputs in the log
UNITS = {"P_avg": "kW", "Ba_avg": "deg", "Ya_avg": "deg", "Ws_avg": "m/s", "Va_avg": "deg", "Ot_avg": "degC"}
DT = 600.0  # seconds: 10-minute SCADA means


@dataclass
class TurbineParams:
    """Datasheet and engineering constants (Senvion MM82 at La Haute Borne)."""

    rated_kw: float = 2050.0
    rotor_radius_m: float = 41.0
    cut_in_ms: float = 3.5
    cut_out_ms: float = 25.0
    rotor_rpm_min: float = 8.5
    rotor_rpm_max: float = 17.1
    tip_speed_ratio_opt: float = 8.1  # where Heier's Cp surface peaks at beta = 0 (Cp about 0.48)
    fine_pitch_deg: float = -1.0  # the logged pitch angle of the fully working position
    efficiency: float = 0.94  # gearbox, generator and converter
    yaw_loss_exponent: float = 2.0  # P ~ cos^k(misalignment); field estimates range 1.8-3
    site_pressure_pa: float = 96000.0  # standard atmosphere at about 400 m site + 80 m hub (assumed)
    gas_constant: float = 287.05  # J/(kg K), dry air


def air_density(temperature_c, params: TurbineParams) -> np.ndarray:
    """kg/m^3 from the outdoor temperature (ideal gas at the site pressure)."""
    return params.site_pressure_pa / (params.gas_constant * (np.asarray(temperature_c, float) + 273.15))


def power_coefficient(tip_speed_ratio, pitch_deg) -> np.ndarray:
    """Heier's analytic Cp(lambda, beta) (beta in degrees from fine pitch, >= 0), clipped to [0, Betz]."""
    lam = np.asarray(tip_speed_ratio, float)
    beta = np.maximum(np.asarray(pitch_deg, float), 0.0)
    inv = 1.0 / (lam + 0.08 * beta) - 0.035 / (beta**3 + 1.0)
    li = 1.0 / np.maximum(inv, 1e-6)
    cp = 0.5176 * (116.0 / li - 0.4 * beta - 5.0) * np.exp(-21.0 / li) + 0.0068 * lam
    return np.clip(cp, 0.0, 16.0 / 27.0)


def turbine_power(
    wind_ms, misalignment_deg, temperature_c, pitch_deg, params: TurbineParams | None = None
) -> np.ndarray:
    """Electrical power in kW (10-minute mean, steady-wind assumption); arrays broadcast."""
    p = params or TurbineParams()
    v = np.maximum(np.asarray(wind_ms, float), 0.1)
    radius = p.rotor_radius_m
    omega = np.clip(p.tip_speed_ratio_opt * v / radius, p.rotor_rpm_min * np.pi / 30, p.rotor_rpm_max * np.pi / 30)
    cp = power_coefficient(omega * radius / v, np.asarray(pitch_deg, float) - p.fine_pitch_deg)
    yaw = np.cos(np.radians(np.clip(np.asarray(misalignment_deg, float), -90.0, 90.0))) ** p.yaw_loss_exponent
    aero_w = 0.5 * air_density(temperature_c, p) * np.pi * radius**2 * cp * v**3 * yaw
    kw = np.minimum(p.efficiency * aero_w / 1000.0, p.rated_kw)
    running = (np.asarray(wind_ms) >= p.cut_in_ms) & (np.asarray(wind_ms) < p.cut_out_ms)
    return np.where(running, kw, 0.0)


def wrap_deg(x) -> np.ndarray:
    """Angles to [-180, 180)."""
    return (np.asarray(x, float) + 180.0) % 360.0 - 180.0


def synthetic_weather(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 3) [wind speed m/s, absolute wind direction deg, temperature degC] for stand-alone use:
    a Weibull-distributed mean wind with AR(1) fluctuations, a wandering direction and a daily
    temperature cycle (10-minute steps)."""
    mean = 7.0 * rng.weibull(2.0)
    ar = np.zeros(n)
    for t in range(1, n):
        ar[t] = 0.97 * ar[t - 1] + rng.normal(0, 0.5)
    ws = np.clip(mean + ar, 0.0, 30.0)
    wa = (rng.uniform(0, 360) + np.cumsum(rng.normal(0, 4.0, n))) % 360.0
    hours = np.arange(n) * DT / 3600.0
    ot = rng.uniform(0, 20) + 5.0 * np.sin(2 * np.pi * (hours - 9.0) / 24.0) + rng.normal(0, 0.3, n)
    return np.stack([ws, wa, ot], 1)


class WindTurbineSim(gym.Env):
    """The power-curve simulator as a gymnasium environment.

    reset(options={"weather": (N, 3) [wind m/s, absolute direction deg, temperature degC],
                   "nacelle": initial heading deg, "power": initial power kW}) replays a given
    weather series (e.g. a logged period); without options a synthetic series of `max_steps`
    steps is drawn. Actions: [pitch deg, nacelle heading deg]. Reward: energy in MWh per step.
    The episode is truncated at the end of the weather series.
    """

    metadata = {"render_modes": []}
    dt = DT

    def __init__(self, params: dict | TurbineParams | None = None, max_steps: int = 1008):
        self.params = params if isinstance(params, TurbineParams) else TurbineParams(**(params or {}))
        self.max_steps = int(max_steps)
        self.observation_space = gym.spaces.Box(
            np.array([-100.0, 0.0, -180.0, -50.0, 0.0], np.float32),
            np.array([3000.0, 60.0, 180.0, 60.0, 360.0], np.float32),
            dtype=np.float32,
        )
        self.action_space = gym.spaces.Box(
            np.array([-2.0, 0.0], np.float32), np.array([92.0, 360.0], np.float32), dtype=np.float32
        )
        self._weather = np.zeros((0, 3))
        self._t = 0
        self._nacelle = 0.0
        self._obs = np.zeros(5, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        weather = options.get("weather")
        if weather is None:
            weather = synthetic_weather(self.max_steps + 1, self.np_random)
        weather = np.asarray(weather, float)
        if weather.ndim != 2 or weather.shape[1] != 3 or len(weather) < 2:
            raise ValueError(f"weather must be (N >= 2, 3) [wind, direction, temperature], got {weather.shape}")
        self._weather, self._t = weather, 0
        ws, wa, ot = weather[0]
        self._nacelle = float(options.get("nacelle", wa)) % 360.0
        rel = float(wrap_deg(wa - self._nacelle))
        p0 = options.get("power")
        if p0 is None:
            p0 = float(turbine_power(ws, rel, ot, self.params.fine_pitch_deg, self.params))
        self._obs = np.array([p0, ws, rel, ot, self._nacelle], np.float32)
        return self._obs.copy(), {}

    def step(self, action):
        pitch, nacelle = float(action[0]), float(action[1]) % 360.0
        self._t += 1
        ws, wa, ot = self._weather[self._t]
        rel = float(wrap_deg(wa - nacelle))
        kw = float(turbine_power(ws, rel, ot, pitch, self.params))
        self._nacelle = nacelle
        self._obs = np.array([kw, ws, rel, ot, nacelle], np.float32)
        truncated = self._t >= len(self._weather) - 1 or self._t >= self.max_steps
        return self._obs.copy(), kw * DT / 3600.0 / 1000.0, False, truncated, {"power_kw": kw, "misalignment_deg": rel}


def logged_weather(ep: Episode, input_names: list[str], action_names: list[str]) -> tuple[np.ndarray, float]:
    """(N + 1, 3) weather of a logged episode in the simulator's convention, and the initial nacelle
    heading. Row t + 1 is the weather of interval t (the log's inputs row t); the absolute wind
    direction is the logged nacelle heading plus the logged relative direction. Row 0 repeats row 1
    (the simulator only uses it for the initial observation)."""
    col = {n: i for i, n in enumerate(input_names)}
    act = {n: i for i, n in enumerate(action_names)}
    missing = [n for n in INPUT_NAMES if n not in col] + [n for n in ("Ya_avg",) if n not in act]
    if missing:
        raise ValueError(f"the log lacks the channels {missing} the wind-turbine simulator is driven by")
    x = ep.input_array()
    ws, rel, ot = x[:, col["Ws_avg"]], x[:, col["Va_avg"]], x[:, col["Ot_avg"]]
    wa = (ep.actions[:, act["Ya_avg"]] + rel) % 360.0
    w = np.stack([ws, wa, ot], 1).astype(float)  # (N, 3)
    return np.concatenate([w[:1], w]), float(ep.actions[0, act["Ya_avg"]])


def replay_episode(
    ep: Episode, input_names: list[str], action_names: list[str], policy=None, params: TurbineParams | None = None
) -> Episode:
    """Run a logged period through the simulator: its weather, and either its own commands
    (`policy=None`, the simulator's replay) or `policy(obs) -> [pitch, nacelle]` (closed loop).
    Starts from the logged power; returns an episode with the log's channels (obs P_avg, actions
    Ba_avg/Ya_avg, inputs Ws_avg/Va_avg/Ot_avg) and the logged timestamps."""
    weather, nacelle0 = logged_weather(ep, input_names, action_names)
    env = WindTurbineSim(params, max_steps=ep.num_steps)
    obs, _ = env.reset(options={"weather": weather, "nacelle": nacelle0, "power": float(ep.observations[0, 0])})
    if policy is not None and hasattr(policy, "reset"):
        policy.reset(ep.id)
    act = {n: i for i, n in enumerate(action_names)}
    power, actions, inputs, rewards = [obs[0]], [], [], []
    for t in range(ep.num_steps):
        if policy is None:
            a = np.array([ep.actions[t, act["Ba_avg"]], ep.actions[t, act["Ya_avg"]]], float)
        else:
            a = np.asarray(policy(obs), float).reshape(2)
        obs, r, _, _, _ = env.step(a)
        power.append(obs[0])
        actions.append([a[0], a[1] % 360.0])
        inputs.append([obs[1], obs[2], obs[3]])
        rewards.append(r)
    return Episode(
        observations=np.asarray(power, np.float32)[:, None],  # (N+1, 1)
        actions=np.asarray(actions, np.float32),
        inputs=np.asarray(inputs, np.float32),
        rewards=np.asarray(rewards, np.float32),
        terminations=np.zeros(ep.num_steps, bool),
        timestamps=ep.timestamps,
        id=ep.id,
        name=ep.name,
    )


def replay_log(
    real_log, out, episode_ids=None, policy=None, params: TurbineParams | None = None
) -> tuple[LogMeta, int]:
    """Replay episodes of a real wind-turbine log (default: all) into a new log `out` (written
    atomically): source "sim" with the logged commands, "policy" with a policy. Returns (meta, steps)."""
    from wmcheck.datasets.logformat import LogWriter, open_log

    with open_log(real_log) as log:
        ids = list(log.episode_ids) if episode_ids is None else list(episode_ids)
        src = log.meta
        if (src.observation_names, src.action_names, sorted(src.input_names)) != (
            ["P_avg"],
            ACTION_NAMES,
            sorted(INPUT_NAMES),
        ):
            raise UserError(
                f"{real_log} does not have the La Haute Borne channels (obs {src.observation_names}, "
                f"actions {src.action_names}, inputs {src.input_names})",
                "import it with datasets/data/la-haute-borne.yaml (obs P_avg, actions Ba_avg/Ya_avg, "
                "inputs Ws_avg/Va_avg/Ot_avg)",
            )
        meta = LogMeta(
            source="sim" if policy is None else "policy",
            dt=src.dt,
            observation_names=["P_avg"],
            action_names=list(ACTION_NAMES),
            input_names=list(INPUT_NAMES),
            units=dict(UNITS),
        )
        steps = 0
        with LogWriter(out, meta) as writer:
            for ep in log.episodes(ids):
                sim = replay_episode(ep, src.input_names, src.action_names, policy, params)
                writer.add(sim)
                steps += sim.num_steps
    return meta, steps
