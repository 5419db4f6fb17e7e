"""Transformations of episodes: the corrections attribution tries and the gaps power injects.

Owns pure functions Episode -> Episode (raw units; nothing here knows the model):
  shift_drivers(ep, d)      commands and exogenous inputs u'[t] = u[t + d] (edges held): d > 0 feeds
                            the model the drivers d steps *later*, which is what reality sees when it
                            responds d steps later than the checked data (d steps of missing
                            latency); a response that lags the logged wind or speed is a latency gap
                            too, with or without command channels
  actuator(ep, c, ...)      commands of channel c through gain / offset / deadband (the arithmetic,
                            on any array of commands: actuator_values)
  actuator_correction(...)  one of those factors by name (what the attribution searches try)
  observation_noise(...)    add Gaussian noise or a bias to observation channels
  observation_scale(ep, f)  observations x f (a proportional bias: fuel use 10 % too high)
  observation_smoothing(ep, w)  centred moving average over w steps (a simulator cleaner than
                            reality: noise removed, with some of the fast dynamics)
and one function of cut blocks (checks.blocks.Blocks, normalised; it is affine, so the units do
not matter):
  horizon_motion(blocks, k) every block's open-loop part moves k times as far from its last
                            observed state as reality's did (a plant that responds more or less
                            to the same commands and conditions: the dynamics gap the power table
                            injects)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wmcheck.datasets.episode import Episode


def _replace(ep: Episode, **kw) -> Episode:
    return dataclasses.replace(ep, **kw)


def shift_drivers(ep: Episode, d: int) -> Episode:
    """The commands and the exogenous inputs shifted by d steps (module docstring)."""
    n = ep.num_steps
    if d == 0 or n == 0:
        return ep
    idx = np.clip(np.arange(n) + d, 0, n - 1)
    return _replace(ep, actions=ep.actions[idx], inputs=None if ep.inputs is None else ep.inputs[idx])


def deadband(a: np.ndarray, width: float) -> np.ndarray:
    """Zero inside [-width, width], shifted linear outside (continuous at the edges); a negative
    width is the inverse, every nonzero command moved |width| away from 0 (sysid's two-sided
    deadband parameter)."""
    if width == 0:
        return a
    if width < 0:
        return a + np.sign(a) * (-width)
    return np.sign(a) * np.maximum(np.abs(a) - width, 0.0)


def actuator_values(a: np.ndarray, gain: float = 1.0, offset: float = 0.0, band: float = 0.0) -> np.ndarray:
    """Commands (any shape, raw units) through the actuator model: deadband(a, band) * gain + offset,
    computed in float64 and returned as float32, as logs store commands."""
    if gain == 1.0 and offset == 0.0 and band == 0.0:
        return np.asarray(a, np.float32)
    return (deadband(np.asarray(a, np.float64), band) * gain + offset).astype(np.float32)


def actuator(ep: Episode, channel: int, gain: float = 1.0, offset: float = 0.0, band: float = 0.0) -> Episode:
    """Channel `channel` of the commands becomes deadband(a, band) * gain + offset (raw units)."""
    if gain == 1.0 and offset == 0.0 and band == 0.0:
        return ep
    a = ep.actions.astype(np.float32).copy()
    a[:, channel] = actuator_values(ep.actions[:, channel], gain, offset, band)
    return _replace(ep, actions=a)


def correction_kwargs(kind: str, value: float) -> dict:
    """`actuator`'s keyword for one factor: kind "gain" | "offset" | "deadband"."""
    return {"gain": dict(gain=value), "offset": dict(offset=value), "deadband": dict(band=value)}[kind]


def actuator_correction(ep: Episode, channel: int, kind: str, value: float) -> Episode:
    """One factor of `actuator`: kind "gain" | "offset" | "deadband" with its value (raw units for
    offset and deadband width)."""
    return actuator(ep, channel, **correction_kwargs(kind, value))


def observation_noise(
    ep: Episode, std: np.ndarray | None = None, bias: np.ndarray | None = None, rng: np.random.Generator | None = None
) -> Episode:
    """Observations + bias + N(0, std^2) per channel (arrays of shape (D,), raw units)."""
    obs = ep.observations.astype(np.float64).copy()  # (N+1, D)
    if bias is not None:
        obs += np.asarray(bias, float)[None, :]
    if std is not None:
        rng = rng or np.random.default_rng(0)
        obs += rng.normal(size=obs.shape) * np.asarray(std, float)[None, :]
    return _replace(ep, observations=obs.astype(np.float32))


def observation_scale(ep: Episode, factor: float) -> Episode:
    """Every observation channel x `factor` (a proportional bias of factor - 1)."""
    obs = ep.observations.astype(np.float64) * float(factor)
    return _replace(ep, observations=obs.astype(np.float32))


def observation_smoothing(ep: Episode, window: int) -> Episode:
    """Centred moving average of the observations over `window` steps (the window shrinks at the
    episode's ends, so the average never reads outside it)."""
    w = int(window)
    if w <= 1:
        return ep
    obs = ep.observations.astype(np.float64)  # (N+1, D)
    half = w // 2
    csum = np.concatenate([np.zeros((1, obs.shape[1])), np.cumsum(obs, 0)])  # (N+2, D)
    t = np.arange(len(obs))
    lo, hi = np.maximum(t - half, 0), np.minimum(t + half + 1, len(obs))
    out = (csum[hi] - csum[lo]) / (hi - lo)[:, None]
    return _replace(ep, observations=out.astype(np.float32))


def horizon_motion(blocks, factor: float):
    """The same blocks with every observation of the horizon (t >= C) moved to
    x[C-1] + factor * (x[t] - x[C-1]): the context, the controls and the episode layout stay real,
    and over the horizon the plant goes `factor` times as far from where the model last saw it as
    reality went (a faster, stiffer or less damped plant for factor > 1, a slower or more damped
    one below). Normalisation is affine per channel, so the same factor holds in raw units. Camera
    frames, where a log has them, stay real: the visual row is not simulated in the power table."""
    C = blocks.context
    obs = blocks.batch.obs.astype(np.float64)  # (n, L, D)
    anchor = obs[:, C - 1 : C]  # (n, 1, D) the last observed state
    obs[:, C:] = anchor + float(factor) * (obs[:, C:] - anchor)
    return blocks.with_observations(obs)
