"""Recompute the derived figures of a cache's rows (``tflops``, ``tbps``) from each row's key and measured
median, with today's :meth:`AttentionProblem.flops` / :meth:`~AttentionProblem.bytes_moved` — after those
changed how they count (2026-12-06: K/V bytes and pairs of windows and ``kv_lens`` keys). Nothing measured
is touched: median, spread, runner-up, fingerprint and the variant's config stay as they were.

    python benchmarks/recount_cache_figures.py cache.db [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sqlite3

from attntune.key import TuneKey


def recount(path: str, dry_run: bool = False) -> list:
    con = sqlite3.connect(path)
    changed = []
    for key_id, key_json, ms, tflops, tbps in con.execute(
            "select key_id, key_json, median_ms, tflops, tbps from winners"):
        if not ms:
            continue
        p = TuneKey.model_validate_json(key_json).representative()
        new = p.rates(ms)
        if tflops is None or tbps is None or any(abs(a - b) > 1e-9 * max(abs(b), 1) for a, b in zip(new, (tflops, tbps))):
            changed.append({"key": p.short(), "tflops": [tflops, new[0]], "tbps": [tbps, new[1]]})
            if not dry_run:
                con.execute("update winners set tflops = ?, tbps = ? where key_id = ?", (*new, key_id))
    con.commit()
    con.close()
    return changed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    for c in recount(a.cache, a.dry_run):
        print(json.dumps(c))


if __name__ == "__main__":
    main()
