"""Inspection commands: ``show``, ``export``, ``import``, ``doctor``."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from attntune.cache import CacheStore, WinnerRecord, judge
from attntune.cache.models import record_to_row
from attntune.cli import app
from attntune.cli.common import (console, err_console, fmt_config, fmt_ms, open_layers, record_matches,
                                 row_json)

EXPORT_FORMAT = "attntune-cache"
EXPORT_VERSION = 1


@app.command()
def show(
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    arch: Optional[str] = typer.Option(None, help="Only rows for this arch (sm_90, gfx942, cpu-avx512…)."),
    dtype: Optional[str] = typer.Option(None, help="Only this dtype (float16, bfloat16, float32…)."),
    variant: Optional[str] = typer.Option(None, help="Only rows won by this variant."),
    mode: Optional[str] = typer.Option(None, help="fwd or fwd_bwd."),
    status: str = typer.Option("valid", help="valid, stale, rejected or all."),
    system: bool = typer.Option(True, help="Include the shipped system cache."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List tuned winners (the row that applies per key, user cache over shipped cache)."""
    if status not in ("valid", "stale", "rejected", "all"):
        raise typer.BadParameter("must be valid, stale, rejected or all", param_hint="--status")
    layers = open_layers(cache, system)
    rows = [r for r in layers.effective().values()
            if (status == "all" or r.status == status)
            and record_matches(r.record, arch=arch, dtype=dtype, variant=variant, mode=mode)]
    rows.sort(key=lambda r: (r.record.key.short() if r.record else r.key_id))
    if as_json:
        print(json.dumps([row_json(r) for r in rows], indent=2, default=str))
        return
    table = Table(title=f"attntune winners ({len(rows)} rows, status={status})", show_lines=False)
    for col in ("key", "arch", "variant", "config", "time", "TFLOP/s", "vs SDPA", "runner-up", "status", "from"):
        table.add_column(col, overflow="fold")
    for r in rows:
        rec = r.record
        if rec is None:
            table.add_row(r.key_id, "-", "-", "-", "-", "-", "-", "-", f"{r.status}: {'; '.join(r.reasons)}", r.origin)
            continue
        sp = rec.speedup
        table.add_row(rec.key.short(), rec.key.device.arch, rec.variant, fmt_config(rec.config), fmt_ms(rec.median_ms),
                      f"{rec.tflops:.1f}" if rec.tflops else "-", f"{sp:.2f}x" if sp else "-",
                      rec.runner_up or "-",
                      r.status if r.status == "valid" else f"{r.status}: {'; '.join(r.reasons)}", r.origin)
    console.print(table)
    if not rows:
        console.print("No rows. Run [bold]attntune tune[/bold] to measure this machine.")


@app.command("export")
def export_cmd(
    file: Path = typer.Argument(..., help="JSON file to write."),
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    system: bool = typer.Option(True, help="Include the shipped system cache."),
    include_stale: bool = typer.Option(False, help="Also export stale rows."),
) -> None:
    """Write the winners to a JSON file (validated rows only; stale ones on request)."""
    layers = open_layers(cache, system)
    keep = {"valid", "stale"} if include_stale else {"valid"}
    recs = [r.record for r in layers.effective().values() if r.status in keep and r.record is not None]
    doc = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
           "records": [json.loads(rec.model_dump_json()) for rec in recs]}
    file.write_text(json.dumps(doc, indent=1))
    console.print(f"exported {len(recs)} rows to {file}")


@app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON file written by export."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Target cache path or SQLAlchemy URL."),
    force: bool = typer.Option(False, help="Replace existing rows even when they are faster."),
    allow_stale: bool = typer.Option(False, help="Import rows whose software fingerprint does not match."),
) -> None:
    """Read winners from a JSON file into the user cache. Every record is validated first: malformed,
    unknown-variant and out-of-domain rows are rejected and reported, never written."""
    try:
        doc = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        err_console.print(f"[red]{file}: not valid JSON ({e})[/red]")
        raise typer.Exit(2)
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or not isinstance(doc.get("records"), list):
        err_console.print(f"[red]{file}: not an attntune export (expected format={EXPORT_FORMAT!r} with records)[/red]")
        raise typer.Exit(2)
    if doc.get("version", 0) > EXPORT_VERSION:
        err_console.print(f"[red]{file}: export version {doc.get('version')} is newer than this attntune[/red]")
        raise typer.Exit(2)
    target = CacheStore(cache) if cache else open_layers(None, system=False).user
    if target is None:
        err_console.print("[red]no writable cache[/red]")
        raise typer.Exit(2)
    written = kept = 0
    rejected: List[str] = []
    for i, raw in enumerate(doc["records"]):
        try:
            rec = WinnerRecord.model_validate(raw)
        except ValidationError as e:
            rejected.append(f"record {i}: malformed ({e.error_count()} errors: {e.errors()[0]['msg']})")
            continue
        verdict = judge(record_to_row(rec), "import")
        if verdict.status == "rejected" or (verdict.status == "stale" and not allow_stale):
            rejected.append(f"record {i} ({rec.key.short()}): {verdict.status}: {'; '.join(verdict.reasons)}")
            continue
        if target.upsert_winner(rec, force=force):
            written += 1
        else:
            kept += 1
    console.print(f"imported {written} rows into {target.url}; {kept} kept (existing row faster); "
                  f"{len(rejected)} rejected")
    for r in rejected:
        console.print(f"  [yellow]rejected[/yellow] {r}")
    if rejected and not written and not kept:
        raise typer.Exit(1)


