"""The ``attntune`` command line (typer + rich). One module per command group; each registers on ``app``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="attntune",
    help="Measured attention dispatch: tune attention variants per GPU and shape, inspect the results.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules register themselves on import (kept last: they import ``app`` from here).
from attntune.cli import inspect_cmds  # noqa: E402,F401

_OPTIONAL = ("attntune.cli.tune_cmd", "attntune.cli.runtime_cmds", "attntune.cli.report_cmd")


def _load_optional() -> None:
    import importlib

    for mod in _OPTIONAL:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real missing dependency inside the module: surface it
                raise


_load_optional()


def main() -> None:
    app()
