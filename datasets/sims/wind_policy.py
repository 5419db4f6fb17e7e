"""A yaw/pitch rule controller for the wind-turbine simulator, designed in that simulator.

Owns `YawPitchPolicy`: what a controls engineer would write from the simulator alone.
- Yaw: when the wind direction relative to the nacelle exceeds a dead band, turn the nacelle
  onto the wind (the command is the new heading); otherwise hold the heading.
- Pitch: feathered (90 deg) at or above cut-out, idling (45 deg) below cut-in, fine pitch in
  partial load, and above rated the smallest pitch at which the simulator's power stays at
  rated, looked up from a table the policy computes from the simulator's own power model.
The controller sees the last 10-minute interval (the simulator's observation
[power, wind, relative direction, temperature, nacelle heading]).

`policy` is a ready instance for `module:callable` specs:
`wmcheck.datasets.sims.wind_policy:policy`.
"""

from __future__ import annotations

import numpy as np

from wmcheck.datasets.sims.wind_turbine import TurbineParams, turbine_power


class YawPitchPolicy:
    def __init__(
        self,
        params: TurbineParams | None = None,
        yaw_deadband_deg: float = 8.0,
        idle_pitch_deg: float = 45.0,
        feather_pitch_deg: float = 90.0,
        design_temperature_c: float = 10.0,
    ):
        self.params = params or TurbineParams()
        self.deadband = yaw_deadband_deg
        self.idle, self.feather = idle_pitch_deg, feather_pitch_deg
        self.wind_grid = np.arange(0.0, 30.01, 0.25)
        self.pitch_table = np.array([self._rated_pitch(v, design_temperature_c) for v in self.wind_grid])

    def _rated_pitch(self, wind: float, temperature: float) -> float:
        """Smallest pitch (bisection, 0.01 deg) at which the simulated power is below rated."""
        p = self.params
        lo, hi = p.fine_pitch_deg, 60.0
        if turbine_power(wind, 0.0, temperature, lo, p) < p.rated_kw - 1.0:
            return lo
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            if turbine_power(wind, 0.0, temperature, mid, p) >= p.rated_kw - 1.0:
                lo = mid
            else:
                hi = mid
        return hi

    def __call__(self, obs) -> np.ndarray:
        _, wind, rel, _, nacelle = (float(x) for x in np.asarray(obs, float)[:5])
        heading = (nacelle + rel) % 360.0 if abs(rel) > self.deadband else nacelle
        if wind >= self.params.cut_out_ms:
            pitch = self.feather
        elif wind < self.params.cut_in_ms:
            pitch = self.idle
        else:
            pitch = float(np.interp(wind, self.wind_grid, self.pitch_table))
        return np.array([pitch, heading], np.float32)


policy = YawPitchPolicy()
