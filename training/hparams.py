"""A run's hyper-parameters in TensorBoard: the HParams plugin's record and a text table beside it.

The HParams tab lists a run only when the run's own event files hold the plugin's three summaries
(experiment, session start, session end). `SummaryWriter.add_hparams` writes them into a *new*
sub-folder (a second, pseudo run beside the real one) and `TensorBoardLogger.log_hyperparams`
writes placeholder metric values at step 0; `log_hparams` writes the summaries into the writer's own
folder and names as metrics scalar tags the run logs anyway (`val/loss/total`, `openloop/...`), so the
tab shows one row per run with its real values.
"""

from __future__ import annotations

from collections.abc import Iterable


def hparam_value(v):
    """A value the HParams plugin can hold: numbers, strings and booleans as they are, anything else
    (tuples, lists, None) as its text."""
    if isinstance(v, (bool, int, float, str)):
        return v
    return "none" if v is None else str(list(v) if isinstance(v, tuple) else v)


def flat_params(nested: dict, prefix: str = "") -> dict:
    """{"model": {"deter": 64}, "train": {...}} -> {"model.deter": 64, ...} with plugin-safe values."""
    out = {}
    for k, v in nested.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_params(v, key + "."))
        else:
            out[key] = hparam_value(v)
    return out


def hparams_markdown(params: dict) -> str:
    """The flat parameters as a markdown table (TensorBoard's text tab)."""
    rows = ["| parameter | value |", "|---|---|"]
    rows += [f"| {k} | {v} |" for k, v in params.items()]
    return "\n".join(rows)


def log_hparams(writer, params: dict, metrics: Iterable[str], text_tag: str = "hparams") -> None:
    """Record `params` (flat, see flat_params) in the HParams plugin of `writer`'s own run (a torch
    SummaryWriter), with `metrics` (scalar tags of this run) as its metric columns, and as a text table."""
    from torch.utils.tensorboard.summary import hparams

    params = {k: hparam_value(v) for k, v in params.items()}
    exp, ssi, sei = hparams(params, {tag: 0.0 for tag in metrics})  # the values are not written, only the tags
    file_writer = writer._get_file_writer()  # the writer's own folder (add_hparams would open a sub-folder)
    for summary in (exp, ssi, sei):
        file_writer.add_summary(summary)
    if text_tag:
        writer.add_text(text_tag, hparams_markdown(params), 0)
    writer.flush()
