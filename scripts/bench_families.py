"""The detection benchmark's systems and checked simulators, by family (used by bench_detection.py).

Owns `SystemSpec` (a system, its noisy reality, its real logs and model), the controllers, and
`jobs_for(spec, reality, obs_std)`: every checked simulator as a `CheckJob` with its ground truth
(the gap types it truly has relative to reality). Real hand-engineered simulators are
deterministic, biased and checked under other policies, so the families are:

  deterministic  noise-free simulators (no sensor noise, no process noise) against the noisy
                 reality: the reality's twin without noise (truth: sensor_noise, the "sensors
                 assumed ideal" red flag), the twin with biased physics at graded sizes (+ dynamics),
                 the twin missing the reality's latency (+ latency), and the nominal env with none of
                 the reality's gaps (+ latency, actuator, dynamics);
  perturbation   the reality's own profile (its noise included) with one gap made larger, graded
                 sizes per gap type (the earlier benchmark, kept for continuity);
  control        faithful simulators: the reality's full profile with fresh seeds, under the logs'
                 behaviour policy, under other excitation (faster held commands, a closed-loop
                 controller) and with other episode counts (few, many): every one should pass;
  ending         the reality's profile plus a termination the real system does not have (episodes
                 end where reality runs on; truth: ending), the reality without its own termination
                 (episodes run on where reality falls; truth: ending), or ending later than it, and
                 the reality cut by a time limit shorter than a block (truncated, not terminated: no
                 gap, but nothing to score).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from wmcheck.checks.power import POWER_SIZES
from wmcheck.checks.reality import RealityProfile

# ---- controllers (closed-loop checks under another policy) -------------------------------------------


def pendulum_pd(obs) -> np.ndarray:
    """PD torque towards upright, saturated at Pendulum's 2 N m (it cannot lift from the bottom in
    one go: it pumps and falls back, a closed-loop behaviour unlike the random logs)."""
    theta = math.atan2(float(obs[1]), float(obs[0]))
    return np.array([np.clip(-6.0 * theta - 1.5 * float(obs[2]), -2.0, 2.0)], np.float32)


class CheetahGait:
    """An open-loop sinusoidal gait (period 20 steps, back/front legs in antiphase) with damping on
    the joint velocities: a simple, deterministic controller for HalfCheetah."""

    def __init__(self):
        self.t = 0
        self.phase = np.array([0.0, 0.5, 1.0, math.pi, math.pi + 0.5, math.pi + 1.0])

    def reset(self, seed: int) -> None:
        self.t = 0

    def __call__(self, obs) -> np.ndarray:
        a = 0.7 * np.sin(2 * math.pi * self.t / 20 + self.phase) - 0.05 * np.asarray(obs[11:17], float)
        self.t += 1
        return np.clip(a, -1, 1).astype(np.float32)


class PusherSweep:
    """Slow sinusoidal sweeps of every joint (periods 30-60 steps): a smooth, deterministic input for
    Pusher's arm, unlike the logs' held random commands."""

    def __init__(self):
        self.t = 0

    def reset(self, seed: int) -> None:
        self.t = 0

    def __call__(self, obs) -> np.ndarray:
        periods = np.linspace(30, 60, 7)
        a = 0.8 * np.sin(2 * math.pi * self.t / periods)
        self.t += 1
        return a.astype(np.float32)


class HopperSway:
    """A slow sinusoidal sway of Hopper's thigh, leg and foot (period 24 steps) with damping on the
    joint velocities: a deterministic controller unlike the logs' held random torques. Like them it
    does not balance the hopper, so its episodes end in falls too."""

    def __init__(self):
        self.t = 0
        self.phase = np.array([0.0, 1.0, 2.0])

    def reset(self, seed: int) -> None:
        self.t = 0

    def __call__(self, obs) -> np.ndarray:
        a = 0.5 * np.sin(2 * math.pi * self.t / 24 + self.phase) - 0.1 * np.asarray(obs[8:11], float)
        self.t += 1
        return np.clip(a, -1, 1).astype(np.float32)


def _step_linearisation(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) of one env step (frame_skip MuJoCo steps, command held) about the upright rest state
    with no command, by central differences on the nominal model: x = (qpos, qvel)."""
    import gymnasium as gym
    import mujoco

    env = gym.make(env_id).unwrapped
    m, d = env.model, mujoco.MjData(env.model)
    n = m.nq + m.nv

    def step(x, u):
        d.qpos[:], d.qvel[:], d.ctrl[:], d.time = x[: m.nq], x[m.nq :], u, 0.0
        for _ in range(env.frame_skip):
            mujoco.mj_step(m, d)
        return np.concatenate([d.qpos, d.qvel])

    eps, x0, u0 = 1e-5, np.zeros(n), np.zeros(m.nu)
    A = np.stack([(step(x0 + eps * e, u0) - step(x0 - eps * e, u0)) / (2 * eps) for e in np.eye(n)], 1)
    B = np.stack([(step(x0, u0 + eps * e) - step(x0, u0 - eps * e)) / (2 * eps) for e in np.eye(m.nu)], 1)
    env.close()
    return A, B


