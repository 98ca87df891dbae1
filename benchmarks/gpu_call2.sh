#!/usr/bin/env bash
# One device call after the whole suite ran (gpu_call1.sh): the edge-call GPU tests, then per card —
# H200 (the shipped cache's rows): bench_generate, resident protocol; any other card (an H100): tune the
# default suite on top of cache.db (its rows added next to the H200's), then a generate subset with them.
# Everything under $OUT: tests.log, tune.log, cache.db, generate.json/log, environment.json.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
python3 - <<'PY' > "$OUT/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
timeout 90 python3 -m pytest -q -m gpu -n 4 tests/test_edge_calls.py -p no:cacheprovider > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head; tail -1 "$OUT/tests.log"
cp cache.db "$OUT/cache.db"
if echo "$GPU" | grep -q H200; then
  GEN="--protocol resident --repeats 2 --batches 1,8 --new-tokens 64"
else
  attntune tune --suite default --cache "$OUT/cache.db" --storage memory --trials ${TRIALS:-8} --time-limit ${TUNE_S:-250} \
      > "$OUT/tune.log" 2>&1; echo "tune rc=$?"; grep -E "keys tuned|busy|error" "$OUT/tune.log" | tail -3
  GEN="--protocol resident --batches 1,8 --prompts 512,4096 --new-tokens 64 --repeats 2 --no-graphs"
fi
t=$(left)
ATTNTUNE_CACHE="$OUT/cache.db" timeout $t python3 benchmarks/bench_generate.py --out "$OUT/generate.json" $GEN \
    > "$OUT/generate.log" 2>&1; echo "generate rc=$?"; grep -vE "Warning|warn" "$OUT/generate.log" | tail -40
