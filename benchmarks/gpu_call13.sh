#!/usr/bin/env bash
# The second device call of the 2026-12-06 evening session: the flash-family GPU tests and
# probe_flash_launch.py after the launch's host-path trims, then (with the time left of BUDGET_S) the FP8
# suite's re-tune resumed from the first call's optuna storage (RESUME_DB) on top of the shipped cache.db.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-170} python3 -m pytest -q -m gpu -n 16 ${TESTS:-tests/test_triton_flash.py tests/test_fp8_prefill.py \
  tests/test_compile_train.py tests/test_decode.py} -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -12; tail -1 "$OUT/gpu_tests.log"; echo "tests ($(( $(date +%s) - T0 )) s)"
ATTNTUNE_SYSTEM_CACHE= ATTNTUNE_CACHE="$OUT/probe.db" timeout 90 python3 benchmarks/probe_flash_launch.py --reps 9 \
  --out "$OUT/probe_flash_launch.json" > "$OUT/probe_flash_launch.log" 2>&1
echo "probe rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/probe_flash_launch.log" | cut -c1-600
if echo "$GPU" | grep -q H200; then
  SUITES=fp8 SKIP_TESTS=1 BUDGET_S=$(( $(left) - 5 )) bash benchmarks/gpu_call3.sh
fi
echo "total $(( $(date +%s) - T0 )) s"