def delayed_lqr_gain(A: np.ndarray, B: np.ndarray, q, r: float, delay: int) -> np.ndarray:
    """The discrete LQR gain K (u = -K z) of x' = A x + B u when a command acts `delay` steps after it
    is sent: z = (x, the `delay` commands sent and not yet acting, oldest first). The Riccati
    equation is iterated to its fixed point (no scipy)."""
    n, mu = A.shape[0], B.shape[1]
    N = n + delay * mu
    Az, Bz = np.zeros((N, N)), np.zeros((N, mu))
    Az[:n, :n] = A
    if delay:
        Az[:n, n : n + mu] = B  # the oldest pending command acts now
        for i in range(delay - 1):  # the queue moves up by one
            Az[n + i * mu : n + (i + 1) * mu, n + (i + 1) * mu : n + (i + 2) * mu] = np.eye(mu)
        Bz[N - mu :] = np.eye(mu)
    else:
        Bz[:n] = B
    Q = np.zeros((N, N))
    Q[:n, :n] = np.diag(q)
    R, P = r * np.eye(mu), Q.copy()
    for _ in range(5000):
        K = np.linalg.solve(R + Bz.T @ P @ Bz, Bz.T @ P @ Az)
        P_new = Az.T @ P @ Az - Az.T @ P @ Bz @ K + Q
        if np.allclose(P_new, P, rtol=1e-10, atol=1e-12):
            break
        P = P_new
    return K


class DoublePendulumLQR:
    """A balancing controller for InvertedDoublePendulum: LQR on the nominal model's linearisation,
    designed for one step of command latency (the controller remembers the command it sent), plus a
    random excitation of +-`amp` held `hold` steps. The engineers' controller: it balances the
    reality most of the time, and a simulator that differs falls sooner (its episodes end early)."""

    ENV = "InvertedDoublePendulum-v5"
    DELAY = 1
    _linear: tuple | None = None  # (A, B), computed once per process

    def __init__(self, amp: float = 0.07, hold: int = 5, q=(1, 50, 50, 1, 5, 5), r: float = 1.0):
        if DoublePendulumLQR._linear is None:
            DoublePendulumLQR._linear = _step_linearisation(self.ENV)
        self.K = delayed_lqr_gain(*DoublePendulumLQR._linear, q, r, self.DELAY)[0]
        self.amp, self.hold = amp, hold
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.t, self.excitation, self.pending = 0, 0.0, [0.0] * self.DELAY

    def __call__(self, obs) -> np.ndarray:
        if self.t % self.hold == 0:
            self.excitation = float(self.rng.uniform(-self.amp, self.amp))
        self.t += 1
        o = np.asarray(obs, float)  # x, sin(th1), sin(th2), cos(th1), cos(th2), 3 velocities, constraint
        z = np.array([o[0], math.atan2(o[1], o[3]), math.atan2(o[2], o[4]), *o[5:8], *self.pending])
        u = float(np.clip(-self.K @ z + self.excitation, -1.0, 1.0))
        self.pending = self.pending[1:] + [u]
        return np.array([u], np.float32)


CONTROLLERS = {
    "pendulum_pd": lambda: pendulum_pd,
    "cheetah_gait": CheetahGait,
    "pusher_sweep": PusherSweep,
    "hopper_sway": HopperSway,
    "idp_lqr": DoublePendulumLQR,  # the double pendulum's logs: excitation 0.07 held 5 steps
    "idp_lqr_slow": lambda: DoublePendulumLQR(amp=0.07, hold=15),  # slower excitation
    "idp_lqr_stiff": lambda: DoublePendulumLQR(amp=0.02, hold=5, q=(1, 100, 100, 1, 1, 1), r=0.1),
}


