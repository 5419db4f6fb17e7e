"""The guard's block statistics, and a second process that computes them off the control path.

Owns `block_statistics` (one block's open-loop divergence, scored exactly as the check scores a
block, and its corrections' scores: the gradient of the attribution objective at the identity,
checks/sysid.py) and `BlockWorker`, which runs it in a spawned process.

Why a process: the two statistics take 100-200 ms per block for the `debug` model on this 2-core
CPU (docs/benchmarks.md, twentieth session), every `horizon` steps, where the one-step filter
takes about 1.5 ms. Inside `Guard.act` that is one step in 48 that misses any deadline shorter
than the block's cost. A thread would not help: the small model's time is mostly Python, under
the interpreter lock. The worker loads the run once (its own copy of the model and calibration),
takes blocks from a queue and returns their statistics; the guard applies each result at the
first step after it arrives, and waits for the last ones when the episode ends. The values are
those the guard would compute in-process (the same function, the same seed); what changes is the
step at which a block's test is decided.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from pathlib import Path

import numpy as np


def block_statistics(
    model, cal, norm, obs: np.ndarray, acts: np.ndarray, open_loop: bool, corrections: bool, seed: int
) -> tuple[float | None, np.ndarray | None]:
    """(open-loop divergence, corrections' scores (p,)) of the block of observations obs (L, D) and
    the actions applied between them acts (L - 1, A), physical units; None for a statistic that is off."""
    import torch

    from wmcheck.checks import sysid
    from wmcheck.checks.blocks import make_blocks
    from wmcheck.datasets.episode import Episode

    episode = Episode(np.asarray(obs, np.float32), np.asarray(acts, np.float32), id=0)
    blocks = make_blocks([episode], norm, cal.config.context, cal.config.horizon)
    # scoring seeds torch's global generator; fork it, so that the caller's draws (the guard's
    # one-step filter) go on as if no block had been scored, in this process as in the worker
    with torch.random.fork_rng(devices=[]):
        div = float(cal.score(model, blocks, seed).divergence[0]) if open_loop else None
        grad = None
        if corrections:
            layout = cal.sysid.layout
            data = sysid.FitData.of([episode], blocks, norm, layout)
            ev = sysid.evaluate(
                model, data, np.zeros(len(layout)), layout, cal.config.context, sysid.ATTRIBUTION_HORIZON
            )
            grad = np.asarray(ev.grad[0], float)
    return div, grad


def _serve(run_dir: str, seed: int, open_loop: bool, corrections: bool, threads: int, tasks, results) -> None:
    """The worker process: load the run, then score blocks until a None task."""
    try:
        import torch

        torch.set_num_threads(threads)
        from wmcheck.checks.calibration import load_calibrated
        from wmcheck.datasets.normalize import Normalizer

        bundle, cal = load_calibrated(Path(run_dir), one_model_for="the runtime guard")
        model, norm = bundle.model.eval(), Normalizer.from_dict(bundle.normalizer)
    except Exception:  # noqa: BLE001 - reported to the guard, which raises it
        results.put(("error", None, traceback.format_exc()))
        return
    while (task := tasks.get()) is not None:
        key, obs, acts = task
        try:
            results.put((key, block_statistics(model, cal, norm, obs, acts, open_loop, corrections, seed), None))
        except Exception:  # noqa: BLE001
            results.put(("error", None, traceback.format_exc()))


class BlockWorker:
    """A spawned process that computes `block_statistics` for blocks `submit`ted to it; `poll`
    returns the results that have arrived, `drain` waits for all of them."""

    def __init__(self, run_dir: str | Path, seed: int, open_loop: bool, corrections: bool, threads: int = 1):
        ctx = mp.get_context("spawn")  # torch is not fork-safe once its threads have started
        self._tasks, self._results = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(
            target=_serve,
            args=(str(run_dir), seed, open_loop, corrections, threads, self._tasks, self._results),
            daemon=True,
        )
        self._proc.start()
        self.pending = 0

    def submit(self, key, obs: np.ndarray, acts: np.ndarray) -> None:
        self._tasks.put((key, np.asarray(obs, np.float32), np.asarray(acts, np.float32)))
        self.pending += 1

    def poll(self) -> list:
        """[(key, (divergence, scores))] of the blocks finished since the last call, without waiting."""
        out = []
        while self.pending:
            try:
                out.append(self._take(self._results.get_nowait()))
            except queue.Empty:
                break
        return out

    def drain(self, timeout: float = 600.0) -> list:
        """Every pending result, waiting up to `timeout` seconds for each."""
        out = []
        while self.pending:
            try:
                out.append(self._take(self._results.get(timeout=timeout)))
            except queue.Empty:
                raise RuntimeError(
                    f"the guard's block worker returned nothing in {timeout:.0f} s (alive: {self._proc.is_alive()})"
                ) from None
        return out

    def _take(self, item):
        key, stats, error = item
        if key == "error":
            raise RuntimeError(f"the guard's block worker failed:\n{error}")
        self.pending -= 1
        return key, stats

    def close(self) -> None:
        if self._proc.is_alive():
            self._tasks.put(None)
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()
