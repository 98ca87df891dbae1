"""Reproducibility of stored times across tuning processes: two ``attntune show --json`` dumps of caches
tuned by separate processes (on the H200: separate machine starts) compared key by key.

Where both runs stored the same variant and config, the relative difference of their medians is the
measurement's cross-process error (what a fidelity re-time sees, without a third run). Keys whose winner
differs are listed apart (their times measure different kernels). Keys of ``--exclude`` variants (a kernel
whose source changed between the two runs) are left out.

Usage: python benchmarks/compare_tunes.py A.json B.json --exclude triton_decode --out cmp.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def rows(path: str) -> dict:
    from attntune.key import TuneKey

    out = {}
    for r in json.loads(Path(path).read_text()):
        rec = r["record"]
        out[r["key_id"]] = {"key": TuneKey.model_validate(rec["key"]).short(), "variant": rec["variant"],
                            "config": rec["config"], "median_ms": rec["median_ms"], "spread": rec.get("spread")}
    return out


def compare(a: dict, b: dict, exclude: set) -> dict:
    same, differ = [], []
    for kid, ra in a.items():
        rb = b.get(kid)
        if rb is None or ra["variant"] in exclude or rb["variant"] in exclude:
            continue
        if (ra["variant"], ra["config"]) == (rb["variant"], rb["config"]):
            same.append({"key": ra["key"], "variant": ra["variant"], "a_ms": ra["median_ms"], "b_ms": rb["median_ms"],
                         "relative_difference": rb["median_ms"] / ra["median_ms"] - 1})
        else:
            differ.append({"key": ra["key"], "a": [ra["variant"], ra["median_ms"]], "b": [rb["variant"], rb["median_ms"]]})
    errs = [abs(r["relative_difference"]) for r in same]
    summary = {"same_winner_keys": len(same), "different_winner_keys": len(differ),
               "median_abs_difference": statistics.median(errs) if errs else None,
               "max_abs_difference": max(errs) if errs else None,
               "within_5_percent": sum(e <= 0.05 for e in errs)}
    return {"same": same, "different": differ, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--exclude", default="", help="comma-separated variants to leave out")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = compare(rows(a.a), rows(a.b), {v for v in a.exclude.split(",") if v})
    res["inputs"] = [a.a, a.b]
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