def make_policy(spec: str):
    """A behaviour policy spec (random, hold:K) or "controller:<key>"."""
    return CONTROLLERS[spec.split(":", 1)[1]]() if spec.startswith("controller:") else spec


# ---- systems ---------------------------------------------------------------------------------------


@dataclass
class SystemSpec:
    """One system: its reality, real logs, world model and how many checks of each family."""

    name: str
    env_id: str
    reality: dict  # RealityProfile fields: the real system relative to the nominal simulator (noise included)
    dynamics_param: str  # physical parameter the dynamics variants scale
    dynamics_sizes: tuple[float, ...]  # relative changes (scale 1 + size, on top of reality's)
    controller: str  # key of CONTROLLERS
    episodes: int = 48  # real episodes (train + held out)
    max_steps: int = 200
    policy: str = "hold:5"  # exciting behaviour policy of the real logs
    other_policies: tuple[str, ...] = ("hold:2",)  # other excitation for faithful controls (+ the controller)
    episode_counts: tuple[int, ...] = (4, 32)  # other checked-episode counts for faithful controls
    termination_bounds: list | None = None  # per channel |obs| bound of the early-ending simulator (None: no row)
    ending_steps: tuple[int, ...] = (40,)  # time limits shorter than a block (truncated, not terminated)
    run_on_bounds: list | None = None  # the env's termination dropped, these |obs| bounds instead: the simulator
    # that ends later; given, the family also gets one with no termination at all (None: neither)
    preset: str = "debug"
    steps: int = 3000
    batch_size: int = 32
    seq_len: int = 32
    lr: float = 1e-3
    warmup: int = 100
    val_fraction: float = 0.3  # 48 episodes: 16 held out, 24 blocks per power half
    check_episodes: int = 6  # episodes per checked simulator
    controls: int = 10  # faithful simulators under the logs' policy (new seeds)
    other_controls: int = 3  # faithful simulators per other condition
    deterministic_reps: int = 2  # checks per deterministic row
    reps: int = 1  # checks per perturbation gap type and size
    ending_reps: int = 1
    sizes: dict = field(
        default_factory=lambda: {g: tuple(POWER_SIZES[g]) for g in ("latency", "actuator", "sensor_noise")}
    )

    def gap_sizes(self) -> dict[str, tuple]:
        return {**{g: tuple(s) for g, s in self.sizes.items()}, "dynamics": tuple(self.dynamics_sizes)}


PENDULUM = SystemSpec(
    "pendulum",
    "Pendulum-v1",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.85,
        "sensor_noise_std": [0.02, 0.02, 0.1],
        "process_noise_std": 0.2,
        "physics": {"m": {"scale": 1.2}},
    },
    # Gravity, not mass: Pendulum-v1's mass only divides the torque term, so a mass change is an
    # actuator gain in disguise (a first run with m measured exactly that); g acts on the unforced motion.
    dynamics_param="g",
    dynamics_sizes=(0.05, 0.1, 0.25, 0.5),
    controller="pendulum_pd",
    termination_bounds=[None, None, 2.0],  # the simulator's pendulum "trips" at |theta_dot| > 2 rad/s
    check_episodes=8,
    controls=12,
    other_controls=3,
    reps=2,
)
HALFCHEETAH = SystemSpec(
    "halfcheetah",
    "HalfCheetah-v5",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.9,
        "sensor_noise_std": 0.02,
        "process_noise_std": 0.1,
        "physics": {"dof_damping": {"scale": 1.3}},
    },
    dynamics_param="dof_damping",
    dynamics_sizes=(0.25, 0.5, 1.0, 2.0),
    controller="cheetah_gait",
    episodes=60,
    max_steps=400,
    preset="size1m",
    steps=3000,
    batch_size=16,
    seq_len=64,
    check_episodes=4,
)
PUSHER = SystemSpec(
    "pusher",
    "Pusher-v5",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.9,
        "sensor_noise_std": 0.01,
        "process_noise_std": 0.1,
        "physics": {"dof_damping": {"scale": 1.5}},
    },
    dynamics_param="dof_damping",
    dynamics_sizes=(0.25, 0.5, 1.0, 2.0),
    controller="pusher_sweep",
    # Pusher-v5 ends its episodes at 100 steps (its time limit), so 60 episodes were 4,200 training
    # steps: the size1m model overfitted (validation loss 142 against -16 on training windows) and
    # predicted worse than ARX at every horizon (docs/benchmarks.md, twenty-fifth session)
    episodes=200,
    max_steps=100,
    preset="size1m",
    steps=3000,
    batch_size=16,
    seq_len=64,
    check_episodes=6,
)

