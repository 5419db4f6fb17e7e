"""`wmcheck monitor`: new real logs, period by period, against the model and its calibration.

Owns the monitor's state folder and the order of a look; the statistics are drift.py's.
  1. the new real episodes (not already in the state, by content hash) are scored through the
     model, as a check scores blocks (scoring.score_blocks), and summarised per episode
     (drift.episode_features); episodes shorter than a block are listed, not scored;
  2. they are grouped into periods: N episodes each (`--period 5`), or calendar periods of their
     first timestamp (`--period 1d` / `12h` / `7d`, UTC, from the Unix epoch; whole weeks from Monday);
     a period is tested once complete (N episodes; the logs reach the calendar period's end), the
     rest waits in the state;
  3. each complete period is a look: every window (this period alone, the last W together) is
     tested against the reference (drift.window_test) at the level the budget gives it
     (drift.LookPlan), and the look gets its verdict (drift.decide_look). The reference is the
     calibration's held-out real episodes and, after the first `baseline` looks (tested against
     the calibration alone), those looks' episodes too: under no drift every real episode is
     exchangeable with every other, so the tests stay exact, and a handful of held-out episodes
     (6 on a 40-episode log) is too few for a year of looks at 0.05. A drift present from the first
     periods is seen only against the calibration; windows never reach back into the baseline;
  4. the state is written after every look (a killed run loses at most the look in progress; a
     re-run scores only what is not in the state), then the report (monitor.json, monitor.html)
     and TensorBoard scalars with the look as the step.
  5. one monitor at a time per folder (datasets/folder_lock.py, OUTDIR/.monitor.lock): a second run on the same --out
     stops with exit 2 instead of saving a state that drops the first run's looks.

State: OUTDIR/monitor_state.json, the model's hash, the settings (fixed for the folder's life:
the guarantee is about one plan), each look's episodes (hash, name, features) and result, and
the episodes of an unfinished N-episode period. A retrained model needs a new folder.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.calibration import Calibration, load_calibrated
from wmcheck.checks.drift import EpisodeFeatures, LookPlan, decide_look, episode_features, window_test
from wmcheck.checks.folds import FoldModels, deal
from wmcheck.checks.model_log import episode_fingerprint, read_log_for_model
from wmcheck.datasets.atomic import write_text_atomic
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.folder_lock import folder_lock
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.version import version
from wmcheck.training.checkpoint import file_sha256

STATE_VERSION = 1
STATE_FILE = "monitor_state.json"
LOCK_FILE = ".monitor.lock"
EXIT = {"stable": 0, "drifted": 1, "off-support": 1, "inconclusive": 3}
_UNITS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_EARLIEST = 365 * 86400.0  # a first timestamp before 1971 is a relative clock, not a date
_WEEK, _MONDAY = 7 * 86400.0, 4 * 86400.0  # the epoch was a Thursday: weekly periods start on Mondays


@dataclass(frozen=True)
class Period:
    """How episodes are grouped into looks: `episodes` per look, or calendar periods of `seconds`."""

    text: str
    episodes: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Period:
        t = str(text).strip().lower()
        m = re.fullmatch(r"(\d+)\s*(ep|episodes?)?", t)
        if m and int(m.group(1)) >= 1:
            return cls(t, episodes=int(m.group(1)))
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([hdw])", t)
        if m and float(m.group(1)) > 0:
            return cls(t, seconds=float(m.group(1)) * _UNITS[m.group(2)])
        raise UserError(
            f"--period {text!r} is neither a number of episodes nor a duration",
            "use e.g. --period 5 (episodes per look) or --period 1d / 12h / 7d (calendar periods, UTC)",
        )

    @property
    def origin(self) -> float:
        """Where calendar periods start counting: Monday 1970-01-05 for whole weeks, else the epoch."""
        return _MONDAY if self.seconds is not None and self.seconds % _WEEK == 0 else 0.0

    def key(self, t: float) -> int:
        return int(math.floor((t - self.origin) / self.seconds))

    def label(self, key: int) -> str:
        if self.episodes is not None:
            return f"episodes {key * self.episodes + 1}-{(key + 1) * self.episodes}"
        start = dt.datetime.fromtimestamp(self.origin + key * self.seconds, dt.timezone.utc)
        return start.strftime("%Y-%m-%d %H:%M UTC" if self.seconds % 86400 else "%Y-%m-%d")


@dataclass
class MonitorSettings:
    """Fixed for the life of a monitor folder (the false-alarm guarantee is about one plan)."""

    period: str = "7d"
    alpha: float = 0.05
    looks: int = 52
    windows: tuple[int, ...] = (1, 4)
    baseline: int = 4  # the first periods' episodes join the reference after they are tested
    seed: int = 0

    def plan(self) -> LookPlan:
        return LookPlan(self.alpha, self.looks, tuple(self.windows))

    def to_dict(self) -> dict:
        return {**asdict(self), "windows": list(self.windows)}


@dataclass
class NewEpisode:
    fingerprint: str
    name: str | None
    log: str
    start_time: float | None
    features: list[float]
    end_time: float | None = None

    def public(self) -> dict:
        return asdict(self)


@dataclass
class State:
    model_sha256: str
    settings: dict
    feature_names: list[str]
    calibration_sha256: str = ""  # the reference must not change under a folder's looks
    looks: list[dict] = field(default_factory=list)  # one per tested period, in order
    pending: list[dict] = field(default_factory=list)  # episodes of an unfinished N-episode period
    short: list[dict] = field(default_factory=list)  # episodes too short for a block (not scored)

    def seen(self) -> set[str]:
        out = {e["fingerprint"] for look in self.looks for e in look["episodes"]}
        return out | {e["fingerprint"] for e in self.pending} | {e["fingerprint"] for e in self.short}

    def save(self, out_dir: Path) -> None:
        write_text_atomic(out_dir / STATE_FILE, json.dumps({"state_version": STATE_VERSION, **asdict(self)}, indent=1))

    @classmethod
    def load(cls, out_dir: Path) -> State | None:
        path = out_dir / STATE_FILE
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            if raw.pop("state_version") != STATE_VERSION:
                raise ValueError("another state version")
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(
                f"{path} is not a monitor state this wmcheck can read ({exc})",
                "monitor into a new --out folder (or restore the file from a backup)",
            ) from None


@dataclass
class Context:
    """What every look needs: the model, its calibration, the reference features."""

    bundle: object
    cal: Calibration
    norm: Normalizer
    reference: EpisodeFeatures
    support_q: float
    obs_names: list[str]
    units: dict


def load_context(run_dir: Path) -> Context:
    bundle, cal = load_calibrated(run_dir)
    if cal.real_episode is None or cal.real.z_steps.ndim != 3:
        raise UserError(
            f"{run_dir}: the calibration predates per-episode scores", f"re-run `wmcheck calibrate {run_dir}`"
        )
    names = list(bundle.channels.get("observation_names", [])) or [
        f"obs_{d}" for d in range(cal.real.z_steps.shape[-1])
    ]
    q = cal.support_bound(0.01)
    ref = episode_features(cal.real, cal.real_episode, cal.left_out_support_bounds(0.01), names)  # not in-sample for q
    if len(ref.ids) < 2:
        raise UserError(
            f"{run_dir}: the calibration rests on {len(ref.ids)} held-out real episode(s); a drift test needs >= 2",
            f"add real logs the model never trained on: `wmcheck calibrate {run_dir} --real EXTRA.h5`",
        )
    norm = Normalizer.from_dict(bundle.normalizer)
    return Context(bundle, cal, norm, ref, q, names, dict(bundle.channels.get("units", {})))


def known_fingerprints(run_dir: Path, cal, channels: dict) -> set[str]:
    """Content hashes of the episodes the model was trained and calibrated on (the training log
    and the `calibrate --real` extras): they are not new real data, and on both sides of a test
    they would hide a drift. Stored with the calibration; one written before that stores none,
    and then the training log is read (extras are not known then; empty when the log has moved)."""
    from wmcheck.checks.calibration import training_log

    known = cal.known_fingerprints()
    if known is not None:
        return known

    try:
        log = training_log(run_dir)
    except UserError:
        return set()
    if not log.exists():
        return set()
    _meta, episodes = read_log_for_model(log, channels, role="training log")
    return {episode_fingerprint(e) for e in episodes}


def score_new(ctx: Context, log: Path, seen: set[str], seed: int) -> tuple[list[NewEpisode], list[dict]]:
    """The episodes of `log` not in `seen`, scored and summarised, in file order; and the short ones."""
    _meta, episodes = read_log_for_model(log, ctx.bundle.channels, role="real log")
    fresh, dup = [], set()
    for e in episodes:
        fp = episode_fingerprint(e)
        if fp not in seen and fp not in dup:
            fresh.append((fp, e))
            dup.add(fp)
    if not fresh:
        return [], []
    cfg = ctx.cal.config
    eps = [e for _, e in fresh]
    try:
        blocks = make_blocks(eps, ctx.norm, cfg.context, cfg.horizon)
    except ValueError:
        blocks = None
    skipped = set(blocks.skipped) if blocks is not None else {e.id for e in eps}
    short = [
        {"fingerprint": fp, "name": e.name, "log": str(log), "steps": int(e.num_steps)}
        for fp, e in fresh
        if e.id in skipped
    ]
    if blocks is None:
        return [], short
    model = ctx.bundle.model
    if isinstance(model, FoldModels):  # no fold model trained on new data: each episode scored by one, in turn
        model = model.assigned(deal([e.id for e in eps], len(model)))
    sc = ctx.cal.score(model, blocks, seed)
    feats = episode_features(sc, blocks.episode, ctx.support_q, ctx.obs_names)
    row = {int(i): r for i, r in zip(feats.ids, feats.values)}
    out = []
    for fp, e in fresh:
        if e.id in skipped:
            continue
        t0, t1 = (
            (float(e.timestamps[0]), float(e.timestamps[-1]))
            if e.timestamps is not None and len(e.timestamps)
            else (None, None)
        )
        out.append(NewEpisode(fp, e.name, str(log), t0, [float(v) for v in row[int(e.id)]], t1))
    return out, short


def group_periods(period: Period, state: State, new: list[NewEpisode]) -> list[tuple[int, list[dict]]]:
    """(period key, episodes) of every complete period among the pending and new episodes, in order;
    an unfinished N-episode period goes back to `state.pending`."""
    items = state.pending + [e.public() for e in new]
    last = state.looks[-1]["key"] if state.looks else -1
    if period.episodes is not None:
        n = period.episodes
        full = len(items) // n
        state.pending = items[full * n :]
        return [(last + 1 + k, items[k * n : (k + 1) * n]) for k in range(full)]
    missing = [e for e in items if e["start_time"] is None]
    if missing:
        raise UserError(
            f"{len(missing)} episode(s) of {missing[0]['log']} have no timestamps, so --period {period.text} cannot place them",
            "import the log with its timestamps, or group by episodes: --period N",
        )
    relative = [e for e in items if e["start_time"] < _EARLIEST]
    if relative:
        raise UserError(
            f"{relative[0]['log']}: episode timestamps start at {relative[0]['start_time']:g} s, a relative clock, not a date",
            "import the log with absolute (Unix epoch) timestamps, or group by episodes: --period N",
        )
    keys: dict[int, list[dict]] = {}
    for e in sorted(items, key=lambda e: e["start_time"]):
        keys.setdefault(period.key(e["start_time"]), []).append(e)
    late = [k for k in keys if k <= last]
    if late:
        raise UserError(
            f"{len(keys[late[0]])} new episode(s) fall in {period.label(late[0])}, a period this monitor already tested",
            "monitor periods in order (each look is final: the false-alarm budget counts it once)",
        )
    # a calendar period is complete once the logs reach its end (an episode runs past it, or a later
    # period has episodes); the newest one usually is not, and waits in the state for the next run
    reached = max(e.get("end_time") or e["start_time"] for e in items)
    done = sorted((k, v) for k, v in keys.items() if period.origin + (k + 1) * period.seconds <= reached)
    tested = {k for k, _ in done}
    state.pending = [e for k, v in sorted(keys.items()) if k not in tested for e in v]
    return done


def _draws(level: float) -> int:
    """Random subsets per window test: enough that the smallest attainable p is 20x below the level."""
    return int(min(200_000, max(2_000, math.ceil(20.0 / level))))


def reference_values(ctx: Context, state: State, baseline: int) -> np.ndarray:
    """(m, F) the episodes a look is tested against: the calibration's held-out real episodes and,
    once the first `baseline` periods have been tested, their episodes too (a baseline period
    never enters a window it is compared with: windows end at later looks)."""
    extra = (
        [e["features"] for lk in state.looks[:baseline] for e in lk["episodes"]] if len(state.looks) >= baseline else []
    )
    return np.concatenate([ctx.reference.values, np.array(extra, float).reshape(-1, ctx.reference.values.shape[1])])


def run_look(
    ctx: Context, state: State, plan: LookPlan, key: int, episodes: list[dict], period: Period, seed: int, baseline: int
) -> dict:
    """Test one period (and the windows ending at it) and describe the outcome."""
    look_no = len(state.looks) + 1
    rng = np.random.default_rng([seed, look_no])
    start = baseline if len(state.looks) >= baseline else 0  # no episode is on both sides of a test
    history = [lk["episodes"] for lk in state.looks[start:]] + [episodes]
    ref = reference_values(ctx, state, baseline)
    tests = {}
    for w in plan.windows:
        window = [e["features"] for eps in history[-w:] for e in eps]
        tests[w] = window_test(np.array(window), ref, ctx.reference.two_sided, rng, _draws(plan.level))
    look = decide_look(tests, plan.level, ctx.reference.kinds)
    findings = [_finding(ctx, f, tests, look.fired) for f in look.flagged]
    return {
        "look": look_no,
        "cycle": plan.cycle(look_no),
        "key": key,
        "label": period.label(key),
        "reference_episodes": int(len(ref)),
        "verdict": look.verdict,
        "episodes": episodes,
        "windows": {
            str(w): {
                "periods": min(w, len(history)),
                "episodes": t.n_new,
                "p_value": t.p_value,
                "level": plan.level,
                "fired": w in look.fired,
                "can_fire": w not in look.untestable,
                "smallest_p": t.min_p,
                "subsets": t.subsets,
                "statistic": [float(v) for v in t.statistic],
            }
            for w, t in tests.items()
        },
        "findings": findings,
        "estimates": _estimates(ctx, tests[min(plan.windows)]),
        "sentence": _sentence(look.verdict, findings, look.untestable, tests),
    }


def _physical(ctx: Context, f: int, diff: float, ci) -> tuple[float, list[float], str | None, str]:
    """A feature's difference from reality in the units a reader uses: (estimate, 95 % CI, unit, words)."""
    ref = ctx.reference
    kind, d = ref.kinds[f], ref.channel[f]
    lo, hi = float(ci[0]), float(ci[1])
    if kind == "bias":
        s = float(ctx.norm.std["obs"][d])
        ch, unit = ctx.obs_names[d], ctx.units.get(ctx.obs_names[d])
        est, iv = diff * s, [lo * s, hi * s]
        u = f" {unit}" if unit else ""
        return (
            est,
            iv,
            unit,
            f"{ch} {est:+.3g}{u} against the model's prediction (95 % CI {iv[0]:+.3g} to {iv[1]:+.3g}{u})",
        )
    if kind == "dispersion":
        est, iv = math.exp(diff / 2), [math.exp(lo / 2), math.exp(hi / 2)]
        how = "noisier" if est > 1 else "smoother"
        return (
            est,
            iv,
            "x",
            (
                f"{ctx.obs_names[d]} errors {est:.2f}x as spread as on held-out real data ({how}; 95 % CI {iv[0]:.2f}-{iv[1]:.2f})"
            ),
        )
    if kind == "divergence":
        est, iv = math.exp(diff), [math.exp(lo), math.exp(hi)]
        return (
            est,
            iv,
            "x",
            (
                f"open-loop divergence {est:.2f}x held-out real data's (the share of steps outside the model's 90 % "
                f"interval; 95 % CI {iv[0]:.2f}-{iv[1]:.2f})"
            ),
        )
    if kind == "nll":
        return (
            diff,
            [lo, hi],
            "nats",
            f"one-step NLL {diff:+.3g} nats per channel over real (95 % CI {lo:+.3g} to {hi:+.3g})",
        )
    return (
        diff,
        [lo, hi],
        "share",
        (
            f"{diff:+.0%} of steps outside the model's support (95 % CI {lo:+.0%} to {hi:+.0%}): states the logs never had"
        ),
    )


