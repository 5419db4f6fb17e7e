"""The three steps of wmcheck as functions: `train` (and calibrate), `calibrate`, `check`.

Owns turning Python arguments into the configs and calls the command line makes: the CLI's
subcommands (`scripts/cmd_train.py`, `cmd_calibrate.py`, `cmd_check.py`) parse their options and
call these, then print. Everything heavy is imported inside the functions (`import wmcheck` stays
cheap).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wmcheck.datasets.errors import UserError

PathLike = str | os.PathLike


def train(
    log: PathLike,
    out: PathLike,
    *,
    resume: bool = True,
    calibrate: bool = True,
    ensemble: int = 1,
    check_options: dict | None = None,
    on_trained: Callable[[Any], None] | None = None,
    notes: Callable[[str], None] | None = None,
    **options: Any,
):
    """Train a world model on the real log `log` (a wmcheck log, or a Minari dataset folder or id)
    into the run folder `out`, then calibrate it (unless `calibrate=False` or no episode is held
    out). `options` are `TrainConfig` fields (max_steps, lr, preset, batch_size, ...; see `wmcheck
    train --help` for each and its default); `check_options` are `CheckConfig` fields for the
    calibration (alpha, horizon, context, ...). `on_trained(result)` runs between training and
    calibration (the CLI prints its summary there); `notes(text)` receives warnings about the data
    (a log marked as simulated used as reality; default: `warnings.warn`).
    Returns the `training.run.TrainResult` (run_dir, model_path, steps, quality card, ...)."""
    from wmcheck.datasets.importers.minari_source import reality_warning, resolve_dataset
    from wmcheck.training.config import TrainConfig
    from wmcheck.training.run import build_run_config
    from wmcheck.training.run import train as run_training

    log = resolve_dataset(log)  # a Minari folder or id is its main_data.hdf5, as for `import`
    if not Path(log).exists():
        raise UserError(
            f"log file {log} does not exist", "check the path; create logs with `wmcheck import` or `wmcheck record`"
        )
    try:
        tcfg = TrainConfig(**options)
        rc = build_run_config(tcfg, ensemble=ensemble)
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad training option: {exc}", "see `wmcheck train --help` for the options") from None
    ccfg = _check_config(check_options)  # a bad alpha / horizon is refused before training
    simulated = reality_warning(log)  # train learns reality: say so when the log is a simulator's
    if simulated:
        (notes or (lambda text: warnings.warn(text, stacklevel=3)))(simulated)
    if tcfg.folds:  # cross-fitting: one model per fold, `on_trained` after each (training/crossfit.py)
        from wmcheck.training.crossfit import train_folds

        result = train_folds(log, out, rc, resume=resume, on_fold=on_trained)
        if not result.global_zero:
            return result
    else:
        result = run_training(log, out, rc, resume=resume)
        if not result.global_zero:  # another process of a multi-device run: rank 0 reports and calibrates
            return result
        if on_trained is not None:
            on_trained(result)
    if calibrate and (tcfg.val_fraction > 0 or tcfg.folds):
        from wmcheck.checks.calibration import calibrate as run_calibration

        run_calibration(out, log, ccfg)
    return result


def calibrate(run_dir: PathLike, log: PathLike | None = None, *, real: list | tuple = (), **check_options: Any):
    """Score the held-out real episodes of `run_dir`'s model (plus every episode of the `real` logs,
    which must be disjoint from the training episodes) and store the nulls, competence bounds and
    power table. `check_options` are `CheckConfig` fields. Returns the `Calibration`."""
    from wmcheck.checks.calibration import calibrate as run_calibration

    return run_calibration(run_dir, log, _check_config(check_options), extra_real=[Path(p) for p in real])


def check(
    run_dir: PathLike,
    out: PathLike | None = None,
    *,
    rollouts: PathLike | None = None,
    env: Any = None,
    policy: Any = None,
    success: Any = None,
    episodes: int | None = None,
    max_steps: int | None = None,
    env_kwargs: dict | None = None,
    render: str | tuple[int, int] | None = None,
    gate: Any = None,
    allow_unverifiable: bool = False,
    seed: int = 0,
    policy_samples: int = 8,
    clip_model: PathLike | None = None,
    tensorboard: bool = True,
    command: str | None = None,
    checked_policy: str = "auto",
):
    """Check simulator rollouts against the model in `run_dir` and return the `Report`.

    Give either `rollouts` (a log of recorded simulator episodes) or `env` (a gymnasium id,
    "module:Class" or an `Env` instance) to record them now under `policy` ("random", "hold:K",
    "module:callable", an SB3 model or .zip, a TorchScript file, or any Python callable); a policy
    other than random / hold:K is also run closed loop in the model (the policy check), with
    `success` as its success rule. `gate` is a `Gate`, a gate file path or a mapping of its keys.
    With `out`, report.json, report.html and a TensorBoard run are written there (and the recorded
    rollouts as rollouts.h5); without, nothing is kept. `checked_policy`: "logs" where the checked
    commands come from the real logs' own controller, "other" where they come from another policy,
    "auto" (default) to let the policy-shift test decide (approximate on a closed loop)."""
    from wmcheck.checks.check import run_check
    from wmcheck.checks.policy_check import PolicyRun, is_policy
    from wmcheck.checks.report_write import public_report, write_outputs
    from wmcheck.report import Report

    gate = _gate(gate)
    if allow_unverifiable:
        gate.allow_unverifiable = True
    if (policy is not None or success is not None) and env is None:
        raise UserError(
            "a policy and a success rule need an env (the simulator to run the policy in)",
            "give --env ENV_ID (env=...), or check recorded rollouts with --rollouts alone",
        )
    if (rollouts is None) == (env is None):
        raise UserError("give one of rollouts and env", "pass --rollouts SIM.h5, or --env ID [--policy P] to record")
    checking_policy = policy is not None and is_policy(policy)
    if success is not None and not checking_policy:
        raise UserError(
            "--success applies to a policy check",
            "give --policy module:callable (or an SB3 model or a TorchScript file)",
        )
    if policy_samples < 2:
        raise UserError(f"--policy-samples must be >= 2, got {policy_samples}", "e.g. --policy-samples 8")
    scratch = None if out is not None else tempfile.TemporaryDirectory(prefix="wmcheck-check-")
    try:
        policy_run = None
        if env is not None:
            from wmcheck.datasets.record import parse_render_size, record_to_log

            rollouts = Path(out if out is not None else scratch.name) / "rollouts.h5"
            n = (
                episodes
                if episodes is not None
                else (int(gate.policy_requirement("min_episodes")) if checking_policy else 20)
            )
            outcomes: dict = {}
            record_to_log(
                rollouts,
                env,
                policy if policy is not None else "random",
                episodes=n,
                max_steps=max_steps,
                seed=seed,
                env_kwargs=env_kwargs,
                source="policy" if policy is not None else "sim",
                success=success,
                outcomes=outcomes,
                render=(parse_render_size(render) if isinstance(render, str) else render) if render else None,
            )
            if checking_policy:
                policy_run = PolicyRun(env, policy, env_kwargs, success, outcomes, samples=policy_samples)
        report = run_check(
            run_dir,
            rollouts,
            gate,
            command=command,
            seed=seed,
            policy=policy_run,
            clip_model=clip_model,
            checked_policy=checked_policy,
        )
        paths = write_outputs(report, out, tensorboard=tensorboard) if out is not None else {}
        # through JSON, so that the Report equals `load_report` of what was written
        return Report.from_dict(json.loads(json.dumps(public_report(report), allow_nan=False)), paths)
    finally:
        if scratch is not None:
            scratch.cleanup()


def _check_config(options: dict | None):
    from wmcheck.checks.config import CheckConfig

    try:
        return CheckConfig(**(options or {}))
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad calibration option: {exc}", "see `wmcheck calibrate --help` for the options") from None


def _gate(gate):
    from wmcheck.checks.config import Gate

    if gate is None:
        return Gate()
    if isinstance(gate, Gate):
        return gate
    if isinstance(gate, dict):
        return Gate.from_mapping(gate, "(a mapping from Python)")
    return Gate.load(gate)
