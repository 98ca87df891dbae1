"""``attntune tune`` and ``attntune suites``: measure this machine and fill the user cache.

The tuner (optuna, torch, triton) and rich's progress bar are imported inside the commands: this module
is loaded by ``attntune --help``.
"""

from __future__ import annotations

import signal
from typing import Dict, List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attntune.cli import app
from attntune.cli.errors import cause_hint, is_cache_error, one_line
from attntune.cli.common import (CliError, check_cache_option, console, err_console, fmt_ms, open_target,
                                 read_layers)
from attntune.cli.common import parse_device as _device

SHAPE_HELP = (
    "One problem as field=value pairs (repeatable), e.g. "
    "b=4,hq=32,hkv=8,sq=2048,skv=2048,d=128,causal=1,window=256:0,kv_lens=1,dtype=bfloat16. "
    "Fields: b, hq, hkv (default hq), sq, skv (default sq), d, dv (default d), causal 0/1, "
    "align br|tl, window LEFT:RIGHT (-1 unbounded), kv_lens 0/1, dtype, mode fwd|fwd_bwd, approx 0/1. "
    "hq, sq and d are required."
)


def _gpus(spec: Optional[str]) -> Optional[List[int]]:
    if spec is None:
        return None
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            raise typer.BadParameter(f"{part!r} is not a GPU index (expected e.g. 0,1)", param_hint="--gpus")
        out.append(int(part))
    if not out:
        raise typer.BadParameter("empty list", param_hint="--gpus")
    return out


def _problems_from_args(suite: Optional[str], shape: Optional[List[str]], dev, dtype: Optional[str],
                        mode: Optional[str]) -> list:
    """The problems named by ``--shape`` (each parsed, errors naming the option) or by ``--suite``
    (default: ``demo`` on the CPU, ``default`` on a GPU)."""
    from attntune.autotune.shapes import ShapeSpecError, parse_shape
    from attntune.autotune.suites import default_dtype, get_suite, materialize

    if shape:
        problems = []
        for spec in shape:
            try:
                problems.append(
                    parse_shape(spec, device_type=dev.type, dtype=dtype or default_dtype(dev.type), mode=mode)
                )
            except ShapeSpecError as e:
                raise typer.BadParameter(f"{spec!r}: {e}", param_hint="--shape") from None
        return problems
    name = suite or ("demo" if dev.type == "cpu" else "default")
    try:
        templates = get_suite(name).templates()
    except KeyError as e:
        raise typer.BadParameter(str(e.args[0]), param_hint="--suite") from None
    return materialize(templates, dev.type, dtype, mode)


def _problems_from_misses(store, device) -> tuple:
    """Problems of the misses recorded for this device (other devices' misses are left alone)."""
    from attntune.device import device_fingerprint
    from attntune.key import TuneKey

    fp = device_fingerprint(device)
    problems, key_ids, foreign = [], [], 0
    for m in store.misses():
        try:
            key = TuneKey.model_validate_json(m["key_json"])
        except Exception:  # noqa: BLE001 — a malformed miss row is skipped, not executed
            continue
        if key.device != fp:
            foreign += 1
            continue
        problems.append(key.representative())
        key_ids.append(key.key_id)
    return problems, key_ids, foreign


class _ProgressView:
    """Turns tuner events into a rich progress bar: one step per key, the key in progress and the
    best time so far."""

    def __init__(self, progress):
        self.progress = progress
        self.task = progress.add_task("starting", total=None, best="")
        self.done: set = set()
        self.errors: List[str] = []

    def __call__(self, ev: Dict) -> None:
        kind = ev["type"]
        if kind == "keys":
            self.progress.update(self.task, total=ev["total"])
        elif kind == "key_start":
            w = f"[w{ev['worker']}] " if ev.get("worker") else ""
            self.progress.update(self.task, description=f"{w}{ev['key']}", best="")
        elif kind == "trial":
            best = ""
            if ev.get("best_variant"):
                best = f"best {ev['best_variant']} {fmt_ms(ev['best_ms'])}"
            self.progress.update(self.task, best=f"trial {ev['n']}/{ev['budget']}  {best}")
        elif kind == "key_waiting":  # another live tuner holds the key: say whom we wait for, and how long
            self.progress.console.print(f"waiting for {ev['key']}: claimed by {ev['owner']} (a live process) "
                                        f"until {ev['until']} UTC; other keys go on meanwhile")
        elif kind in ("key_done", "key_skipped"):
            if ev["key_id"] not in self.done:
                self.done.add(ev["key_id"])
                self.progress.advance(self.task)
        elif kind == "worker_errors":
            self.errors.extend(ev["errors"])


