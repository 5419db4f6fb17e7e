"""Cross-fitting (`train --folds K`): the folds, the per-fold routing of scores and fits, a
cross-fitted run's calibration (every real episode held out once, by the model that did not train
on it) and its check."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import light_check_config, record_pendulum

from wmcheck.checks.blocks import make_blocks
from wmcheck.checks.folds import FoldModels, deal
from wmcheck.checks.report_html import render_html
from wmcheck.checks.scoring import score_blocks
from wmcheck.datasets.errors import UserError
from wmcheck.datasets.logformat import open_log
from wmcheck.datasets.normalize import Normalizer
from wmcheck.datasets.split import fold_of, training_split
from wmcheck.training.crossfit import pooled_card


def test_folds_are_balanced_seeded_and_cover_every_episode_once():
    ids = list(range(20))
    of = fold_of(ids, 6, seed=3)
    sizes = np.bincount(list(of.values()), minlength=6)
    assert sorted(of) == ids and sizes.max() - sizes.min() <= 1 and sizes.min() == 3
    assert of == fold_of(reversed(ids), 6, seed=3)  # the order ids come in does not matter
    assert of != fold_of(ids, 6, seed=4)
    held = [training_split(ids, 0.2, 3, folds=6, fold=k) for k in range(6)]
    for train, val in held:
        assert sorted(train + val) == ids and not set(train) & set(val)
    assert sorted(i for _, val in held for i in val) == ids  # each episode held out exactly once
    with pytest.raises(ValueError, match="folds must be >= 2"):
        fold_of(ids, 1)
    with pytest.raises(ValueError, match="at least 30 episodes"):
        fold_of(ids, 30)
    assert deal([7, 3, 9, 5], 3) == {3: 0, 5: 1, 7: 2, 9: 0}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Two differently initialised debug world models on Pendulum blocks, and the blocks."""
    from wmcheck.worldmodel import WorldModel
    from wmcheck.worldmodel.config import preset

    log = record_pendulum(tmp_path_factory.mktemp("folds") / "p.h5", episodes=6, steps=60)
    with open_log(log) as lg:
        meta, eps = lg.meta, list(lg.episodes())
    norm = Normalizer.fit(eps, meta)
    cfg = preset("debug", obs_dim=3, action_dim=1, input_dim=0)
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(WorldModel(cfg).eval())
    return models, make_blocks(eps, norm, 8, 16), eps, norm


def test_every_block_is_scored_by_its_own_fold_model(two_models):
    models, blocks, _, _ = two_models
    fm = FoldModels(models, {e: e % 2 for e in range(6)})
    rng = np.random.default_rng(0)
    refs = rng.normal(size=(2, 50, models[0].cfg.deter)).astype(np.float32)
    scales = np.array([0.7, 1.9])
    routed = score_blocks(fm, blocks, samples=4, support_ref=refs, support_scale=scales, seed=0)
    assert len(routed.nll) == len(blocks)
    for k in (0, 1):
        idx = np.flatnonzero(blocks.episode % 2 == k)
        own = score_blocks(models[k], blocks.subset(idx), 4, refs[k], scales[k], seed=0)
        other = score_blocks(models[1 - k], blocks.subset(idx), 4, refs[k], scales[k], seed=0)
        for name in ("nll", "divergence", "support", "kl"):
            np.testing.assert_allclose(getattr(routed, name)[idx], getattr(own, name), rtol=1e-6, atol=1e-9)
        assert not np.allclose(routed.nll[idx], other.nll)  # the routing decides which model speaks


