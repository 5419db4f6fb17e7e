"""Per-channel normalisation of observations, actions and exogenous inputs: the one place it happens.

`Normalizer.fit(episodes)` streams over the TRAINING episodes once (Chan et al.'s parallel update
of count, mean and sum of squared deviations, in float64) and stores mean and std per channel.
A channel whose std is numerically zero (max == min, or std <= 1e-8 * max(1, |mean|)) gets std 1,
so it maps to 0 instead of blowing up, and is listed in `constant_channels` as "<kind>/<name>".

The normaliser is saved with the model (`to_dict()` is JSON-safe; `from_dict()` rejects missing
or malformed statistics: never a silent pass-through). `norm_*`/`denorm_*` accept numpy arrays or
torch tensors of shape (..., C) and raise ValueError when C does not match the statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from wmcheck.datasets.episode import Episode, LogMeta

NORMALIZER_VERSION = 1
KINDS = ("obs", "action", "input")
_KIND_LABEL = {"obs": "observations", "action": "actions", "input": "inputs"}


class _Running:
    """Streaming count / mean / M2 / min / max per channel (Chan's parallel algorithm)."""

    def __init__(self, dim: int):
        self.n = 0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)
        self.min = np.full(dim, np.inf)
        self.max = np.full(dim, -np.inf)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64)  # (rows, C)
        if x.shape[0] == 0:
            return
        nb = x.shape[0]
        mb = x.mean(0)  # (C,)
        m2b = ((x - mb) ** 2).sum(0)  # (C,)
        delta = mb - self.mean
        total = self.n + nb
        self.mean = self.mean + delta * nb / total
        self.m2 = self.m2 + m2b + delta**2 * self.n * nb / total
        self.n = total
        self.min = np.minimum(self.min, x.min(0))
        self.max = np.maximum(self.max, x.max(0))


