"""Inspection commands: ``show``, ``export``, ``import``, ``doctor``.

Heavy modules (the cache package imports torch; pydantic) are imported inside the commands: this module
is loaded by ``attntune --help``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attntune.cli import app
from attntune.cli.common import (LAYER_ORDER, CliError, check_cache_option, console, err_console, fmt_config,
                                 fmt_ms, layer_failures, more_line, open_target, read_layers, record_matches,
                                 row_json, user_layer_missing, write_output)

EXPORT_FORMAT = "attntune-cache"
EXPORT_VERSION = 1
STATUSES = ("valid", "stale", "rejected")
DOCTOR_PROBLEMS = 20  # problem rows listed per layer without --all


def _check_filters(dtype: Optional[str], mode: Optional[str]) -> None:
    """A filter no row can match is a typo ("No rows" said nothing about it)."""
    from attntune.problem import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise typer.BadParameter(f"expected one of {sorted(DTYPES)}", param_hint="--dtype")
    if mode is not None and mode not in ("fwd", "fwd_bwd"):
        raise typer.BadParameter("expected fwd or fwd_bwd", param_hint="--mode")


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
    """List tuned winners (the row that applies per key, user cache over shipped cache).

    Rows of another status than --status are counted under the table, never dropped silently."""
    if status not in ("all", *STATUSES):
        raise typer.BadParameter("must be valid, stale, rejected or all", param_hint="--status")
    _check_filters(dtype, mode)
    _, effective = read_layers(cache, system)
    matching = [r for r in effective.values()
                if record_matches(r.record, arch=arch, dtype=dtype, variant=variant, mode=mode)]
    rows = [r for r in matching if status == "all" or r.status == status]
    rows.sort(key=lambda r: (r.record.key.short() if r.record else r.key_id))
    if as_json:
        print(json.dumps([row_json(r) for r in rows], indent=2, default=str))
        return
    table = Table(title=f"attntune winners ({len(rows)} rows, status={status})", show_lines=False)
    for col in ("key", "arch", "variant", "config", "time", "TFLOP/s", "vs SDPA", "runner-up", "status", "from"):
        table.add_column(col, overflow="fold")
    here = _here()
    for r in rows:
        table.add_row(*map(escape, _show_cells(r, here)))  # cached text is data, never rich markup
    console.print(table)
    left_out = [r for r in matching if status != "all" and r.status != status]
    hidden = Counter(r.status for r in left_out)
    if hidden:
        console.print(_hidden_line(hidden) + _elsewhere(left_out))
    elif not rows:
        console.print("No rows. Run [bold]attntune tune[/bold] to measure this machine.")


def _hidden_line(hidden: Counter) -> str:
    """What ``--status`` left out, by status, and how to see it (stale rows: measured under other
    software, e.g. the shipped cache on another torch — they are the usual surprise)."""
    n = sum(hidden.values())
    counts = ", ".join(f"{hidden[s]} {s}" for s in STATUSES if hidden[s])
    first = next(s for s in STATUSES if hidden[s])
    return (f"{n} more {'row' if n == 1 else 'rows'} not shown ({counts}): see them with "
            f"[bold]--status all[/bold] (or --status {first}).")


def _elsewhere(rows) -> str:
    """How many of the rows ``show`` left out were tuned on other devices than this one (the shipped
    cache's GPU rows on a CPU machine: stale here by software versions, and of no use to this device anyway
    — except as a same-architecture *sibling*'s, see :func:`attntune.policies.index.CacheIndex.siblings`)."""
    here = _here()
    if here is None:
        return ""
    names = Counter(r.record.key.device.name for r in rows if r.record is not None and r.record.key.device != here)
    if not names:
        return ""
    n = sum(names.values())
    return (f" {n} of them {'was' if n == 1 else 'were'} tuned on other devices ("
            + ", ".join(f"{name}: {c}" for name, c in sorted(names.items())) + ").")


def _here():
    """This machine's device fingerprint, or None where it cannot be read (informational uses only: they
    must never fail a command)."""
    from attntune.device import default_device, device_fingerprint

    try:
        return device_fingerprint(default_device())
    except Exception:  # noqa: BLE001
        return None


def _status_cell(r, here) -> str:
    """A row's status for ``show``: a stale row of this device says whether dispatch uses it as a hint; one
    of a device of another backend or architecture says that it is not used here at all (its staleness is
    judged against this machine's software, which says nothing about it)."""
    if r.status == "valid":
        return r.status
    dev = r.record.key.device if r.record is not None else None
    if dev is not None and here is not None and not dev.same_arch(here):
        tag = " (another device: not used here)"
    else:
        tag = " (used as a hint)" if r.hint and (here is None or dev == here) else ""
    return f"{r.status}{tag}: {'; '.join(r.reasons)}"


def _show_cells(r, here=None) -> List[str]:
    rec = r.record
    if rec is None:
        return [r.key_id, "-", "-", "-", "-", "-", "-", "-", f"{r.status}: {'; '.join(r.reasons)}", r.origin]
    sp = rec.speedup
    # an FP8 or approximate row's error against the exact float result is part of what was chosen
    lossy = rec.rel_error is not None and (rec.key.kv_dtype is not None or rec.key.approx)
    return [rec.key.short(), rec.key.device.arch,
            rec.variant + (f" (rel error {rec.rel_error:.1e})" if lossy else ""), fmt_config(rec.config),
            fmt_ms(rec.median_ms, rec.spread, rec.measured_busy),
            f"{rec.tflops:.1f}" if rec.tflops else "-", f"{sp:.2f}x" if sp else "-", rec.runner_up or "-",
            _status_cell(r, here), r.origin]


@app.command("export")
def export_cmd(
    file: Path = typer.Argument(..., help="JSON file to write (- for standard output)."),
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    system: bool = typer.Option(True, help="Include the shipped system cache."),
    include_stale: bool = typer.Option(False, help="Also export stale rows."),
) -> None:
    """Write the winners to a JSON file (validated rows only; stale ones on request)."""
    layers, effective = read_layers(cache, system)
    keep = {"valid", "stale"} if include_stale else {"valid"}
    recs = [r.record for r in effective.values() if r.status in keep and r.record is not None]
    left = Counter(r.status for r in effective.values() if r.status not in keep or r.record is None)
    doc = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
           "records": [json.loads(rec.model_dump_json()) for rec in recs]}
    # a stream's reader (export -, a pipe) gets the JSON only: the command's own lines go to stderr
    say = console if write_output(file, json.dumps(doc, indent=1), layers) else err_console
    say.print(f"exported {len(recs)} rows to {file}", markup=False)
    if left:
        hint = "; --include-stale exports the stale ones" if left["stale"] and not include_stale else ""
        say.print(f"left out: {', '.join(f'{n} {s}' for s, n in sorted(left.items()))}{hint}")