def test_the_corrections_fit_is_routed_too(two_models):
    from wmcheck.checks import sysid

    models, blocks, eps, norm = two_models
    fm = FoldModels(models, {e: int(e >= 3) for e in range(6)})
    layout = sysid.Layout.for_normalizer(norm, 2)
    data = sysid.FitData.of(eps, blocks, norm, layout)
    theta = np.full(len(layout), 0.05)
    routed = sysid.evaluate(fm, data, theta, layout, 8, 4)
    (mean,) = sysid.objective_many(fm, data, theta[None], layout, 8, 4)
    for k in (0, 1):
        idx = np.flatnonzero((blocks.episode >= 3) == k)
        own = sysid.evaluate(models[k], data.subset(idx), theta, layout, 8, 4)
        np.testing.assert_allclose(routed.J[idx], own.J, rtol=1e-6)
        np.testing.assert_allclose(routed.grad[idx], own.grad, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(mean, routed.J.mean(), rtol=1e-6)
    with pytest.raises(KeyError, match="episode 5 has no fold"):
        sysid.evaluate(FoldModels(models, {e: 0 for e in range(5)}), data, theta, layout, 8, 4)


def test_the_pooled_card_weighs_each_fold_by_its_held_out_episodes(two_models):
    from wmcheck.training.quality import QualityCard

    def card(v, n, h=3):
        return QualityCard(
            context=8,
            train_episodes=10,
            heldout_episodes=n,
            windows=4 * n,
            nrmse={"world_model": [v] * h, "arx": [2 * v] * h},
            nrmse_channel={"world_model": [[v]] * h, "arx": [[2 * v]] * h},
            coverage_raw=[0.8] * h,
            coverage_calibrated=[float("nan")] * h if n == 1 else [0.9] * h,
            arx_orders=(2, 2),
            observation_names=["x"],
        )

    pooled = pooled_card([card(1.0, 1), card(4.0, 3, h=4)])
    assert pooled.heldout_episodes == 4 and pooled.windows == 16 and pooled.horizon == 3
    np.testing.assert_allclose(pooled.nrmse["world_model"], [3.25] * 3)  # (1 * 1 + 3 * 4) / 4
    np.testing.assert_allclose(pooled.coverage_calibrated, [0.9] * 3)  # a NaN fold does not count


@pytest.mark.slow
def test_a_cross_fitted_run_calibrates_on_every_episode_and_checks(tmp_path, capsys):
    import wmcheck
    from wmcheck.checks.calibration import Calibration, load_calibrated
    from wmcheck.scripts import cli

    log = record_pendulum(tmp_path / "real.h5", episodes=9, steps=100)
    sim = record_pendulum(tmp_path / "sim.h5", episodes=3, steps=100, seed=5)
    extra = record_pendulum(tmp_path / "extra.h5", episodes=2, steps=100, seed=9)
    run = tmp_path / "run"
    geometry = {"context": 8, "horizon": 16, "gain_grid": light_check_config().gain_grid, "bootstrap": 200}
    result = wmcheck.train(
        log, run, folds=3, max_steps=30, val_every=30, ckpt_every=30, progress_bar=False, check_options=geometry
    )
    assert len(result.folds) == 3 and result.quality.heldout_episodes == 9
    info = json.loads((run / "crossfit.json").read_text())
    with open_log(log) as lg:
        ids = lg.episode_ids
    assert sorted(int(e) for e in info["fold_of"]) == ids
    for k, name in enumerate(info["fold_dirs"]):  # fold k's model held out exactly the episodes of fold k
        t = json.loads((run / name / "config.json").read_text())["train"]
        assert (t["folds"], t["fold"]) == (3, k)
        _, val = training_split(ids, t["val_fraction"], t["seed"], t["folds"], t["fold"])
        assert val == sorted(int(e) for e, f in info["fold_of"].items() if f == k)
        assert (run / name / "model.pt").exists()
    mtimes = [(run / name / "model.pt").stat().st_mtime_ns for name in info["fold_dirs"]]
    opts = {"max_steps": 30, "val_every": 30, "ckpt_every": 30, "progress_bar": False}
    again = wmcheck.train(log, run, folds=3, calibrate=False, **opts)  # finished folds are read back
    assert again.steps == result.steps and len(again.folds) == 3
    assert [(run / name / "model.pt").stat().st_mtime_ns for name in info["fold_dirs"]] == mtimes
    with pytest.raises(UserError, match="holds a cross-fitted run with 3 folds"):
        wmcheck.train(log, run, folds=4, **opts)
    with pytest.raises(UserError, match="12 folds need at least 12 episodes, the log has 9"):
        wmcheck.train(log, tmp_path / "too_many", folds=12, **opts)
    cal = Calibration.load(run)
    assert cal.info["folds"] == 3 and sorted(cal.info["held_out_episodes"]) == ids
    assert cal.support_ref.shape[0] == 3 and np.asarray(cal.support_scale).shape == (3,)
    assert set(np.unique(cal.real_episode)) == set(ids)

    report = wmcheck.check(run, rollouts=sim, tensorboard=False)
    th = report.data["thresholds"]
    assert th["calibration_folds"] == 3 and th["calibration_episodes"] == 9
    cov = th["interval_coverage"]  # the calibrated interval's coverage, measured over every real episode
    assert cov["episodes"] == 9 and len(cov["per_step"]) == cal.spread_scale.shape[0]
    assert 0.0 <= cov["min"] <= cov["max"] <= 1.0
    assert "id='interval-coverage'" in render_html(report.data)
    assert report.verdict in ("pass", "fail", "inconclusive", "unverifiable")

    wmcheck.calibrate(run, real=[extra], **geometry)  # extra real episodes are dealt over the folds
    cal = Calibration.load(run)
    assert len(cal.info["held_out_episodes"]) == 11 and cal.info["extra_real"][0]["episodes"] == 2

    with pytest.raises(UserError, match="cross-fitted run .*3 fold models.*the runtime guard needs one model"):
        load_calibrated(run, one_model_for="the runtime guard")
    shadow = cli.main(["shadow", str(run), "--log", str(sim), "--out", str(tmp_path / "sh")])
    assert shadow == 2 and "cross-fitted" in capsys.readouterr().err
    new = record_pendulum(tmp_path / "new.h5", episodes=3, steps=100, seed=11)  # monitor deals new episodes too
    code = cli.main(["monitor", str(run), "--real", str(new), "--out", str(tmp_path / "mon"), "--period", "3"])
    assert code in (0, 1, 3), capsys.readouterr().err  # stable, drifted, or inconclusive (a 30-step model)
    state = json.loads((tmp_path / "mon" / "monitor_state.json").read_text())
    assert state["model_sha256"] == load_calibrated(run)[0].file_hash


def test_power_halves_and_draws_hold_every_fold_in_equal_numbers():
    from types import SimpleNamespace

    from wmcheck.checks.power import draw_order, halves

    held = [SimpleNamespace(id=i) for i in range(20)]
    strata = fold_of(range(20), 5, seed=0)
    a, b = halves(held, strata)
    assert sorted(e.id for e in a + b) == list(range(20)) and len(a) == len(b) == 10
    for k in range(5):  # 4 episodes per fold: 2 in each half (even / odd positions would not ensure it)
        assert sum(strata[e.id] == k for e in a) == sum(strata[e.id] == k for e in b) == 2
    assert [e.id for e in a] == sorted(e.id for e in a)  # held order, as the block layout needs
    assert halves(held) == (held[0::2], held[1::2])
    order = draw_order(np.repeat(np.arange(20), 2), np.random.default_rng(1), {str(e): f for e, f in strata.items()})
    assert sorted(order) == list(range(20))
    assert len({strata[int(e)] for e in order[:5]}) == 5  # the folds take turns