DOUBLE_PENDULUM = SystemSpec(
    "double_pendulum",
    "InvertedDoublePendulum-v5",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.9,
        "sensor_noise_std": 0.005,
        "process_noise_std": 0.02,
        "physics": {"body_mass": {"scale": 1.05}},
    },
    # Gravity acts on the poles' unforced motion; every body's mass would also scale the cart's
    # response to the command (an actuator gain in disguise, as Pendulum's m was).
    dynamics_param="opt.gravity",
    dynamics_sizes=(0.05, 0.1, 0.25, 0.5),
    controller="idp_lqr_stiff",
    # A closed loop that balances: the logs come from the engineers' LQR with a small excitation
    # (about 1 real episode in 4 falls before its 200 steps), and most gapped simulators fall within
    # 10-40 steps, so their episodes end early: the check must speak from what short episodes allow.
    policy="controller:idp_lqr",
    other_policies=("controller:idp_lqr_slow",),
    # runs on: no fall detection at all; ends later: it ends only once the lower pole has tilted past
    # about 72 degrees (|sin theta1| > 0.95; reality's falls end at |sin theta1| <= 0.91)
    run_on_bounds=[None, 0.95] + [None] * 7,
    ending_reps=2,
    episodes=120,
    max_steps=200,
    check_episodes=8,
    controls=10,
    other_controls=3,
    reps=1,
)


HOPPER = SystemSpec(
    "hopper",
    "Hopper-v5",
    reality={
        "latency_steps": 1,
        "actuator_gain": 0.9,
        "sensor_noise_std": 0.01,
        "process_noise_std": 0.05,
        "physics": {"body_mass": {"scale": 1.1}},
    },
    # Gravity acts on the unforced fall; a mass change would also scale the joints' response to
    # the torques (an actuator gain in disguise).
    dynamics_param="opt.gravity",
    dynamics_sizes=(0.05, 0.1, 0.25, 0.5),
    controller="hopper_sway",
    # runs on: no fall detection at all; ends later: only once the torso tilts past 0.4 rad (the
    # env's own healthy range is |angle| < 0.2)
    run_on_bounds=[None, 0.4] + [None] * 9,
    # Under held random torques the hopper falls within 7-40 steps (median 15): episodes far
    # shorter than a block of 16 + 48, which calibration fits to about 8 + 8 (datasets.windows.
    # fitted_geometry: 9 + 8 on the benchmark's log, whose held-out median is 17 steps). Many
    # real episodes are needed for data: 400 of them are about 7,000 steps.
    episodes=400,
    max_steps=200,
    episode_counts=(8, 64),
    ending_steps=(),
    steps=4000,
    check_episodes=16,
    controls=10,
    other_controls=3,
    reps=1,
)


def quick(spec: SystemSpec) -> SystemSpec:
    """A ~2-minute version (smoke test): tiny logs and model, one size per gap type, one check per row."""
    return dataclasses.replace(
        spec,
        episodes=20,
        max_steps=200,
        preset="debug",
        steps=30,
        batch_size=8,
        seq_len=16,
        warmup=5,
        val_fraction=0.6,
        check_episodes=4,
        controls=2,
        other_controls=1,
        other_policies=(),
        episode_counts=(),
        deterministic_reps=1,
        reps=1,
        ending_steps=(),
        sizes={g: (s[-1],) for g, s in spec.sizes.items()},
        dynamics_sizes=spec.dynamics_sizes[-1:],
    )


# ---- checked simulators -----------------------------------------------------------------------------


@dataclass
class CheckJob:
    """One checked simulator: how to record it and what it truly differs in."""

    system: str
    family: str  # deterministic | perturbation | control | ending
    name: str
    profile: dict
    policy: str  # a behaviour policy spec, or "controller:<key>"
    seed: int
    truth: tuple[str, ...] = ()  # the gap types it truly has (empty: faithful)
    condition: str = ""  # what is special about it (policy, episode count, size, ...)
    gap: str | None = None  # perturbation: the gap made larger
    size: float | None = None
    episodes: int | None = None  # checked episodes (None: the system's check_episodes)
    max_steps: int | None = None  # steps per episode (None: the system's max_steps)