@app.command()
def doctor(
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Device, versions, caches (valid/stale/rejected rows), and which variants can run here and why not."""
    import torch

    from attntune.device import default_device, device_fingerprint, software_fingerprint
    from attntune.kernels import UNAVAILABLE, registry
    from attntune.problem import AttentionProblem

    dev = default_device()
    fp = device_fingerprint(dev)
    sw = software_fingerprint(device_type=dev.type)
    layers = open_layers(cache, True)
    caches = []
    for label, st in layers.layers:
        rows = [judge(raw, label) for raw in layers._raw(label, st)]
        caches.append({
            "layer": label, "url": st.url, "readonly": st.readonly, "rows": len(rows),
            "valid": sum(r.status == "valid" for r in rows), "stale": sum(r.status == "stale" for r in rows),
            "rejected": sum(r.status == "rejected" for r in rows),
            "problems": [f"{r.key_id}: {r.status}: {'; '.join(r.reasons)}" for r in rows if r.status != "valid"][:20],
        })
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    probes = {
        "prefill": AttentionProblem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_kv=1024, head_dim=64,
                                    head_dim_v=64, dtype=dtype, device_type=dev.type, causal=True),
        "decode": AttentionProblem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_kv=4096, head_dim=128,
                                   head_dim_v=128, dtype=dtype, device_type=dev.type, kv_lens=True),
        "window": AttentionProblem(batch=1, heads_q=8, heads_kv=8, seqlen_q=4096, seqlen_kv=4096, head_dim=64,
                                   head_dim_v=64, dtype=dtype, device_type=dev.type, causal=True, window=(512, 0)),
    }
    variants = []
    for v in registry.all_variants():
        variants.append({"variant": v.name, "family": v.family, "exact": v.exact,
                         **{name: registry.reasons(v, p) for name, p in probes.items()}})
    report = {
        "device": fp.model_dump(), "software": sw.model_dump(exclude={"variant_hash"}),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "caches": caches, "variants": variants, "unavailable_modules": UNAVAILABLE,
    }
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    console.print(f"[bold]device[/bold]   {fp.label()}  (backend {fp.backend})")
    console.print("[bold]software[/bold] " + ", ".join(f"{k} {v}" for k, v in report["software"].items() if v))
    console.print(f"[bold]python[/bold]   {report['python']} on {report['platform']}")
    console.print(f"[bold]fp32 matmul precision[/bold] {report['float32_matmul_precision']}")
    t = Table(title="caches")
    for c in ("layer", "url", "rows", "valid", "stale", "rejected"):
        t.add_column(c, overflow="fold")
    for c in caches:
        t.add_row(c["layer"] + (" (ro)" if c["readonly"] else ""), c["url"], str(c["rows"]), str(c["valid"]),
                  str(c["stale"]), str(c["rejected"]))
    console.print(t if caches else "[yellow]no cache could be opened[/yellow]")
    for c in caches:
        for p in c["problems"]:
            console.print(f"  [yellow]{c['layer']}[/yellow] {p}")
    t = Table(title=f"variants on this device (probes: {', '.join(probes)})")
    for c in ("variant", "family", "exact", *probes):
        t.add_column(c, overflow="fold")
    for v in variants:
        t.add_row(v["variant"], v["family"], "yes" if v["exact"] else "no",
                  *["[green]ok[/green]" if not v[n] else "; ".join(v[n]) for n in probes])
    console.print(t)
    for mod, why in UNAVAILABLE.items():
        console.print(f"[yellow]unavailable[/yellow] {mod}: {why}")
