"""How the command line fails: one clear line on stderr and a non-zero exit, never a traceback — unless
``--debug`` (or ``ATTNTUNE_DEBUG=1``) asks for it.

Exit codes: 2 for problems the user can fix (a bad argument, an unusable cache, a file that cannot be
written), 1 for anything unexpected (a bug: the line says how to get the traceback). Usage errors keep
typer's message and exit code (2), on one line.

Light on purpose: imported by ``attntune --help``, so nothing heavy (sqlalchemy, torch) at module level.
"""

from __future__ import annotations

import sys
from typing import Tuple

import typer
from typer.core import TyperGroup

DEBUG_KEY = "attntune.debug"  # in click's ctx.meta, set by the app callback from --debug
USER_ERROR = 2
INTERNAL_ERROR = 1


def _click_exception() -> type:
    """The base of typer's usage errors (``BadParameter`` …): ``ClickException`` of whichever click
    typer runs on (its own copy since typer 0.29, the click package before)."""
    return next(k for k in typer.BadParameter.__mro__ if k.__name__ == "ClickException")


_CLICK_EXCEPTION = _click_exception()
#: exceptions that are already the command line's answer: ``typer.Exit``, Ctrl-C
_CLI_OWN = (typer.Exit, typer.Abort)


class CliError(Exception):
    """A problem the user can fix (bad cache, bad argument): printed as one line, exit code 2."""


def one_line(e: BaseException) -> str:
    """The first line of an exception's message, without SQLAlchemy's ``(sqlite3.X)`` prefix, typed so
    that an empty message still says something."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if first.startswith("(") and ") " in first:  # "(sqlite3.DatabaseError) file is not a database"
        first = first.split(") ", 1)[1]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def is_cache_error(e: BaseException) -> bool:
    """A database-level failure. Checked through sys.modules: when sqlalchemy or the cache store was
    never imported, the exception cannot come from them (and importing them here would cost start-up)."""
    store = sys.modules.get("attntune.cache.store")
    sa_exc = sys.modules.get("sqlalchemy.exc")
    sqlite3 = sys.modules.get("sqlite3")
    kinds = tuple(k for k in (getattr(store, "CacheError", None), getattr(sa_exc, "SQLAlchemyError", None),
                              getattr(sqlite3, "Error", None)) if k is not None)
    return bool(kinds) and isinstance(e, kinds)


def cause_hint(line: str) -> str:
    """What to do, where the message shows a full disk, a read-only file or SQLite's failing -wal/-shm
    files (:mod:`attntune.cache.causes`); a damaged cache gets no advice here (deleting it loses the
    winners: `attntune doctor` says more)."""
    from attntune.cache.causes import ADVICE, cause_of

    advice = ADVICE.get(cause_of(line) or "")
    return f"; {advice}" if advice else ""


def describe(e: BaseException) -> Tuple[str, int]:
    """The line to print for ``e`` and the exit code."""
    if isinstance(e, _CLICK_EXCEPTION):  # a usage error: typer's message, the command's help named
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return " ".join(e.format_message().split()) + hint, e.exit_code
    if isinstance(e, CliError):  # often a cache's error, named and reworded by the command
        return str(e) + cause_hint(str(e)), USER_ERROR
    if is_cache_error(e):
        # CacheError messages already name the cache; SQLAlchemy's name only the failing statement.
        cache_error = type(e).__name__ == "CacheError"
        line = str(e).splitlines()[0] if cache_error else f"cache: {one_line(e)}"
        return line + cause_hint(line), USER_ERROR
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or one_line(e)}", USER_ERROR
    return (f"internal error: {one_line(e)} (run with --debug or ATTNTUNE_DEBUG=1 for the traceback)",
            INTERNAL_ERROR)


def report(e: BaseException) -> int:
    """Print ``e`` as one line on stderr; return the exit code."""
    line, code = describe(e)
    typer.secho(f"attntune: error: {line}", err=True, fg="red")
    return code


class ErrorReportingGroup(TyperGroup):
    """The ``attntune`` group: runs the command and turns any exception that escapes it into one line.
    Usage errors of a command (a bad option value, ``typer.BadParameter``) become one line too, instead
    of typer's usage box; ``typer.Exit`` and Ctrl-C pass through unchanged. Living in the group rather
    than in ``main()`` makes typer's test runner see exactly what a user sees."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except _CLI_OWN:
            raise
        except _CLICK_EXCEPTION as e:  # no traceback to show: --debug changes nothing
            raise typer.Exit(report(e)) from None
        except Exception as e:  # noqa: BLE001 — the whole point: no traceback unless asked for
            if ctx.meta.get(DEBUG_KEY):
                raise
            raise typer.Exit(report(e)) from None