def _finding(ctx: Context, f: int, tests: dict, fired: list[int]) -> dict:
    w = min(fired, key=lambda w: tests[w].feature_p[f])  # the window that shows it most strongly
    t = tests[w]
    est, ci, unit, words = _physical(ctx, f, float(t.diff[f]), t.ci[f])
    ref = ctx.reference
    return {
        "feature": ref.names[f],
        "kind": ref.kinds[f],
        "channel": ctx.obs_names[ref.channel[f]] if ref.channel[f] is not None else None,
        "window": w,
        "p_value": float(t.feature_p[f]),
        "estimate": est,
        "ci95": ci,
        "unit": unit,
        "text": words,
    }


def _estimates(ctx: Context, t) -> dict:
    """Every feature's estimate in window 1 (the trend plots), flagged or not."""
    return {ctx.reference.names[f]: _physical(ctx, f, float(t.diff[f]), t.ci[f])[0] for f in range(len(t.diff))}


def _sentence(verdict: str, findings: list[dict], untestable: list[int], tests: dict) -> str:
    if verdict == "off-support":
        return "Reality now visits states the training logs never had; the model cannot judge them: " + "; ".join(
            x["text"] for x in findings
        )
    if verdict == "drifted":
        return "Reality drifted from what the model learned (retrain on recent logs): " + "; ".join(
            x["text"] for x in findings
        )
    if verdict == "inconclusive":
        need = ", ".join(
            f"{w}-period window: {tests[w].n_new} episodes, smallest p {tests[w].min_p:.2g}" for w in untestable
        )
        return f"No window has enough episodes to reach the look's level ({need}): more episodes per period, or fewer looks"
    extra = f" (the {', '.join(map(str, untestable))}-period window cannot reach the level yet)" if untestable else ""
    return "No drift at the look's level" + extra