def _scaled(value, factor):
    """A per-channel value (None = 1, number or list) times `factor`."""
    if value is None:
        value = 1.0
    return [v * factor for v in value] if isinstance(value, list) else value * factor


def variant(reality: RealityProfile, gap: str, size: float, obs_std: np.ndarray, param: str) -> RealityProfile:
    """The reality's profile with one gap made larger by `size`: latency + size steps; actuator gain
    / size (commands lose effect); sensor noise of size x each channel's std on top of reality's;
    the physical parameter scaled by 1 + size."""
    r = reality
    if gap == "latency":
        kw = {"latency_steps": r.latency_steps + size}
    elif gap == "actuator":
        kw = {"actuator_gain": _scaled(r.actuator_gain, 1.0 / size)}
    elif gap == "sensor_noise":
        base = np.broadcast_to(
            np.asarray(0.0 if r.sensor_noise_std is None else r.sensor_noise_std, float), obs_std.shape
        )
        kw = {"sensor_noise_std": np.sqrt(base**2 + (size * obs_std) ** 2).tolist()}  # independent noise adds variances
    elif gap == "dynamics":
        physics = dict(r.physics)
        old = physics.get(param, {"scale": 1.0})
        physics[param] = {"scale": _scaled(old["scale"], 1.0 + size)}
        kw = {"physics": physics}
    else:
        raise ValueError(f"unknown gap {gap!r}")
    return dataclasses.replace(r, **kw, name=f"{gap}={size:g}")


def deterministic(reality: RealityProfile) -> RealityProfile:
    """The reality's twin without sensor or process noise: what an engineering simulator is."""
    return dataclasses.replace(reality, sensor_noise_std=None, process_noise_std=None, name="deterministic twin")


def jobs_for(spec: SystemSpec, reality: RealityProfile, obs_std: np.ndarray) -> list[CheckJob]:
    """Every checked simulator of every family, with its truth."""
    return (
        _controls(spec, reality)
        + _deterministic(spec, reality)
        + _perturbations(spec, reality, obs_std)
        + _other_policy_gaps(spec, reality, obs_std)
        + _endings(spec, reality)
    )


def _other_policies(spec: SystemSpec) -> list[str]:
    """The policies other than the logs': other excitation, then the closed-loop controller."""
    return [*spec.other_policies, f"controller:{spec.controller}"]


def _controls(spec: SystemSpec, reality: RealityProfile) -> list[CheckJob]:
    jobs = []

    def add(k, condition, policy, seed, episodes=None):
        prof = dataclasses.replace(reality, seed=1000 + len(jobs), name=f"faithful ({condition})")
        jobs.append(
            CheckJob(
                spec.name,
                "control",
                f"control{len(jobs)}",
                prof.to_dict(),
                policy,
                seed,
                condition=condition,
                episodes=episodes,
            )
        )

    for k in range(spec.controls):
        add(k, f"logs' policy {spec.policy}", spec.policy, 10_000 + 100 * k)
    others = _other_policies(spec) if spec.other_policies or spec.episode_counts else []
    for j, pol in enumerate(others):
        for k in range(spec.other_controls):
            add(k, f"policy {pol.replace('controller:', 'controller ')}", pol, 20_000 + 1000 * j + 100 * k)
    for n in spec.episode_counts:
        for k in range(spec.other_controls if n <= spec.check_episodes * 2 else 1):
            add(k, f"{n} episodes", spec.policy, 25_000 + 100 * n + k, episodes=n)
    return jobs


def _deterministic(spec: SystemSpec, reality: RealityProfile) -> list[CheckJob]:
    twin = deterministic(reality)
    physics = dict(twin.physics)
    rows = [("twin", twin, ("sensor_noise",))]
    for size in spec.dynamics_sizes:
        old = physics.get(spec.dynamics_param, {"scale": 1.0})
        biased = {**physics, spec.dynamics_param: {"scale": _scaled(old["scale"], 1.0 + size)}}
        rows.append((f"physics x{1 + size:g}", dataclasses.replace(twin, physics=biased), ("sensor_noise", "dynamics")))
    rows.append(("no latency", dataclasses.replace(twin, latency_steps=0), ("sensor_noise", "latency")))
    rows.append(("nominal", RealityProfile(), ("sensor_noise", "latency", "actuator", "dynamics")))
    jobs = []
    for i, (cond, prof, truth) in enumerate(rows):
        for rep in range(spec.deterministic_reps):
            p = dataclasses.replace(prof, seed=5000 + 10 * i + rep, name=f"deterministic {cond}")
            jobs.append(
                CheckJob(
                    spec.name,
                    "deterministic",
                    f"det{i}r{rep}",
                    p.to_dict(),
                    spec.policy,
                    50_000 + 100 * i + rep,
                    truth,
                    cond,
                )
            )
    return jobs