class Normalizer:
    """Mean/std per channel for observations (D), actions (A) and inputs (E; may be 0)."""

    def __init__(
        self,
        stats: dict[str, tuple[np.ndarray, np.ndarray]],
        names: dict[str, list[str]] | None = None,
        constant_channels: list[str] | None = None,
        ranges: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ):
        problems = []
        self.mean: dict[str, np.ndarray] = {}
        self.std: dict[str, np.ndarray] = {}
        for kind in KINDS:
            if kind not in stats:
                problems.append(f"no {_KIND_LABEL[kind]} statistics")
                continue
            mean = np.asarray(stats[kind][0], np.float32).reshape(-1)  # (C,)
            std = np.asarray(stats[kind][1], np.float32).reshape(-1)  # (C,)
            if mean.shape != std.shape:
                problems.append(f"{kind} mean {mean.shape} and std {std.shape} differ in shape")
            elif not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
                problems.append(f"{kind} statistics must be finite with std > 0")
            self.mean[kind], self.std[kind] = mean, std
        if problems:
            raise ValueError(
                "invalid normaliser: " + "; ".join(problems) + " (fit it on the training episodes with Normalizer.fit)"
            )
        names = names or {}
        self.names = {k: list(names.get(k) or [f"{k}_{i}" for i in range(self.dim(k))]) for k in KINDS}
        self.constant_channels = list(constant_channels or [])
        # Training min / max per channel (None for normalisers saved before they were kept): the
        # operating range the model has seen, which the checks compare checked conditions with.
        self.range: dict[str, tuple[np.ndarray, np.ndarray] | None] = {
            k: (
                (np.asarray(ranges[k][0], np.float64).reshape(-1), np.asarray(ranges[k][1], np.float64).reshape(-1))
                if ranges and k in ranges
                else None
            )
            for k in KINDS
        }

    def dim(self, kind: str) -> int:
        return int(self.mean[kind].shape[0])

    @property
    def dims(self) -> tuple[int, int, int]:
        """(D, A, E)."""
        return self.dim("obs"), self.dim("action"), self.dim("input")

    # --- fitting ------------------------------------------------------------------------------
    @classmethod
    def fit(cls, episodes: Iterable[Episode], meta: LogMeta | None = None) -> Normalizer:
        """Fit on training episodes, streaming; each episode is touched once."""
        run: dict[str, _Running] | None = None
        for ep in episodes:
            arrays = {"obs": ep.observations, "action": ep.actions, "input": ep.input_array()}
            if run is None:
                run = {k: _Running(np.asarray(x).shape[1]) for k, x in arrays.items()}
            for kind, x in arrays.items():
                x = np.asarray(x)
                if x.ndim != 2 or x.shape[1] != run[kind].mean.shape[0]:
                    raise ValueError(
                        f"episode {ep.id}: {_KIND_LABEL[kind]} shape {x.shape} does not "
                        f"match the first episode's {run[kind].mean.shape[0]} columns"
                    )
                if not np.isfinite(x).all():
                    raise ValueError(
                        f"episode {ep.id}: {_KIND_LABEL[kind]} contain NaN/inf; "
                        "run `wmcheck validate` and fix the log first"
                    )
                run[kind].update(x)
        if run is None or run["obs"].n == 0:
            raise ValueError("cannot fit a normaliser on zero training episodes")
        names = {}
        if meta is not None:
            names = {"obs": meta.observation_names, "action": meta.action_names, "input": meta.input_names}
        stats, constant, ranges = {}, [], {}
        for kind, r in run.items():
            if r.n > 0:
                ranges[kind] = (r.min, r.max)
            std = np.sqrt(r.m2 / max(r.n, 1))  # (C,) population std
            const = (r.max <= r.min) | (std <= 1e-8 * np.maximum(1.0, np.abs(r.mean)))
            if r.n == 0:  # e.g. only zero-step episodes: no action rows
                const[:] = True
            std = np.where(const, 1.0, std)
            mean = np.where(r.n > 0, r.mean, 0.0)
            stats[kind] = (mean, std)
            kind_names = names.get(kind) or [f"{kind}_{i}" for i in range(len(mean))]
            constant += [f"{_KIND_LABEL[kind]}/{kind_names[j]}" for j in np.flatnonzero(const)]
        return cls(stats, names, constant, ranges)

    # --- applying -----------------------------------------------------------------------------
    def _stats_like(self, kind: str, x):
        mean, std = self.mean[kind], self.std[kind]
        if x.shape[-1] != mean.shape[0]:
            raise ValueError(
                f"{_KIND_LABEL[kind]} have {x.shape[-1]} channels (shape {tuple(x.shape)}) "
                f"but the normaliser was fitted on {mean.shape[0]}"
            )
        if isinstance(x, np.ndarray):
            return mean, std
        import torch  # a tensor: keep device and dtype

        return (
            torch.as_tensor(mean, device=x.device, dtype=x.dtype),
            torch.as_tensor(std, device=x.device, dtype=x.dtype),
        )

    def _norm(self, kind: str, x):
        x = np.asarray(x, np.float32) if not hasattr(x, "device") else x
        mean, std = self._stats_like(kind, x)
        return (x - mean) / std

    def _denorm(self, kind: str, x):
        x = np.asarray(x, np.float32) if not hasattr(x, "device") else x
        mean, std = self._stats_like(kind, x)
        return x * std + mean

    def norm_obs(self, x):
        return self._norm("obs", x)

    def denorm_obs(self, x):
        return self._denorm("obs", x)

    def norm_action(self, x):
        return self._norm("action", x)

    def denorm_action(self, x):
        return self._denorm("action", x)

    def norm_input(self, x):
        return self._norm("input", x)

    def denorm_input(self, x):
        return self._denorm("input", x)

    # --- saving -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": NORMALIZER_VERSION,
            **{
                kind: {
                    "mean": self.mean[kind].tolist(),
                    "std": self.std[kind].tolist(),
                    "names": self.names[kind],
                    **(
                        {"min": self.range[kind][0].tolist(), "max": self.range[kind][1].tolist()}
                        if self.range[kind] is not None
                        else {}
                    ),
                }
                for kind in KINDS
            },
            "constant_channels": list(self.constant_channels),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Normalizer:
        if int(d.get("version", -1)) != NORMALIZER_VERSION:
            raise ValueError(f"normaliser version {d.get('version')!r} is not {NORMALIZER_VERSION}")
        missing = [f"{k}.{f}" for k in KINDS for f in ("mean", "std") if f not in d.get(k, {})]
        if missing:
            raise ValueError(f"normaliser statistics missing: {', '.join(missing)}")
        ranges = {k: (d[k]["min"], d[k]["max"]) for k in KINDS if "min" in d[k] and "max" in d[k]}
        return cls(
            {k: (d[k]["mean"], d[k]["std"]) for k in KINDS},
            {k: d[k].get("names") for k in KINDS},
            d.get("constant_channels", []),
            ranges or None,
        )