def _same_row(stored: Dict[str, Any], rec) -> bool:
    """Whether the stored row is ``rec`` already (what decides a winner, and when it was measured)."""
    from attntune.cache.models import record_to_row

    new = record_to_row(rec)
    return all(stored.get(c) == new[c] for c in ("variant", "config_json", "median_ms", "fingerprint_json",
                                                  "created_at"))


@app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON file written by export."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Target cache path or SQLAlchemy URL."),
    force: bool = typer.Option(False, help="Replace existing rows even when they are faster."),
    allow_stale: bool = typer.Option(False, help="Import rows whose software fingerprint does not match."),
) -> None:
    """Read winners from a JSON file into the user cache (every record validated first).

    Malformed, unknown-variant and out-of-domain rows are rejected and reported, never written."""
    from pydantic import ValidationError

    from datetime import timedelta

    from attntune.cache import WinnerRecord, judge, user_cache_url, utcnow
    from attntune.cache.retry import is_locked, retry_locked
    from attntune.kernels import registry
    from attntune.cache.models import record_to_row

    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as e:
        # (ValueError: an integer past Python's digit limit; RecursionError: nesting past the parser's depth)
        raise CliError(f"{file}: not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or not isinstance(doc.get("records"), list):
        raise CliError(f"{file}: not an attntune export (expected format={EXPORT_FORMAT!r} with records)")
    version = doc.get("version", 0)
    if type(version) is not int or version < 0:
        raise CliError(f"{file}: export version must be a non-negative integer, got {version!r}")
    if version > EXPORT_VERSION:
        raise CliError(f"{file}: export version {version} is newer than this attntune")
    check_cache_option(cache)
    target = open_target(cache or user_cache_url())
    written = kept = same = 0
    rejected: List[str] = []
    for i, raw in enumerate(doc["records"]):
        try:
            rec = WinnerRecord.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "record"
            rejected.append(f"record {i}: malformed ({e.error_count()} error(s); {where}: "
                            f"{first['msg'].splitlines()[0]})")
            continue
        if rec.created_at > utcnow() + timedelta(days=1):  # measured in the future: a corrupt or forged row
            rejected.append(f"record {i} ({rec.key.short()}): created_at {rec.created_at.isoformat()} is in the "
                            "future")
            continue
        verdict = judge(record_to_row(rec), "import", registry)
        if verdict.status == "rejected" or (verdict.status == "stale" and not allow_stale):
            rejected.append(f"record {i} ({rec.key.short()}): {verdict.status}: {'; '.join(verdict.reasons)}")
            continue
        # A stored row that is not valid (stale, rejected) never keeps its place by being "faster": the
        # tuner replaces such rows too (it stayed, and the key was never served from a valid row)
        try:  # another writer (a tune) may hold the lock past the busy timeout: retried, then named
            stored = retry_locked(target.raw_winner, rec.key_id)
            if stored is not None and _same_row(stored, rec):
                same += 1  # importing a file twice changes nothing, and says so
                continue
            replace = force or (stored is not None and judge(stored, "user", registry).status != "valid")
            done = retry_locked(target.upsert_winner, rec, force=replace)
        except Exception as e:  # noqa: BLE001
            if not is_locked(e):
                raise
            raise CliError(f"cache {target.shown}: locked by another process; {written + kept + same} of "
                           f"{len(doc['records'])} records were settled (each is committed on its own): run "
                           "the same import again when the other process is done") from None
        if done:
            written += 1
        else:
            kept += 1
    console.print(f"imported {written} rows into {target.shown}; {kept} kept (existing row faster); "
                  + (f"{same} already there; " if same else "") + f"{len(rejected)} rejected")
    for r in rejected:
        console.print(f"  [yellow]rejected[/yellow] {escape(r)}")
    if rejected and not written and not kept and not same:
        raise CliError(f"{file}: every record was rejected; nothing imported")


def _layer_reports(layers, rows, user_url: str, explicit: bool, fp=None) -> List[Dict[str, Any]]:
    """One entry per configured cache layer, in lookup order (user, system): ``state`` ok (with row
    counts and every problem row), unusable (with the reason), or absent (with why). ``explicit``: the
    user cache was named by --cache. With ``fp`` (this device), rows of other devices are counted apart
    (see :func:`_layer_entry`)."""
    by_layer: Dict[str, list] = {}
    for r in rows:
        by_layer.setdefault(r.origin, []).append(r)
    failures = {f.label: f for f in layer_failures(layers)}  # a failure beats an opened-then-unreadable layer
    out = [_layer_entry(label, st.url, "ok", rows=by_layer.get(label, []), fp=fp)
           for label, st in layers.layers if label not in failures]
    out += [_layer_entry(f.label, f.url, "unusable", reason=f.reason) for f in failures.values()]
    if user_layer_missing(layers):  # named by --cache: a typo, not a fresh machine
        out.append(_layer_entry("user", user_url, "unusable", reason="no such cache file") if explicit else
                   _layer_entry("user", user_url, "absent", reason="no such file yet (attntune tune creates it)"))
    if not any(c["layer"] == "system" for c in out):
        out.append(_layer_entry("system", None, "absent", reason=_why_no_system()))
    rank = {label: i for i, label in enumerate(LAYER_ORDER)}
    return sorted(out, key=lambda c: rank.get(c["layer"], len(rank)))


def _layer_entry(label: str, url: Optional[str], state: str, reason: Optional[str] = None,
                 rows: Optional[list] = None, fp=None) -> Dict[str, Any]:
    """A layer as doctor reports it (counts are None unless the layer was read). ``readonly`` is the
    layer's role: the shipped system cache is never written.

    With ``fp`` (this device), the rows of devices of another backend or architecture — which dispatch
    here never reads, not even as sibling rows — are counted per device in ``other_devices`` instead of
    being listed one by one in ``problems`` (judged against this machine's software they all read
    "stale", which says nothing about them); ``hints`` counts only this device's rows, the only hints
    dispatch here uses."""
    rows_here, other = list(rows or []), Counter()
    if fp is not None:
        rows_here = []
        for r in rows or []:
            d = r.record.key.device if r.record is not None else None
            if d is not None and not d.same_arch(fp):
                other[d.label()] += 1
            else:
                rows_here.append(r)
    n = Counter(r.status for r in rows or [])
    return {"layer": label, "url": url, "state": state, "reason": reason, "readonly": label != "user",
            "rows": None if rows is None else len(rows), **{s: None if rows is None else n[s] for s in STATUSES},
            "other_devices": None if rows is None else dict(sorted(other.items())),
            # a hint has a record (a rejected row, maybe unreadable, never is one)
            "hints": None if rows is None else sum(1 for r in rows_here
                                                   if r.hint and (fp is None or r.record.key.device == fp)),
            "busy": None if rows is None else sum(1 for r in rows if r.status == "valid" and r.record is not None
                                                  and r.record.measured_busy),
            "problems": [f"{r.key_id}: {r.status}: {'; '.join(r.reasons)}" for r in rows_here
                         if r.status != "valid"]}


def _why_no_system() -> str:
    from attntune.cache.layered import shipped_cache_candidates

    if os.environ.get("ATTNTUNE_SYSTEM_CACHE") == "":
        return "disabled (ATTNTUNE_SYSTEM_CACHE is empty)"
    return "no shipped cache.db found (looked in " + ", ".join(map(str, shipped_cache_candidates())) + ")"


def _print_layers(caches: List[Dict[str, Any]], show_all: bool) -> None:
    t = Table(title="caches")
    for c in ("layer", "url", "rows", "valid", "stale", "rejected"):
        t.add_column(c, overflow="fold")
    for c in caches:
        label = c["layer"] + (" (ro)" if c["readonly"] else "")
        if c["state"] == "ok":
            t.add_row(label, c["url"], *(str(c[k]) for k in ("rows", *STATUSES)))
        else:
            colour = "red" if c["state"] == "unusable" else "yellow"
            t.add_row(label, c["url"] or "-", f"[{colour}]{c['state']}[/{colour}]: {escape(c['reason'])}",
                      "-", "-", "-")
    console.print(t)
    for c in caches:
        shown = c["problems"] if show_all else c["problems"][:DOCTOR_PROBLEMS]
        for p in shown:
            console.print(f"  [yellow]{c['layer']}[/yellow] {escape(p)}")
        if len(shown) < len(c["problems"]):
            console.print(f"  {more_line(len(c['problems']) - len(shown))}")
        other = c.get("other_devices")
        if other:  # one line, not one per row: dispatch on this device never reads them
            console.print(f"  [yellow]{c['layer']}[/yellow] {sum(other.values())} rows of other devices ("
                          + escape(", ".join(f"{n}: {k}" for n, k in other.items()))
                          + "): not used on this device")


def _fail_on_unusable(caches: List[Dict[str, Any]]) -> None:
    """After the full report: a non-zero exit (and one line) when a configured layer is unusable, so
    that ``attntune doctor`` can gate a deployment."""
    bad = [c for c in caches if c["state"] == "unusable"]
    if bad:
        raise CliError(f"{len(bad)} cache layer(s) unusable: "
                       + "; ".join(f"{c['layer']} {c['url']} ({c['reason']})" for c in bad))


def _tf32_line(device_type: str) -> dict:
    """Whether float32 calls here run their dots in TF32 (their own tune key) and how to change it."""
    from attntune.tolerances import tf32_active, tf32_supported

    if not tf32_supported(device_type):
        why = ("float32 calls run exact float32 dots (ROCm kernels keep IEEE float32)" if device_type == "cuda"
               else "float32 calls run exact float32 (no TF32 on this device)")
        return {"active": False, "supported": False, "why": why}
    if tf32_active("float32", device_type):
        return {"active": True, "supported": True,
                "why": "float32 calls use TF32 dots (keys marked tf32; tuned by the default suite)"}
    return {"active": False, "supported": True,
            "why": "float32 calls run exact float32; torch.set_float32_matmul_precision('high') lets them use "
                   "TF32 dots (their own keys: ~4.7x SDPA forward on an H200, benchmarks/results/probe_tf32_h200.json)"}


def _device_rows(rows, fp) -> Dict[str, Any]:
    """Valid rows of this device, and per other device of its backend and architecture (the *sibling*
    rows dispatch falls back to: :meth:`attntune.policies.index.CacheIndex.siblings`)."""
    mine, sib, seen = 0, Counter(), set()
    for r in rows:
        if r.status != "valid" or r.record is None or r.key_id in seen:  # a key in both layers counts once
            continue
        seen.add(r.key_id)
        d = r.record.key.device
        if d == fp:
            mine += 1
        elif d.same_arch(fp):
            sib[f"{d.name} ({d.units} units)"] += 1
    return {"this_device": mine, "siblings": dict(sorted(sib.items()))}


@app.command()
def doctor(
    cache: Optional[str] = typer.Option(None, "--cache", help="User cache path or SQLAlchemy URL."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    show_all: bool = typer.Option(False, "--all", help=f"List every problem row (default: the first "
                                  f"{DOCTOR_PROBLEMS} per cache layer)."),
) -> None:
    """Device, versions, every cache layer (row counts, or why it cannot be used), variants here.

    One line per configured cache layer (user, system): rows valid/stale/rejected, or why it cannot
    be used. Then which variants can run on this device and why not. Exits 2 when a cache layer is
    unusable."""
    import torch

    from attntune.cache import user_cache_url
    from attntune.device import default_device, device_fingerprint, software_fingerprint
    from attntune.kernels import UNAVAILABLE, registry
    from attntune.problem import AttentionProblem

    dev = default_device()
    fp = device_fingerprint(dev)
    sw = software_fingerprint(device_type=dev.type)
    layers, rows = read_layers(cache, True, strict=False, effective=False)
    caches = _layer_reports(layers, rows, cache or user_cache_url(), explicit=cache is not None, fp=fp)
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    probes = {
        "prefill": AttentionProblem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_kv=1024, head_dim=64,
                                    head_dim_v=64, dtype=dtype, device_type=dev.type, causal=True),
        "decode": AttentionProblem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_kv=4096, head_dim=128,
                                   head_dim_v=128, dtype=dtype, device_type=dev.type, kv_lens=True),
        "window": AttentionProblem(batch=1, heads_q=8, heads_kv=8, seqlen_q=4096, seqlen_kv=4096, head_dim=64,
                                   head_dim_v=64, dtype=dtype, device_type=dev.type, causal=True, window=(512, 0)),
        # FP8 KV-cache decode: which variants read the codes here (ROCm's format on ROCm)
        "fp8 decode": AttentionProblem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_kv=4096, head_dim=128,
                                       head_dim_v=128, dtype="bfloat16", device_type=dev.type, kv_lens=True,
                                       kv_dtype="float8_e4m3fnuz" if torch.version.hip else "float8_e4m3fn"),
    }
    variants = []
    for v in registry.all_variants():
        variants.append({"variant": v.name, "family": v.family, "exact": v.exact,
                         **{name: registry.reasons(v, p) for name, p in probes.items()}})
    report = {
        "device": fp.model_dump(), "software": sw.model_dump(exclude={"variant_hash"}),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "float32_tf32": _tf32_line(dev.type),
        "caches": caches, "device_rows": _device_rows(rows, fp), "variants": variants,
        "unavailable_modules": UNAVAILABLE,
    }
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        _fail_on_unusable(caches)
        return
    console.print(f"[bold]device[/bold]   {fp.label()}  (backend {fp.backend})")
    console.print("[bold]software[/bold] " + ", ".join(f"{k} {v}" for k, v in report["software"].items() if v))
    console.print(f"[bold]python[/bold]   {report['python']} on {report['platform']}")
    console.print(f"[bold]fp32 matmul precision[/bold] {report['float32_matmul_precision']}: "
                  f"{report['float32_tf32']['why']}")
    _print_layers(caches, show_all)
    hints = sum(c.get("hints") or 0 for c in caches)
    if hints:  # one info line: stale by versions only, still used (attntune.policies.policy)
        console.print(f"[bold]hints[/bold]    {hints} stale rows were tuned under other torch/triton/CUDA versions "
                      "with today's variant sources: dispatch uses them as hints (below exact rows); "
                      "`attntune tune --revalidate` re-times them for this software")
    sib = report["device_rows"]["siblings"]
    if sib:  # one info line: other cards of this architecture (attntune.policies.policy, source "sibling")
        console.print(f"[bold]siblings[/bold] {report['device_rows']['this_device']} valid rows were tuned on this "
                      f"device; {sum(sib.values())} on other {fp.arch} devices ("
                      + ", ".join(f"{n}: {c}" for n, c in sib.items())
                      + ") stand in for keys this device has no usable row of its own for; `attntune tune` "
                        "measures them here")
    busy = sum(c.get("busy") or 0 for c in caches)
    if busy:  # one info line (WinnerRecord.busy): valid rows whose times another process inflated
        console.print(f"[bold]busy CPU[/bold] {busy} rows were measured while other processes kept the tuner "
                      "waiting for a CPU: their times are inflated; `attntune tune` re-times them "
                      "(run it when the machine is quiet)")
    t = Table(title=f"variants on this device (probes: {', '.join(probes)})")
    for c in ("variant", "family", "exact", *probes):
        t.add_column(c, overflow="fold")
    for v in variants:
        t.add_row(v["variant"], v["family"], "yes" if v["exact"] else "no",
                  *["[green]ok[/green]" if not v[n] else "; ".join(v[n]) for n in probes])
    console.print(t)
    for mod, why in UNAVAILABLE.items():
        console.print(f"[yellow]unavailable[/yellow] {mod}: {why}")
    _fail_on_unusable(caches)
