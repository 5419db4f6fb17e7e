"""CLI options come from the config dataclasses (one source of defaults and help), and the layers
point one way (nothing below scripts/ imports it)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from wmcheck.checks.config import CheckConfig
from wmcheck.scripts.cli import build_parser
from wmcheck.scripts.cmd_calibrate import CHECK_OPTIONS
from wmcheck.scripts.cmd_train import TRAIN_OPTIONS
from wmcheck.scripts.config_args import field_docs
from wmcheck.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_train_and_calibrate_defaults_are_the_dataclasses():
    parser = build_parser()
    train = vars(parser.parse_args(["train", "log.h5", "--out", "run"]))
    calib = vars(parser.parse_args(["calibrate", "run"]))
    for name in TRAIN_OPTIONS:
        assert train[name] == _defaults(TrainConfig)[name], name
    for name in CHECK_OPTIONS:
        assert train[name] == calib[name] == _defaults(CheckConfig)[name], name
    assert parser.parse_args(["calibrate", "run", "--max-delay", "2"]).max_delay == 2


def test_help_is_the_field_docstring():
    docs = field_docs(TrainConfig)
    assert docs["lr"].startswith("Peak learning rate")
    sub = build_parser()._subparsers._group_actions[0].choices["train"]
    help_text = " ".join(sub.format_help().split())
    assert "Peak learning rate" in help_text and "(default 0.001)" in help_text


def test_lower_layers_never_import_scripts():
    pattern = re.compile(r"^\s*(from|import)\s+wmcheck\.scripts", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in ("checks", "training", "datasets", "worldmodel")
        for p in (ROOT / pkg).rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert offenders == []


def test_a_misspelt_gate_key_exits_2_naming_it(tmp_path, capsys):
    from wmcheck.scripts.cli import main

    gate = tmp_path / "gate.yaml"
    gate.write_text("tolerances:\n  latency: {max_step: 1}\n")
    code = main(
        [
            "check",
            str(tmp_path / "run"),
            "--rollouts",
            str(tmp_path / "sim.h5"),
            "--out",
            str(tmp_path / "o"),
            "--gate",
            str(gate),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "max_step" in err and "max_steps" in err, err  # the key and the accepted ones
    assert not (tmp_path / "o" / "report.json").exists()


def test_every_option_has_help_that_states_its_default():
    """Issue 17: every option of every command has help text, and an option whose default is a value
    (not None / off) says it in its help ("default" or the value itself), so the help never hides
    what a run will use."""
    import argparse

    from wmcheck.scripts.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing, silent = [], []
    for name, p in sub.choices.items():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings:
                continue
            flag = f"{name} {a.option_strings[-1]}"
            text = (a.help or "").strip()
            if not text or text == argparse.SUPPRESS:
                missing.append(flag)
                continue
            d = a.default
            if d in (None, False, [], argparse.SUPPRESS) or a.required or isinstance(a, argparse._StoreTrueAction):
                continue
            if "default" not in text.lower() and str(d) not in text and "%(default)" not in text:
                silent.append(f"{flag} (default {d!r})")
    assert not missing, f"options without help: {missing}"
    assert not silent, f"options whose help does not state the default: {silent}"
