"""A self-contained HTML report of a cache: heatmaps (embedded PNGs) and per-key tables.

Heatmap rows are key families (dtype, head dims, heads, causal/window, mode, device); columns are the
sequence-length buckets (``Sq x Skv``). One map shows the chosen variant per key, the other the speedup
over torch SDPA's default measured on the same inputs during tuning.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections import defaultdict
from datetime import datetime
from typing import Dict, List, Optional, Sequence, Tuple

from attntune.cache import CachedRow, WinnerRecord


def _matplotlib_or_none():
    """``matplotlib.pyplot`` on the Agg backend, or None when matplotlib is not installed (it is the
    optional ``plots`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plots_available() -> bool:
    """Whether the heatmaps can be drawn (matplotlib importable)."""
    return _matplotlib_or_none() is not None


def _matplotlib():
    plt = _matplotlib_or_none()
    if plt is None:
        raise RuntimeError("attntune's heatmaps need matplotlib: pip install 'attntune[plots]'")
    return plt


def natural_key(label: str) -> List:
    """Sort key comparing the numbers inside a label as numbers: ``1x512`` < ``128x128`` < ``512x512``
    and ``D64`` < ``D128`` (as text, ``128x128`` < ``1x512`` and ``D128`` < ``D64``). Split on digit
    runs, text and numbers alternate at the same positions, so two keys always compare like with like."""
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", label)]


def _family_label(rec: WinnerRecord) -> str:
    k = rec.key
    parts = [k.dtype, f"D{k.head_dim}", f"H{k.heads_q}/{k.heads_kv}", f"B{k.batch}"]
    if k.causal:
        parts.append("causal")
    if k.window is not None:
        parts.append(f"win{k.window[0]},{k.window[1]}")
    if k.kv_lens:
        parts.append("kv_lens")
    parts.append(k.mode)
    return " ".join(parts)


def _grid(records: Sequence[WinnerRecord]) -> Tuple[List[str], List[str], Dict[Tuple[str, str], WinnerRecord]]:
    """Heatmap rows (key families) and columns (``Sq x Skv`` buckets), both in numeric order, and the
    record of each cell."""
    cells: Dict[Tuple[str, str], WinnerRecord] = {}
    for r in records:
        cells[(_family_label(r), f"{r.key.seqlen_q}x{r.key.seqlen_kv}")] = r
    rows = sorted({f for f, _ in cells}, key=natural_key)
    cols = sorted({c for _, c in cells}, key=natural_key)
    return rows, cols, cells


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def variant_heatmap(records: Sequence[WinnerRecord]) -> Optional[str]:
    """PNG (base64) of the chosen variant per key; None when there is nothing to draw."""
    if not records:
        return None
    plt = _matplotlib()
    import numpy as np

    rows, cols, cells = _grid(records)
    variants = sorted({r.variant for r in records})
    idx = {v: i for i, v in enumerate(variants)}
    data = np.full((len(rows), len(cols)), np.nan)
    for (f, c), r in cells.items():
        data[rows.index(f), cols.index(c)] = idx[r.variant]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cols) + 4), max(2.5, 0.4 * len(rows) + 1.5)))
    cmap = plt.get_cmap("tab10", max(len(variants), 1))
    im = ax.imshow(data, cmap=cmap, vmin=-0.5, vmax=len(variants) - 0.5, aspect="auto")
    for (f, c), r in cells.items():
        ax.text(cols.index(c), rows.index(f), r.variant.replace("sdpa_", "s:").replace("triton_", "t:"),
                ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("seqlen bucket (Sq x Skv)")
    ax.set_title("chosen variant per key")
    cb = fig.colorbar(im, ax=ax, ticks=range(len(variants)))
    cb.ax.set_yticklabels(variants, fontsize=8)
    out = _png(fig)
    plt.close(fig)
    return out


def speedup_heatmap(records: Sequence[WinnerRecord]) -> Optional[str]:
    """PNG (base64) of speedup over SDPA default per key (log colour scale centred on 1x)."""
    recs = [r for r in records if r.speedup]
    if not recs:
        return None
    plt = _matplotlib()
    import numpy as np
    from matplotlib.colors import LogNorm

    rows, cols, cells = _grid(recs)
    data = np.full((len(rows), len(cols)), np.nan)
    for (f, c), r in cells.items():
        data[rows.index(f), cols.index(c)] = r.speedup
    lim = max(2.0, float(np.nanmax(data)), 1 / float(np.nanmin(data)))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cols) + 4), max(2.5, 0.4 * len(rows) + 1.5)))
    im = ax.imshow(data, cmap="RdYlGn", norm=LogNorm(vmin=1 / lim, vmax=lim), aspect="auto")
    for (f, c), r in cells.items():
        ax.text(cols.index(c), rows.index(f), f"{r.speedup:.2f}x", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("seqlen bucket (Sq x Skv)")
    ax.set_title("speedup over torch SDPA default (same inputs, same run)")
    fig.colorbar(im, ax=ax)
    out = _png(fig)
    plt.close(fig)
    return out


def _esc(x) -> str:
    return html.escape("-" if x is None else str(x))


def _table(rows: Sequence[CachedRow]) -> str:
    head = ("key", "device", "variant", "config", "median", "TFLOP/s", "TB/s", "vs SDPA", "runner-up",
            "max error", "trials", "tuning s", "status", "from")
    out = ["<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        r = row.record
        if r is None:
            out.append(f"<tr class='bad'><td>{_esc(row.key_id)}</td>" + "<td>-</td>" * 11
                       + f"<td>{_esc(row.status)}: {_esc('; '.join(row.reasons))}</td><td>{_esc(row.origin)}</td></tr>")
            continue
        cfg = " ".join(f"{k}={v}" for k, v in r.config.items()) or "-"
        ru = f"{r.runner_up} ({r.runner_up_ms:.4f} ms)" if r.runner_up and r.runner_up_ms else (r.runner_up or "-")
        status = row.status if row.status == "valid" else f"{row.status}: {'; '.join(row.reasons)}"
        cells = (r.key.short(), r.key.device.label(), r.variant, cfg, f"{r.median_ms:.4f} ms",
                 f"{r.tflops:.1f}" if r.tflops else "-", f"{r.tbps:.2f}" if r.tbps else "-",
                 f"{r.speedup:.2f}x" if r.speedup else "-", ru,
                 (f"{r.max_error:.2e}" if r.max_error is not None else "-")
                 + (f" (rel {r.rel_error:.2e})" if r.rel_error is not None else ""), r.trials, f"{r.tuning_seconds:.1f}",
                 status, row.origin)
        cls = "" if row.status == "valid" else " class='bad'"
        out.append(f"<tr{cls}>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{background:#f0f0f0} tr.bad td{background:#fff3f3}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
.summary{font-size:14px}
"""

# A tiny self-check (no network, no libraries): marks the body once every image has decoded, so a
# headless browser test can tell that the page rendered with its pictures.
_SELF_CHECK = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.length > 0 && imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-images-ok', ok ? 'true' : 'false');
  document.body.setAttribute('data-image-count', String(imgs.length));
});
</script>
"""


def render_report(rows: Sequence[CachedRow], title: str = "attntune report", sources: Sequence[str] = (),
                  include_stale: bool = False) -> str:
    """The whole page as one HTML string (images embedded as data URIs). ``include_stale`` draws stale
    rows too (e.g. viewing an H200 cache on another machine, where its software fingerprint differs);
    their status column says so."""
    shown = ("valid", "stale") if include_stale else ("valid",)
    valid = [r for r in rows if r.status in shown and r.record is not None]
    recs = [r.record for r in valid]
    by_device: Dict[str, List[CachedRow]] = defaultdict(list)
    for r in valid:
        by_device[r.record.key.device.label()].append(r)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{_esc(title)}</h1>"]
    sp = [r.speedup for r in recs if r.speedup]
    geo = None
    if sp:
        import math

        geo = math.exp(sum(math.log(s) for s in sp) / len(sp))
    parts.append(f"<p class='summary'>{sum(r.status == 'valid' for r in rows)} valid rows, "
                 f"{sum(r.status == 'stale' for r in rows)} stale{' (drawn)' if include_stale else ''}, "
                 f"{sum(r.status == 'rejected' for r in rows)} rejected. "
                 + (f"Geometric-mean speedup over SDPA default: <b>{geo:.3f}x</b> over {len(sp)} keys. " if geo else "")
                 + f"Generated {datetime.now().isoformat(timespec='seconds')}"
                 + (f" from {_esc(', '.join(sources))}" if sources else "") + ".</p>")
    plots = plots_available()
    if valid and not plots:
        parts.append("<p class='summary'>No heatmaps: they need matplotlib "
                     "(<code>pip install 'attntune[plots]'</code>). The tables below are complete.</p>")
    for dev, drows in sorted(by_device.items()):
        drecs = [r.record for r in drows]
        parts.append(f"<h2>{_esc(dev)}</h2>")
        if plots:
            for png, alt in ((variant_heatmap(drecs), "chosen variant per key"),
                             (speedup_heatmap(drecs), "speedup over SDPA default per key")):
                if png:
                    parts.append(f"<img alt='{alt}' src='data:image/png;base64,{png}'>")
        parts.append(_table(sorted(drows, key=lambda r: r.record.key.short())))
    bad = [r for r in rows if r.status not in shown]
    if bad:
        parts.append("<h2>Stale and rejected rows</h2>")
        parts.append(_table(bad))
    if not valid:
        parts.append("<p>No valid rows: run <code>attntune tune</code>.</p>")
    parts.append(_SELF_CHECK + "</body></html>")
    return "\n".join(parts)
