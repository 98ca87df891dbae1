"""Telemetry: ``stats()`` (calls, misses, the plan per key, sampled latency) and Prometheus text.

Counting is a Python integer increment per call on the call's slot (no lock: under the GIL an
attribute ``+=`` with no Python code in between is not interleaved in CPython). Latency is opt-in
(``ATTNTUNE_LATENCY_SAMPLE=N``: every Nth call of each plan); CUDA event pairs are read here, not on
the hot path.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from attntune.policies import runtime as _runtime
from attntune.policies.runtime import COUNTS, SLOTS, Slot


def percentile(sorted_ms: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile of an ascending sequence (None when empty).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 99), percentile([], 50)
    (2.0, 4.0, None)
    """
    if not sorted_ms:
        return None
    rank = max(1, -(-len(sorted_ms) * q // 100))  # ceil(n*q/100), at least 1
    return float(sorted_ms[int(rank) - 1])


def _latency(slot: Slot) -> Optional[Dict[str, float]]:
    if slot.events:
        from attntune.policies.dispatch import _drain_events

        _drain_events(slot, block=True)
    if not slot.samples:
        return None
    s = sorted(slot.samples)
    return {"p50_ms": percentile(s, 50), "p95_ms": percentile(s, 95), "p99_ms": percentile(s, 99),
            "samples": len(s), "sum_ms": float(sum(s))}


def stats() -> Dict[str, Any]:
    """What this process dispatched so far.

    ``calls``: calls through attntune (drop-in pass-throughs to torch included); ``misses``: calls
    served without an exact tuned row (tuned/online policies); ``plans``: one entry per call signature
    — problem, key id, variant, config, source, calls, miss, ``family`` (True: one entry for every shape
    of the problem's family, served by one family-generic plan, e.g. a decode loop's KV lengths; its
    problem is the first shape), and ``latency`` (P50/P95/P99 in ms over the
    sampled calls, when ``ATTNTUNE_LATENCY_SAMPLE`` is set); ``keys``: the same aggregated per tuning key;
    ``quarantined``: variants that failed in this process and why.
    """
    rt = _runtime.get()
    plans: List[Dict[str, Any]] = []
    keys: Dict[str, Dict[str, Any]] = {}
    passthrough = COUNTS["passthrough"]
    total = passthrough
    misses = 0
    # a family-generic slot is stored under every signature of its family: count it once
    for slot in {id(s): s for s in list(SLOTS.values())}.values():
        total += slot.calls
        if slot.plan is None:
            passthrough += slot.calls
            continue
        p = slot.plan
        if slot.miss:
            misses += slot.calls
        entry = {"problem": (slot.problem or p.problem).short(), "key_id": p.key_id, "variant": p.variant, "config": p.config,
                 "source": p.source, "calls": slot.calls, "miss": slot.miss, "family": slot.generic,
                 "latency": _latency(slot)}
        plans.append(entry)
        if p.key_id is not None:
            agg = keys.setdefault(p.key_id, {"key": p.key.short(), "calls": 0, "miss": slot.miss, "plans": []})
            agg["calls"] += slot.calls
            desc = f"{p.variant} ({p.source})"
            if desc not in agg["plans"]:
                agg["plans"].append(desc)
    plans.sort(key=lambda e: -e["calls"])
    return {
        "policy": rt.config.policy_label, "disabled": rt.config.disabled, "calls": total, "misses": misses,
        "passthrough_calls": passthrough, "plans": plans, "keys": keys,
        "quarantined": [{"variant": v, "config": c, "error": rt.quarantine_why.get((v, c), "")}
                        for v, c in sorted(rt.quarantine)],
        "latency_sample_every": rt.config.latency_sample,
    }


def metrics_text() -> str:
    """Prometheus text exposition of :func:`stats` (a registry of attntune's own, never the global
    one). Needs ``prometheus-client`` (``pip install 'attntune[metrics]'``)."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    except ImportError as e:  # pragma: no cover — exercised only without the extra
        raise ImportError("attntune.metrics_text() needs prometheus-client: pip install 'attntune[metrics]'") from e

    class _Collector:
        def collect(self):
            s = stats()
            calls = CounterMetricFamily("attntune_calls", "Attention calls dispatched by attntune",
                                        labels=["key", "problem", "variant", "source"])
            for p in s["plans"]:
                calls.add_metric([p["key_id"] or "", p["problem"], p["variant"], p["source"]], p["calls"])
            calls.add_metric(["", "", "torch_sdpa", "passthrough"], s["passthrough_calls"])
            yield calls
            miss = CounterMetricFamily("attntune_misses", "Calls served without an exact tuned cache row")
            miss.add_metric([], s["misses"])
            yield miss
            yield GaugeMetricFamily("attntune_plans", "Call signatures with a resolved plan", value=len(s["plans"]))
            yield GaugeMetricFamily("attntune_quarantined", "Variants quarantined after failing",
                                    value=len(s["quarantined"]))
            lat = Metric("attntune_latency_seconds", "Sampled attention call latency", "summary")
            for p in s["plans"]:
                L = p["latency"]
                if not L:
                    continue
                labels = {"key": p["key_id"] or "", "variant": p["variant"]}
                for q, name in (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms")):
                    lat.add_sample("attntune_latency_seconds", dict(labels, quantile=q), L[name] / 1e3)
                lat.add_sample("attntune_latency_seconds_count", labels, L["samples"])
                lat.add_sample("attntune_latency_seconds_sum", labels, L["sum_ms"] / 1e3)
            yield lat

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry).decode()
