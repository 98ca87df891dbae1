"""benchmarks/bench_flash.py's --merge (CPU, no timing): each case from the newest run that timed it, the
summary recomputed from the merged cases, the dispatch figures from a bench_suite JSON."""

from __future__ import annotations

import json

from helpers import bench_module


def _bench_flash():
    return bench_module("bench_flash")


def _case(name, ours_ms, cudnn_x):
    return {"name": name, "flops": 1e12, "results": {"triton_flash": {"ms": ours_ms, "tflops": 1e12 / ours_ms / 1e9}},
            "speedup_of_triton_flash": {"sdpa_cudnn": cudnn_x, "sdpa_default": cudnn_x}}


def test_merge_takes_each_case_from_the_newest_run(tmp_path):
    bf = _bench_flash()
    old = {"environment": {"date": "2026-12-02T10:00:00+00:00"},
           "cases": [_case("dense-fwd-S4096", 5.0, 0.8), _case("dense-fwd-S4096-D64", 3.0, 0.9)]}
    new = {"environment": {"date": "2026-12-04T10:00:00+00:00"},
           "cases": [_case("dense-fwd-S4096", 4.0, 0.95), {"name": "dense-fwd-S4096-D96", "error": "x", "results": {}}]}
    suite = {"summary": {"dense": {"geomean_vs_sdpa_default": 1.01, "min_vs_sdpa_default": 0.97}}}
    paths = []
    for name, doc in (("new.json", new), ("old.json", old), ("suite.json", suite)):  # newest given first
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    out = bf.merge(paths[:2], paths[2])
    names = [c["name"] for c in out["cases"]]
    assert names == ["dense-fwd-S4096", "dense-fwd-S4096-D64"]  # CASES order; the failed case left out
    assert out["cases"][0]["results"]["triton_flash"]["ms"] == 4.0  # the newer run's
    s = out["summary"]
    assert s["dense_fwd_d128_vs_cudnn"] == 0.95 and s["dense_fwd_d64_vs_cudnn"] == 0.9
    assert s["dense_fwd_d96_vs_cudnn"] is None
    assert s["dispatch_dense_geomean"] == 1.01 and s["dispatch_dense_min"] == 0.97
    assert s["dispatch_from"] == {"file": "suite.json", "date": None}
    files = {m["file"]: m["cases"] for m in out["merged_from"]}
    assert files == {"old.json": ["dense-fwd-S4096-D64"], "new.json": ["dense-fwd-S4096"]}
    assert out["environment"]["date"].startswith("2026-12-04")
