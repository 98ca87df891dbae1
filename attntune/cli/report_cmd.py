"""``attntune report``: a self-contained HTML page of the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attntune.cli import app
from attntune.cli.common import console, err_console, read_layers, write_output

PLOTS_HINT = "pip install 'attntune[plots]'"


@app.command()
def report(
    out: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write (- for standard output)."),
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    system: bool = typer.Option(True, help="Include the shipped system cache."),
    include_stale: bool = typer.Option(False, help="Draw stale rows too (a cache tuned under other software)."),
) -> None:
    """Write an HTML report: chosen variant and speedup over SDPA default per key (heatmaps), tables.

    The heatmaps need matplotlib, which stays an optional extra (``pip install 'attntune[plots]'``):
    it is a large dependency that neither tuning nor dispatch uses, and a server that only serves
    models should not carry it. Without it the report is still written — summary and every table —
    and one line says how to get the plots.
    """
    from attntune.report import plots_available, render_report

    layers, effective = read_layers(cache, system)
    rows = list(effective.values())
    page = render_report(rows, sources=[st.shown for _, st in layers.layers], include_stale=include_stale)
    if write_output(out, page, layers):
        console.print(f"wrote {out} ({len(rows)} keys, {out.stat().st_size // 1024} KiB)", markup=False)
    else:  # a stream (-, a pipe): its reader gets the page only
        err_console.print(f"wrote {out} ({len(rows)} keys, {len(page) // 1024} KiB)", markup=False)
    if not plots_available():
        console.print(f"no plots: matplotlib is not installed ({PLOTS_HINT}); the tables are complete",
                      markup=False, highlight=False)
