"""``attntune report``: a self-contained HTML page of the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attntune.cli import app
from attntune.cli.common import console, open_layers


@app.command()
def report(
    out: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write."),
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    system: bool = typer.Option(True, help="Include the shipped system cache."),
    include_stale: bool = typer.Option(False, help="Draw stale rows too (a cache tuned under other software)."),
) -> None:
    """Write an HTML report: chosen variant and speedup over SDPA default per key (heatmaps), tables."""
    from attntune.report import render_report

    layers = open_layers(cache, system)
    rows = list(layers.effective().values())
    page = render_report(rows, sources=[st.url for _, st in layers.layers], include_stale=include_stale)
    out.write_text(page)
    console.print(f"wrote {out} ({len(rows)} keys, {out.stat().st_size // 1024} KiB)")
