"""Command-line options generated from config dataclasses: one source for defaults and help.

Owns `add_options(parser, cls, names)` and `config_kwargs(args, cls, names)`. A field `max_delay`
becomes `--max-delay`, with the dataclass default and, as help, the attribute docstring written
under the field (read from the source with `ast`, as cleanrl's tyro does). A default changed in
the dataclass therefore changes the CLI and its `--help` with it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """{field name: the string literal written right after the field in the class body}."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    out = {}
    for prev, node in zip(body, body[1:]):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out[prev.target.id] = " ".join(node.value.value.split())
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(
    parser: argparse.ArgumentParser, cls, names: list[str], help_overrides: dict[str, str] | None = None
) -> None:
    """Add `--field-name` options for the dataclass fields `names` (scalars: int, float, str)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    docs = field_docs(cls)
    for name in names:
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kind = type(default)
        assert kind in (int, float, str), f"{cls.__name__}.{name}: only scalar options are generated, got {kind}"
        text = (help_overrides or {}).get(name) or docs.get(name, name.replace("_", " "))
        parser.add_argument(
            _flag(name), dest=name, type=kind, default=default, help=f"{text} (default {default})".replace("%", "%%")
        )


def config_kwargs(args: argparse.Namespace, names: list[str]) -> dict:
    """The parsed values of the generated options, as keyword arguments for the dataclass."""
    return {n: getattr(args, n) for n in names}


def env_kwargs_arg(text: str | None) -> dict | None:
    """The `--env-kwargs JSON` option of record, check and export: a JSON object, or None when absent."""
    import json

    from wmcheck.datasets.errors import UserError

    if not text:
        return None
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--env-kwargs is not valid JSON: {exc}", "e.g. --env-kwargs '{\"g\": 9.81}'") from None
    if not isinstance(kwargs, dict):
        raise UserError(f"--env-kwargs must be a JSON object, got {text}", "e.g. --env-kwargs '{\"g\": 9.81}'")
    return kwargs