def _progress():
    """The tuning progress bar: key in progress, keys done, elapsed, eta, best time so far."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    TextColumn("{task.fields[best]}"), console=console, transient=False)


def _summary(results) -> Table:
    t = Table(title="attntune tune")
    for c in ("key", "winner", "time", "vs SDPA default", "trials", "failed", "status"):
        t.add_column(c, overflow="fold")
    for r in results:
        rec = r.record
        sp = rec.speedup if rec else None
        status = (
            r.status if not r.reason or r.status == "tuned" else f"{r.status}: {r.reason.splitlines()[0]}"
        )
        t.add_row(  # key text, variant names and error messages are data, never rich markup
            escape(r.key.short()),
            escape(rec.variant) if rec else "-",
            fmt_ms(rec.median_ms, rec.spread, rec.measured_busy) if rec else "-",
            f"{sp:.2f}x" if sp else "-",
            str(r.trials if r.status != "skipped" else (rec.trials if rec else 0)),
            str(r.failed),
            escape(status),
        )
    return t


@app.command()
def tune(
    suite: Optional[str] = typer.Option(
        None,
        "--suite",
        help="Suite to tune (see `attntune suites`). Default: `default` on a GPU, `demo` on the CPU.",
    ),
    shape: Optional[List[str]] = typer.Option(None, "--shape", help=SHAPE_HELP),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="float32, float16, bfloat16 (default: float32 on the CPU, bfloat16 on a GPU)."
    ),
    mode: Optional[str] = typer.Option(None, "--mode", help="fwd or fwd_bwd: override the suite's modes."),
    cache: Optional[str] = typer.Option(
        None, "--cache", help="Target cache path or SQLAlchemy URL (default: the user cache, ATTNTUNE_CACHE)."
    ),
    storage: Optional[str] = typer.Option(
        None,
        "--storage",
        help="Optuna storage URL (default: optuna.db "
        "next to the cache); open it with optuna-dashboard. 'memory': none.",
    ),
    trials: Optional[int] = typer.Option(
        None, "--trials", min=1,
        help="Measured configs per key of the tunable (Triton) variants (default 24 on a GPU, 12 on the CPU); "
        "each fixed variant (SDPA backends, eager, flex) is measured once on top.",
    ),
    refine: Optional[int] = typer.Option(
        None, "--refine", min=0,
        help="After the trial budget, climb from the winner by one-step moves (and sibling variants) until "
        "a local optimum or this many extra trials (default 12; 0 = off).",
    ),
    time_limit: Optional[float] = typer.Option(
        None,
        "--time-limit",
        min=1,
        help="Wall seconds for the whole run; the key in progress is resumed by the next run.",
    ),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", help="GPU indices, one worker process each (default: all visible GPUs)."
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (on one GPU, or the CPU)."),
    from_misses: bool = typer.Option(
        False,
        "--from-misses",
        help="Tune the keys recorded as misses at run time in the cache (and clear them).",
    ),
    force: bool = typer.Option(False, "--force", help="Re-tune keys that already have a valid winner."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the inputs and the samplers."),
    claim_ttl: float = typer.Option(
        120.0,
        "--claim-ttl",
        min=1,
        help="Seconds before a dead worker's key claim expires and another worker retakes the key.",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="Few timing repetitions (smoke tests, CI): faster, less precise rankings."
    ),
    revalidate: bool = typer.Option(
        False,
        "--revalidate",
        help="Re-time the hints of this device (rows tuned under other torch/triton/CUDA versions, e.g. "
        "the shipped cache after an upgrade) against their runner-up and SDPA, into the target cache.",
    ),
) -> None:
    """Tune attention variants for a suite of problem keys (or given shapes) on this machine.

    Resumable: finished keys are kept (skipped on the next run unless --force) and a key interrupted
    mid-way continues from its optuna study. Ctrl-C stops cleanly.

    Example: attntune tune --shape b=4,hq=32,hkv=8,sq=2048,d=128,causal=1
    --shape hq=32,hkv=8,sq=1,skv=8192,d=128,kv_lens=1
    """
    from attntune.autotune.runner import Interrupted, run_tuning, stop_signals_as_interrupt
    from attntune.autotune.sweep import FatalDeviceError
    from attntune.autotune.timing import TimingOptions
    from attntune.cache import user_cache_url
    from attntune.problem import DTYPES

    dev = _device(device)
    gpu_list = _gpus(gpus)
    if gpu_list is not None and dev.type != "cuda":
        raise typer.BadParameter("--gpus needs --device cuda", param_hint="--gpus")
    if dtype is not None and dtype not in DTYPES:
        raise typer.BadParameter(f"expected one of {sorted(DTYPES)}", param_hint="--dtype")
    if mode is not None and mode not in ("fwd", "fwd_bwd"):
        raise typer.BadParameter("expected fwd or fwd_bwd", param_hint="--mode")
    if from_misses and (suite or shape):
        raise typer.BadParameter("cannot be combined with --suite or --shape", param_hint="--from-misses")
    if suite and shape:
        raise typer.BadParameter("give --suite or --shape, not both", param_hint="--shape")
    check_cache_option(cache)
    if storage:
        from attntune.autotune.study import storage_problem

        why = storage_problem(storage)
        if why:
            raise typer.BadParameter(f"{why} (leave --storage out for optuna.db next to the cache)",
                                     param_hint="--storage")
    if suite is not None and not suite.strip():
        raise typer.BadParameter("is empty (an unset variable?); leave it out for the device's default suite",
                                 param_hint="--suite")
    cache_url = cache or user_cache_url()
    if revalidate:
        if suite or shape or from_misses or force:
            raise typer.BadParameter("cannot be combined with --suite, --shape, --from-misses or --force",
                                     param_hint="--revalidate")
        _revalidate(cache_url, dev, TimingOptions.quick() if quick else None)
        return
    problems = None if from_misses else _problems_from_args(suite, shape, dev, dtype, mode)
    # Before anything is measured: a cache that cannot be written fails now, in one line, rather than
    # after the first key's minutes of tuning.
    store = open_target(cache_url)
    misses = _problems_from_misses(store, dev) if from_misses else None
    store.dispose()
    miss_ids: List[str] = []
    if misses is not None:
        problems, miss_ids, foreign = misses
        if foreign:
            console.print(f"{foreign} recorded misses belong to other devices; left for them")
        if not problems:
            console.print("No misses recorded for this device.")
            return

    progress = _progress()
    view = _ProgressView(progress)
    interrupted = False
    previous_handlers = stop_signals_as_interrupt()
    try:
        with progress:
            results = run_tuning(
                problems,
                cache=cache_url,
                storage=storage,
                trials=trials,
                time_limit=time_limit,
                force=force,
                workers=workers,
                gpus=gpu_list,
                seed=seed,
                claim_ttl=claim_ttl,
                timing=TimingOptions.quick() if quick else None,
                on_event=view,
                refine=refine,
            )
    except Interrupted as e:
        results, interrupted = e.results, True
    except FatalDeviceError as e:
        err_console.print(
            f"[red]{escape(str(e))}[/red]\nThe failing config is recorded as a failed trial; run the same "
            "command again to continue in a fresh process."
        )
        raise typer.Exit(1)
    except ValueError as e:  # the tuner refusing its arguments (e.g. several workers, no shared storage)
        raise CliError(str(e)) from None
    except Exception as e:  # noqa: BLE001 — a database error mid-run (a full disk): name the cache
        if not is_cache_error(e):
            raise
        raise CliError(f"{_cache_shown(cache_url)}: {one_line(e)} (the keys finished before it are kept; run "
                       "the same command again to resume the rest)") from None
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    console.print(_summary(results))
    tuned = sum(r.status == "tuned" for r in results)
    console.print(
        f"{tuned} keys tuned, {sum(r.status == 'skipped' for r in results)} already valid, "
        f"{sum(r.status == 'no-winner' for r in results)} without any passing variant; cache {cache_url}"
    )
    _say_busy(results, workers if dev.type == "cpu" else 1)
    if from_misses:
        _clear_settled_misses(results, miss_ids, cache_url)
    for e in view.errors:
        err_console.print(f"[red]{escape(e)}[/red]")
    if interrupted:
        console.print(
            "[yellow]interrupted[/yellow]: finished keys are kept; run the same command again to "
            "resume the rest."
        )
        raise typer.Exit(130)
    if view.errors:
        raise typer.Exit(1)
    _fail_if_nothing_done(results)
    _fail_on_key_errors(results, cache_url)


#: Outcomes a rerun would not change: the miss is settled and cleared. A key that ended without any passing
#: variant is cleared too (retrying it on every ``--from-misses`` run would cost its tuning time again for
#: the same result; the runtime records it again when a model calls it). Unfinished keys (time limit,
#: interrupt, another worker's claim) and errors stay for the next run.
SETTLED = ("tuned", "skipped", "done-elsewhere", "no-winner")


def _clear_settled_misses(results, miss_ids: List[str], cache_url: str) -> None:
    ids = set(miss_ids)
    done = [r.key_id for r in results if r.status in SETTLED and r.key_id in ids]
    if not done:
        return
    from attntune.cache import CacheStore

    store = CacheStore(cache_url)
    store.clear_misses(done)
    store.dispose()
    hopeless = sum(r.status == "no-winner" and r.key_id in ids for r in results)
    console.print(f"cleared {len(done)} misses" + (f" ({hopeless} without a passing variant: see the reasons above; "
                                                   "recorded again if a model calls them again)" if hopeless else ""))


def _cache_shown(cache_url: str) -> str:
    """The target cache as messages name it (passwords masked)."""
    from attntune.cache.store import display_url, normalize_url

    return f"cache {display_url(normalize_url(cache_url))}"


def _fail_on_key_errors(results, cache_url: str) -> None:
    """Keys that ended in an error (the tuner raised: a bug, or a database that failed mid-run — a full
    disk) are failures even when other keys finished: one line naming the first error (the cache too when
    it is a database error, with the fix of its cause) and exit 1. Unfinished keys (a time limit) and keys
    without a passing variant are outcomes, not errors."""
    errors = [r for r in results if r.status == "error"]
    if not errors:
        return
    first = (errors[0].reason or "").splitlines()[0]
    from attntune.cache.causes import cause_of

    where = f"{_cache_shown(cache_url)}: " if cause_of(first) is not None else ""
    line = (f"{len(errors)} of {len(results)} keys failed ({where}{first}); the others are kept, and the same "
            "command resumes the failed ones")
    err_console.print(f"attntune: error: {line}{cause_hint(first)}", markup=False, highlight=False)
    raise typer.Exit(1)


def _say_busy(results, workers: int) -> None:
    """One line when keys tuned now were measured on a busy CPU (``WinnerRecord.measured_busy``)."""
    busy = [r.record for r in results if r.status == "tuned" and r.record is not None and r.record.measured_busy]
    if busy:
        worst = max(rec.busy for rec in busy)
        ours = f" (--workers {workers} on the CPU: the workers compete for the same cores)" if workers > 1 else ""
        console.print(
            f"[yellow]busy CPU[/yellow]: {len(busy)} of the keys tuned now were measured while other processes"
            f"{ours} kept the tuner waiting for a CPU (up to {worst * 100:.0f}% of a measurement): their times "
            "are inflated, and only a clear win over SDPA's choice was stored. Run `attntune tune` again when "
            "the machine is quiet: it re-times them (a faster measurement replaces each)."
        )


def _revalidate(cache_url: str, dev, timing) -> None:
    """``tune --revalidate``: every hint of this device re-timed into the target cache."""
    from attntune.autotune.revalidate import hints_for, revalidate

    store = open_target(cache_url)
    layers, _ = read_layers(cache_url)
    try:
        hints = hints_for(layers, dev)
        if not hints:
            console.print("No hints for this device: every cached row of it is valid, or none exists.")
            return
        progress = _progress()
        view = _ProgressView(progress)
        with progress:
            results = revalidate(hints, store, dev, timing, on_event=view)
    finally:
        layers.close()
        store.dispose()
    console.print(_summary(results))
    console.print(f"{sum(r.status == 'tuned' for r in results)} of {len(results)} hints revalidated into "
                  f"{cache_url}")
    _fail_if_nothing_done(results)


def _fail_if_nothing_done(results) -> None:
    """A run that leaves no key with a valid winner (every key unfinished, without a passing variant, or
    failed) did not do what was asked: say why in one line and exit 1. Skipped keys (already valid) and
    keys another worker finished count as done."""
    done = {"tuned", "skipped", "done-elsewhere"}
    if not results or any(r.status in done for r in results):
        return
    why: dict = {}
    for r in results:
        reason = (r.reason or r.status).splitlines()[0]
        why[f"{r.status}: {reason}"] = why.get(f"{r.status}: {reason}", 0) + 1
    worst = max(why, key=why.get)
    err_console.print(f"attntune: error: 0 of {len(results)} keys got a winner ({worst}"
                      + (f"; and {len(why) - 1} other reasons" if len(why) > 1 else "") + ")",
                      markup=False, highlight=False)
    raise typer.Exit(1)


@app.command()
def suites(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the named suites `attntune tune --suite` accepts."""
    import json

    from attntune.autotune.suites import SUITES

    if as_json:
        print(
            json.dumps(
                {
                    n: {"description": s.description, "problems": len(s.templates())}
                    for n, s in SUITES.items()
                },
                indent=2,
            )
        )
        return
    t = Table(title="attntune suites")
    for c in ("suite", "problems", "description"):
        t.add_column(c, overflow="fold")
    for n, s in SUITES.items():
        t.add_row(n, str(len(s.templates())), s.description)
    console.print(t)