def _perturbations(spec: SystemSpec, reality: RealityProfile, obs_std: np.ndarray) -> list[CheckJob]:
    jobs = []
    for g, (gap, sizes) in enumerate(spec.gap_sizes().items()):
        for i, size in enumerate(sizes):
            for rep in range(spec.reps):
                base = dataclasses.replace(reality, seed=2000 + 100 * g + 10 * i + rep)
                prof = variant(base, gap, float(size), obs_std, spec.dynamics_param)
                jobs.append(
                    CheckJob(
                        spec.name,
                        "perturbation",
                        f"{gap}{i}r{rep}",
                        prof.to_dict(),
                        spec.policy,
                        30_000 + 1000 * g + 100 * i + 10 * rep,
                        (gap,),
                        f"{gap}={size:g}",
                        gap,
                        float(size),
                    )
                )
    return jobs


def _other_policy_gaps(spec: SystemSpec, reality: RealityProfile, obs_std: np.ndarray) -> list[CheckJob]:
    """The largest dynamics and actuator gaps checked under each other policy (another excitation,
    the closed-loop controller): what the policy rules (R4b, R4c) cost a check that only sees the
    simulator under another policy than the logs'."""
    jobs = []
    others = _other_policies(spec)
    sizes = spec.gap_sizes()
    for g, gap in enumerate(("dynamics", "actuator")):
        size = float(sizes[gap][-1])
        for j, pol in enumerate(others):
            base = dataclasses.replace(reality, seed=7000 + 100 * g + 10 * j)
            jobs.append(
                CheckJob(
                    spec.name,
                    "other_policy",
                    f"{gap}-pol{j}",
                    variant(base, gap, size, obs_std, spec.dynamics_param).to_dict(),
                    pol,
                    70_000 + 1000 * g + 100 * j,
                    (gap,),
                    f"{gap}={size:g} under {pol.replace('controller:', 'controller ')}",
                    gap,
                    size,
                )
            )
    return jobs


def _endings(spec: SystemSpec, reality: RealityProfile) -> list[CheckJob]:
    jobs = []
    if spec.termination_bounds is not None:
        for rep in range(spec.ending_reps):
            prof = dataclasses.replace(
                reality, seed=6000 + rep, termination_bounds=list(spec.termination_bounds), name="terminates early"
            )
            jobs.append(
                CheckJob(
                    spec.name,
                    "ending",
                    f"end-term-r{rep}",
                    prof.to_dict(),
                    spec.policy,
                    60_000 + rep,
                    ("ending",),
                    f"terminates when |obs| > {spec.termination_bounds}",
                )
            )
    if spec.run_on_bounds is not None:
        for rep in range(spec.ending_reps):
            for k, (bounds, label) in enumerate(((None, "runs on"), (list(spec.run_on_bounds), "ends later"))):
                prof = dataclasses.replace(
                    reality, seed=6200 + 10 * k + rep, ignore_termination=True, termination_bounds=bounds, name=label
                )
                how = "no termination" if bounds is None else f"terminates only when |obs| > {bounds}"
                jobs.append(
                    CheckJob(
                        spec.name,
                        "ending",
                        f"end-{'runon' if bounds is None else 'later'}-r{rep}",
                        prof.to_dict(),
                        spec.policy,
                        62_000 + 100 * k + rep,
                        ("ending",),
                        how,
                    )
                )
    for i, steps in enumerate(spec.ending_steps):
        for rep in range(spec.ending_reps):
            prof = dataclasses.replace(reality, seed=6100 + 10 * i + rep, name=f"cut after {steps} steps")
            jobs.append(
                CheckJob(
                    spec.name,
                    "ending",
                    f"end-cut{i}r{rep}",
                    prof.to_dict(),
                    spec.policy,
                    61_000 + 100 * i + rep,
                    (),
                    f"time limit {steps} steps (no block)",
                    max_steps=steps,
                )
            )
    return jobs
