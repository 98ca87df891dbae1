#!/usr/bin/env bash
# One device call for a kernel change that stales flash rows: the whole GPU suite, a bench_flash subset
# (CASES, BENCH_S seconds of sweep), then a re-tune of what is stale or missing on this card on top of the
# shipped cache.db with what time is left of TOTAL_S (benchmarks/gpu_call3.sh; resumable through RESUME_DB).
# Under $OUT: gpu_tests.log, flash.json, flash.log, and gpu_call3.sh's files.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-170} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -1 "$OUT/gpu_tests.log"
if [ -n "${CASES:-}" ]; then
  timeout $(( ${BENCH_S:-120} + 100 )) python3 benchmarks/bench_flash.py --cases "$CASES" --budget-s ${BENCH_S:-120} \
    --out "$OUT/flash.json" > "$OUT/flash.log" 2>&1
  echo "bench_flash rc=$? ($(( $(date +%s) - T0 )) s)"; tail -${BENCH_TAIL:-14} "$OUT/flash.log"
fi
LEFT=$(( ${TOTAL_S:-560} - ($(date +%s) - T0) ))
[ "$LEFT" -gt 40 ] && SKIP_TESTS=1 BUDGET_S=$LEFT bash benchmarks/gpu_call3.sh
echo "total $(( $(date +%s) - T0 )) s"