def monitor(
    run_dir: str | Path,
    real_logs: list[str | Path],
    out_dir: str | Path,
    settings: MonitorSettings,
    command: str | None = None,
) -> dict:
    """Add the new real episodes in `real_logs` to the monitor in `out_dir`; returns the report."""
    t0 = time.perf_counter()
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    period = Period.parse(settings.period)
    plan = settings.plan()
    ctx = load_context(run_dir)
    fix = "wait for it to finish, or monitor into another --out folder"
    with folder_lock(out_dir, LOCK_FILE, "wmcheck monitor", fix):  # two writers would each drop the other's looks
        return _monitor_locked(ctx, run_dir, real_logs, out_dir, settings, period, plan, command, t0)


def _monitor_locked(ctx, run_dir: Path, real_logs, out_dir: Path, settings, period, plan, command, t0) -> dict:
    state = State.load(out_dir)
    cal_hash = file_sha256(run_dir / "calibration.npz")
    if state is None:
        state = State(ctx.bundle.file_hash, settings.to_dict(), ctx.reference.names, cal_hash)
    elif state.calibration_sha256 != cal_hash:
        raise UserError(
            f"{out_dir} was started against another calibration of this model (re-calibrated since?): its "
            "baseline and budget rest on the old reference",
            "monitor into a new --out folder",
        )
    elif state.model_sha256 != ctx.bundle.file_hash:
        raise UserError(
            f"{out_dir} monitors another model (sha256 {state.model_sha256[:12]}…)",
            "monitor a retrained model into a new --out folder",
        )
    elif state.settings != settings.to_dict():
        diff = {k: state.settings.get(k) for k, v in settings.to_dict().items() if state.settings.get(k) != v}
        raise UserError(
            f"{out_dir} was started with other settings ({diff}); the false-alarm guarantee is about one plan",
            "repeat the folder's settings, or monitor into a new --out folder",
        )
    new, short = [], []
    seen = state.seen() | known_fingerprints(run_dir, ctx.cal, ctx.bundle.channels)
    for log in real_logs:
        got, sh = score_new(ctx, Path(log), seen, settings.seed)
        new += got
        short += sh
        seen |= {e.fingerprint for e in got} | {e["fingerprint"] for e in sh}
    state.short += short
    fresh_looks = []
    for key, eps in group_periods(period, state, new):
        look = run_look(ctx, state, plan, key, eps, period, settings.seed, settings.baseline)
        state.looks.append(look)
        state.save(out_dir)  # after every look: a kill loses at most the look in progress
        fresh_looks.append(look["look"])
    state.save(out_dir)
    return build_report(ctx, state, plan, fresh_looks, len(new), short, command, time.perf_counter() - t0)


