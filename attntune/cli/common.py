"""Helpers shared by the CLI commands: opening caches (and saying which could not be used), formatting.

The cache package imports torch (through the device fingerprint), so it is imported inside functions:
this module is loaded by ``attntune --help``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from rich.console import Console

from attntune.cli.errors import CliError, one_line

if TYPE_CHECKING:
    from attntune.cache import CachedRow, CacheStore, LayeredCache, LayerFailure, WinnerRecord

LAYER_ORDER = ("user", "system")


def _width(stream) -> int | None:
    # Piped output (make demo, CI logs) would otherwise be folded into 80 columns; a terminal keeps
    # its own width. COLUMNS, when set, always wins (rich reads it).
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 160


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def warn_line(msg: str) -> None:
    """One warning line on stderr (no markup: messages quote paths and URLs verbatim)."""
    err_console.print(f"attntune: warning: {msg}", markup=False, highlight=False, soft_wrap=True)


# ---- opening caches --------------------------------------------------------------------------------


def _registry():
    """The kernel registry (imported on first need: it loads torch and Triton), for judging rows."""
    from attntune.kernels import registry

    return registry


def check_cache_option(cache: Optional[str]) -> None:
    """``--cache ""`` (a script's unset variable) silently meant the default cache (``~/.cache``)."""
    if cache is not None and not cache.strip():
        import typer

        raise typer.BadParameter("is empty (an unset variable?); leave it out for the default user cache",
                                 param_hint="--cache")


def read_layers(cache: Optional[str], system: bool = True, strict: bool = True,
                effective: bool = True) -> Tuple["LayeredCache", Any]:
    """Open the layered cache the read commands use and read it once: ``--cache URL`` replaces the
    user layer; the shipped system cache is added unless disabled. Returns ``(layers, rows)``: rows
    are ``layers.effective()`` (key_id -> the row that applies), or with ``effective=False`` every row
    of every layer (``layers.all_rows()``, each row's ``origin`` naming its layer).

    An empty ``cache`` ("", an unset shell variable) is refused rather than read as the default cache.
    The user layer is opened read-only: a command that only reads needs no write permission and
    creates no file. Reading is part of opening: a layer that opens but cannot be read (a dropped
    table, corrupt pages) is only known once read.

    ``strict`` (every command but ``doctor``): a user layer that cannot be used, or a ``--cache`` file
    that does not exist, is an error — the command would otherwise print the other layers' rows (or
    "0 rows") as if that cache were empty; a failed system layer is one warning line. ``doctor``
    passes ``strict=False`` and reports them all.
    """
    check_cache_option(cache)
    from attntune.cache import LayeredCache

    with warnings.catch_warnings():
        # The library warns once per unusable layer (two lines, with a source line); the CLI says it
        # itself, in one line, or as an error.
        warnings.filterwarnings("ignore", message="attntune: ", category=RuntimeWarning)
        layers = LayeredCache.open_default(user_url=cache, system=system, user_readonly=True,
                                            variants=_registry())
        rows = layers.effective() if effective else layers.all_rows()
    if strict:
        if cache is not None and user_layer_missing(layers):
            raise CliError(f"user cache {cache}: no such cache file")
        for f in layer_failures(layers):
            if f.label == "user":
                raise CliError(f"user cache {f.url}: {f.reason}")
            warn_line(f"{f.label} cache {f.url} is unusable ({f.reason}); ignoring it")
    return layers, rows


def layer_failures(layers: "LayeredCache") -> List["LayerFailure"]:
    """The configured layers that could not be opened or read, ``(label, url, reason)``:
    ``LayeredCache.failures`` (read failures appear there once the layer has been read), each reason
    without the location the store's messages start with."""
    return [f._replace(reason=_without_location(f.reason)) for f in layers.failures]


def user_layer_missing(layers: "LayeredCache") -> bool:
    """The user layer neither opened nor failed: opened read-only, it is skipped when its file does
    not exist (a fresh machine: nothing tuned yet)."""
    return not any(label == "user" for label, _ in layers.layers) and not any(
        f.label == "user" for f in layer_failures(layers))


def open_target(url: str) -> "CacheStore":
    """The cache a command writes to (``tune``, ``import``), checked before any work is done: it opens
    for writing (the store refuses read-only files and directories) and its winners table reads.
    Raises CliError saying which cache and why."""
    from attntune.cache.store import CacheStore, display_url

    try:
        store = CacheStore(url)
        store.count()
    except Exception as e:  # noqa: BLE001 — any failure here means the cache cannot be used
        raise CliError(f"cache {display_url(url)}: {_reason(e)}") from e
    return store


_SQLITE_MAGIC = b"SQLite format 3\x00"


def write_output(path: "os.PathLike | str", text: str, layers: "Optional[LayeredCache]" = None) -> bool:
    """Write a command's output file (``export``, ``report --out``) safely: never over a cache (one of
    ``layers``' files, or any SQLite database — ``export cache.db --cache cache.db`` replaced the cache
    with JSON, every row lost), and atomically (a temporary file renamed into place: an interrupted
    write leaves the old file). ``-``, devices and FIFOs are written into as streams. Returns True for a regular
    file, False for a stream (whose reader must not get the command's own messages: they go to stderr).
    Raises CliError naming the file."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    if str(path) == "-":  # standard output, as the usual convention
        sys.stdout.write(text)
        sys.stdout.flush()
        return False
    out = Path(path)
    try:
        target = out.expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise CliError(f"{path}: cannot be written ({e})") from None
    for label, st in (layers.layers if layers is not None else []):
        db = make_url(st.url).database if st.dialect == "sqlite" else None
        if db and Path(db).resolve() == target:
            raise CliError(f"{path}: is the {label} cache itself; choose another output file")
    if target.is_dir():
        raise CliError(f"{path}: is a directory")
    try:
        mode = os.stat(out).st_mode  # follows links: /dev/stdout is a link to a pipe or a terminal
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise CliError(f"{path}: cannot be written ({e.strerror or e})") from None
    if mode is not None and not stat.S_ISREG(mode):
        # A device, FIFO or socket (/dev/null, /dev/stdout, a named pipe): written into, as a shell
        # redirection would — never replaced by a regular file (as root, `export /dev/null` replaced the
        # device node with JSON), and never read first (opening a FIFO to sniff for SQLite blocked forever)
        try:
            with open(out, "w") as f:
                f.write(text)
        except OSError as e:
            raise CliError(f"{path}: cannot be written ({e.strerror or e})") from None
        return False
    try:
        with open(target, "rb") as f:
            if f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC:
                raise CliError(f"{path}: is an SQLite database (a cache?); not overwriting it")
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        pass
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CliError(f"{path}: cannot be written ({e.strerror or e})") from None
    return True


def _reason(e: BaseException) -> str:
    """Why a cache cannot be used, as one line (the caller names the cache)."""
    return _without_location(str(e).splitlines()[0]) if type(e).__name__ == "CacheError" else one_line(e)


def _without_location(reason: str) -> str:
    """Drop a leading ``<url or path>: `` (the store's messages start with the location, which the
    CLI's own line already names): a first field without spaces that contains a slash."""
    head, sep, rest = reason.partition(": ")
    return rest if sep and rest and "/" in head and not any(c.isspace() for c in head) else reason


def parse_device(name: Optional[str]):
    """``--device``: cpu or cuda (default: the GPU if one is visible), with errors naming the option."""
    import torch
    import typer

    from attntune.device import default_device

    if name is None:
        return default_device()
    if name not in ("cpu", "cuda"):
        raise typer.BadParameter("must be cpu or cuda", param_hint="--device")
    if name == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA/ROCm device is visible", param_hint="--device")
    return torch.device(name)


# ---- formatting ------------------------------------------------------------------------------------


def fmt_config(cfg: Optional[Dict[str, Any]]) -> str:
    if not cfg:
        return "-"
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def fmt_ms(ms: Optional[float], spread: Optional[float] = None, busy: bool = False) -> str:
    """``12.3µs`` / ``1.234ms``; with ``spread`` (relative noise of the measurement) ``12.3µs ±1.5%``;
    ``busy`` (measured on a busy CPU, ``WinnerRecord.measured_busy``) adds `` busy CPU``."""
    if ms is None:
        return "-"
    text = f"{ms * 1000:.1f}µs" if ms < 1 else f"{ms:.3f}ms"
    text = text if spread is None else f"{text} ±{spread * 100:.1f}%"
    return text + " busy CPU" if busy else text


def more_line(hidden: int, how: str = "use --all / --json to see them") -> str:
    """The line printed under a list cut short: never a silent truncation."""
    return f"… and {hidden} more ({how})"


def row_json(row: "CachedRow") -> Dict[str, Any]:
    d: Dict[str, Any] = {"key_id": row.key_id, "origin": row.origin, "status": row.status, "reasons": row.reasons}
    if row.record is not None:
        d["record"] = json.loads(row.record.model_dump_json())
    return d


def record_matches(rec: Optional["WinnerRecord"], *, arch=None, dtype=None, variant=None, mode=None,
                   causal=None) -> bool:
    if rec is None:
        return arch is None and dtype is None and variant is None and mode is None and causal is None
    k = rec.key
    return ((arch is None or k.device.arch == arch) and (dtype is None or k.dtype == dtype)
            and (variant is None or rec.variant == variant) and (mode is None or k.mode == mode)
            and (causal is None or k.causal == causal))


__all__ = ["console", "err_console", "warn_line", "read_layers", "layer_failures", "user_layer_missing", "open_target",
           "parse_device", "fmt_config", "fmt_ms", "more_line", "row_json", "record_matches", "CliError"]
