"""Pydantic models of what the cache holds, and the validation every row passes before use."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Dict, List, Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from attntune.device import SoftwareFingerprint, software_fingerprint
from attntune.key import TuneKey, config_key


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


#: a row whose ``busy`` share is above this was measured on a busy CPU: shown as such, re-timed by the
#: next ``attntune tune`` (replaced only by a faster measurement)
BUSY_RETUNE = 0.05


class WinnerRecord(BaseModel):
    """The winner of one key, as stored (and as exported to JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: TuneKey
    variant: str
    config: Dict[str, Any]
    median_ms: float
    tflops: Optional[float] = None
    tbps: Optional[float] = None
    runner_up: Optional[str] = None
    runner_up_config: Optional[Dict[str, Any]] = None
    runner_up_ms: Optional[float] = None
    sdpa_default_ms: Optional[float] = None
    max_error: Optional[float] = None
    #: relative error ||out - ref|| / ||ref|| on the tuning inputs (the figure of merit of approximate
    #: variants; recorded for exact ones too)
    rel_error: Optional[float] = None
    #: relative noise of ``median_ms`` from the confirmation round (:mod:`attntune.autotune.confirm`);
    #: None for rows tuned before it existed
    spread: Optional[float] = None
    #: CPU keys: measured on a busy CPU — the largest share of a confirmation round's time that the
    #: tuner's threads spent waiting for a CPU (other processes held them), over the rounds that had too
    #: few undisturbed calls (:mod:`attntune.autotune.cpuwait`). 0.0: every round had enough; None: not
    #: known (GPU keys, no run-queue figures, rows tuned before it existed). A busy row's times are
    #: inflated; ``attntune tune`` re-times it (:data:`BUSY_RETUNE`).
    busy: Optional[float] = None
    fingerprint: SoftwareFingerprint
    trials: int = 0
    tuning_seconds: float = 0.0
    created_at: datetime

    @field_validator("median_ms", mode="before")
    @classmethod
    def _a_number(cls, v):
        # pydantic's lax mode read true as 1.0 ms and "0.001" as a time (audit: imported as valid rows)
        if isinstance(v, (bool, str)):
            raise ValueError(f"median_ms must be a number of milliseconds, got {type(v).__name__} {v!r}")
        return v

    @field_validator("median_ms")
    @classmethod
    def _positive(cls, v: float) -> float:
        # >= 1e-6 ms (1 ns): no attention call is faster; 1e-320 showed as 0.0µs and "infx" and could never
        # be beaten by a re-tune
        if not v >= 1e-6 or v != v or v == float("inf"):
            raise ValueError(f"median_ms must be a positive finite time (>= 1 ns), got {v}")
        return v

    @field_validator("tflops", "tbps", "runner_up_ms", "sdpa_default_ms", "max_error", "rel_error", "spread",
                     "tuning_seconds")
    @classmethod
    def _finite(cls, v: Optional[float]) -> Optional[float]:
        # an imported "tflops": Infinity was stored and shown as is; a measured figure is finite and >= 0
        if v is not None and not (v >= 0 and v != float("inf")):
            raise ValueError(f"must be a finite number >= 0, got {v}")
        return v

    @field_validator("busy")
    @classmethod
    def _share(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not (0.0 <= v <= 1.0):
            raise ValueError(f"must be a share between 0 and 1, got {v}")
        return v

    @property
    def measured_busy(self) -> bool:
        """Measured on a CPU too busy to time it truly (:attr:`busy` above :data:`BUSY_RETUNE`)."""
        return self.busy is not None and self.busy > BUSY_RETUNE

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def speedup(self) -> Optional[float]:
        if self.sdpa_default_ms:
            return self.sdpa_default_ms / self.median_ms
        return None


Status = Literal["valid", "stale", "rejected"]


class CachedRow(BaseModel):
    """A row read back from one cache layer, with its verdict."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    origin: str  # which layer: "user", "system", or a URL
    status: Status
    reasons: List[str] = []
    record: Optional[WinnerRecord] = None
    #: a stale row whose variant source is unchanged (only torch/triton/CUDA versions differ): the
    #: runtime uses it as a *hint* — below an exact valid row, above nearest buckets and heuristics —
    #: and ``attntune tune --revalidate`` re-times it into a valid row
    hint: bool = False


def row_to_record(row: Dict[str, Any]) -> WinnerRecord:
    """Parse a raw DB row (dict of columns). Raises ValueError/ValidationError on malformed content."""
    return WinnerRecord(
        key=TuneKey.model_validate_json(row["key_json"]),
        variant=row["variant"],
        config=json.loads(row["config_json"]),
        median_ms=row["median_ms"],
        tflops=row.get("tflops"),
        tbps=row.get("tbps"),
        runner_up=row.get("runner_up"),
        runner_up_config=json.loads(row["runner_up_config_json"]) if row.get("runner_up_config_json") else None,
        runner_up_ms=row.get("runner_up_ms"),
        sdpa_default_ms=row.get("sdpa_default_ms"),
        max_error=row.get("max_error"),
        rel_error=row.get("rel_error"),
        spread=row.get("spread"),
        busy=row.get("busy"),
        fingerprint=SoftwareFingerprint.model_validate_json(row["fingerprint_json"]),
        trials=row.get("trials") or 0,
        tuning_seconds=row.get("tuning_seconds") or 0.0,
        created_at=_timestamp(row["created_at"]),
    )


def _timestamp(value: Any) -> datetime:
    """A stored ``created_at``: a datetime (typed drivers) or SQLite's ISO text. Anything else — an
    integer, ``'garbage'`` — makes the row malformed (pydantic would read an int as a Unix time)."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"created_at: not an ISO timestamp: {value[:40]!r}") from None
    raise ValueError(f"created_at: expected a timestamp, got {type(value).__name__} {value!r}")


def record_to_row(rec: WinnerRecord) -> Dict[str, Any]:
    return {
        "key_id": rec.key_id,
        "key_json": rec.key.model_dump_json(),
        "arch": rec.key.device.arch,
        "dtype": rec.key.dtype,
        "mode": rec.key.mode,
        "variant": rec.variant,
        "config_json": config_key(rec.config),
        "median_ms": rec.median_ms,
        "tflops": rec.tflops,
        "tbps": rec.tbps,
        "runner_up": rec.runner_up,
        # ``is not None``: an empty config ({} — a variant without parameters) must round-trip as {}.
        "runner_up_config_json": (config_key(rec.runner_up_config)
                                  if rec.runner_up_config is not None else None),
        "runner_up_ms": rec.runner_up_ms,
        "sdpa_default_ms": rec.sdpa_default_ms,
        "max_error": rec.max_error,
        "rel_error": rec.rel_error,
        "spread": rec.spread,
        "busy": rec.busy,
        "fingerprint_json": rec.fingerprint.model_dump_json(),
        "trials": rec.trials,
        "tuning_seconds": rec.tuning_seconds,
        "created_at": rec.created_at,
    }


def _first_error(e: BaseException) -> str:
    """One line naming the bad field: pydantic's first error with its location, else the message."""
    if isinstance(e, ValidationError) and e.errors():
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or e.title
        return f"{e.title}.{loc}: {err.get('msg', '')}"
    if isinstance(e, KeyError):
        return f"missing column {e.args[0]!r}" if e.args else "missing column"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class VariantLookup(Protocol):
    """What judging a row needs from the kernels (:mod:`attntune.kernels.registry` is one): whether a
    variant exists, and the variant (its ``space(problem).validate(config)``, ``source_hash()`` and, where it
    has one, ``accepts_source(stored_hash, key)``)."""

    def exists(self, name: str) -> bool: ...

    def get(self, name: str) -> Any: ...


#: the lookup :func:`judge` uses when none is passed: the kernel registry registers itself here when it is
#: imported (kernels import the core, never the other way round)
_LOOKUP: Optional[VariantLookup] = None


def set_variant_lookup(lookup: VariantLookup) -> None:
    global _LOOKUP
    _LOOKUP = lookup


def judge(raw: Dict[str, Any], origin: str, variants: Optional[VariantLookup] = None) -> CachedRow:
    """Validate one raw row: parse it, check the variant exists, its config is inside the variant's
    declared space, its key matches its id, and its fingerprint matches the running software.
    ``variants``: the kernels' registry (default: the one registered by :mod:`attntune.kernels.registry`).
    Never raises on a bad row; it is returned as ``rejected`` (or ``stale``) with the reasons."""
    registry = variants or _LOOKUP
    if registry is None:
        raise RuntimeError("judging a cached row needs the variant registry: pass "
                           "variants=attntune.kernels.registry (or import it first)")

    key_id = str(raw.get("key_id", "?"))
    try:
        rec = row_to_record(raw)
    except (ValidationError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        # (RecursionError: JSON nested past the parser's depth — one such row must not take its layer down)
        msg = _first_error(e)
        return CachedRow(key_id=key_id, origin=origin, status="rejected", reasons=[f"malformed row: {msg}"])
    if rec.key_id != key_id:
        return CachedRow(key_id=key_id, origin=origin, status="rejected",
                         reasons=["key_id does not match the stored key"], record=rec)
    if not registry.exists(rec.variant):
        return CachedRow(key_id=key_id, origin=origin, status="rejected",
                         reasons=[f"unknown variant {rec.variant!r}"], record=rec)
    variant = registry.get(rec.variant)
    try:
        problem = rec.key.representative()
        bad = variant.space(problem).validate(rec.config)
    except Exception as e:  # noqa: BLE001
        bad = [f"space check raised {type(e).__name__}: {e}"]
    # a row written under an earlier source the variant declares equivalent (its run path unchanged) is
    # judged as written under the current one; the versions (torch, triton, ...) are still compared
    stored_hash = rec.fingerprint.variant_hash
    accepts = getattr(variant, "accepts_source", None)
    same = callable(accepts) and accepts(stored_hash, rec.key)
    current = software_fingerprint(stored_hash if same else variant.source_hash(), rec.key.device.device_type)
    stale = rec.fingerprint.stale_reasons(current)
    if bad:
        domain = f"config out of domain: {'; '.join(bad)}"
        if not rec.fingerprint.same_source(current):
            # the variant's code changed since the row was written, and its config format with it (e.g. a
            # new launch knob): an outdated row, not a damaged one — stale, never a hint
            return CachedRow(key_id=key_id, origin=origin, status="stale", reasons=stale + [domain], record=rec)
        return CachedRow(key_id=key_id, origin=origin, status="rejected", reasons=[domain], record=rec)
    if stale:
        return CachedRow(key_id=key_id, origin=origin, status="stale", reasons=stale, record=rec,
                         hint=rec.fingerprint.same_source(current))
    return CachedRow(key_id=key_id, origin=origin, status="valid", record=rec)