def build_report(ctx, state: State, plan: LookPlan, fresh: list[int], n_new: int, short, command, seconds) -> dict:
    new_looks = [lk for lk in state.looks if lk["look"] in fresh]
    verdicts = [lk["verdict"] for lk in new_looks]
    if any(v in ("drifted", "off-support") for v in verdicts):
        code = 1
    elif verdicts and all(v == "inconclusive" for v in verdicts):
        code = 3
    else:
        code = 0
    latest = state.looks[-1] if state.looks else None
    if not new_looks:
        message = (
            f"No new period to test ({n_new} new episode(s) scored, {len(state.pending)} waiting for a full period)."
        )
    else:
        message = " ".join(f"{lk['label']}: {lk['verdict']}. {lk['sentence']}." for lk in new_looks)
    return {
        "monitor_version": 1,
        "verdict": latest["verdict"] if latest else None,
        "exit_code": code,
        "message": message,
        "guarantee": plan.guarantee(),
        "settings": state.settings,
        "reference": {
            "episodes": int(len(ctx.reference.ids)),
            "what": "held-out real episodes of the model's calibration (never trained on)",
        },
        "features": ctx.reference.names,
        "looks": [
            {k: v for k, v in lk.items() if k != "episodes"} | {"episodes": len(lk["episodes"])} for lk in state.looks
        ],
        "new_looks": fresh,
        "pending_episodes": len(state.pending),
        "short_episodes": short,
        "provenance": {
            "wmcheck_version": version(),
            "command": command,
            "model_sha256": ctx.bundle.file_hash,
            "seconds": round(seconds, 1),
        },
    }
