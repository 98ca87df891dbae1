"""The ``attntune`` command line (typer + rich). One module per command group; each registers on ``app``.

Start-up is kept cheap: ``attntune --help`` and ``--version`` must not import torch, triton, optuna,
sqlalchemy, pydantic, transformers or matplotlib (together seconds on a cold disk). The command modules
therefore import them inside the command functions — typer needs only the signatures — and
``import attntune`` itself is lazy. tests/faults/test_cli_startup.py holds this in place.
"""

from __future__ import annotations

import os
from typing import Optional

import typer

from attntune.cli.errors import DEBUG_KEY, ErrorReportingGroup

app = typer.Typer(
    name="attntune",
    cls=ErrorReportingGroup,
    help="Measured attention dispatch: tune attention variants per GPU and shape, inspect the results.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Markdown: docstring paragraphs reflow to the terminal's width (rich mode kept their hard line breaks,
    # then wrapped again: ragged help) and square brackets stay text (rich mode read ``[report]`` in
    # "pip install 'attntune[report]'" as a style tag and dropped it).
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        from attntune._version import __version__

        typer.echo(f"attntune {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    ctx: typer.Context,
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback when a command fails (also ATTNTUNE_DEBUG=1)."
    ),
) -> None:
    # ATTNTUNE_DEBUG read here, not as the option's envvar: click refused a value it cannot parse as a bool
    # ("maybe", "2") with a usage error, so a junk value broke every command; here it means "off"
    debug = debug or os.environ.get("ATTNTUNE_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
    ctx.meta[DEBUG_KEY] = debug
    if not debug:
        _one_line_warnings()


def _one_line_warnings() -> None:
    """attntune's own warnings (an unusable cache, a bad switch) as the CLI's one ``attntune: warning:``
    line, as the commands print theirs — not Python's two lines with attntune's source line (``explain``
    and ``bench`` reach them through the runtime). Other warnings keep Python's format."""
    import warnings

    prev = warnings.showwarning
    if getattr(prev, "_attntune_one_line", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if text.startswith("attntune: "):
            from attntune.cli.common import warn_line

            warn_line(text[len("attntune: "):])
        else:
            prev(message, category, filename, lineno, file, line)

    show._attntune_one_line = True
    warnings.showwarning = show


# Command modules register themselves on import (kept last: they import ``app`` from here).
from attntune.cli import inspect_cmds, report_cmd, runtime_cmds, tune_cmd  # noqa: E402,F401


def main() -> None:
    app()
