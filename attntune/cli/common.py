"""Helpers shared by the CLI commands: opening caches, formatting rows."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional

from rich.console import Console

from attntune.cache import CachedRow, LayeredCache, WinnerRecord
from attntune.cache.layered import open_store, system_cache_path, user_cache_url


def _width(stream) -> int | None:
    # Piped output (make demo, CI logs) would otherwise be folded into 80 columns; a terminal keeps
    # its own width. COLUMNS, when set, always wins (rich reads it).
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 160


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def open_layers(cache: Optional[str], system: bool = True) -> LayeredCache:
    """``--cache URL`` replaces the user layer; the shipped system cache is added unless disabled."""
    return LayeredCache.open_default(user_url=cache, system=system)


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


def fmt_config(cfg: Optional[Dict[str, Any]]) -> str:
    if not cfg:
        return "-"
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def fmt_ms(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1000:.1f}µs" if ms < 1 else f"{ms:.3f}ms"


def row_json(row: CachedRow) -> Dict[str, Any]:
    d: Dict[str, Any] = {"key_id": row.key_id, "origin": row.origin, "status": row.status, "reasons": row.reasons}
    if row.record is not None:
        d["record"] = json.loads(row.record.model_dump_json())
    return d


def record_matches(rec: Optional[WinnerRecord], *, arch=None, dtype=None, variant=None, mode=None,
                   causal=None) -> bool:
    if rec is None:
        return arch is None and dtype is None and variant is None and mode is None and causal is None
    k = rec.key
    return ((arch is None or k.device.arch == arch) and (dtype is None or k.dtype == dtype)
            and (variant is None or rec.variant == variant) and (mode is None or k.mode == mode)
            and (causal is None or k.causal == causal))


__all__ = ["console", "err_console", "open_layers", "fmt_config", "fmt_ms", "row_json", "record_matches",
           "open_store", "system_cache_path", "user_cache_url"]
