#!/usr/bin/env bash
# One device call for the compiled ops' training path (2026-12-06): GPU tests of the SDPA split, the layout
# rule and the compiled ops; bench_compile_train.py's dense cases; e2e_gpt.py's compiled training step (SDPA
# vs attntune); and a profile of that step (profile_compiled_train.py). JSON and logs under $OUT.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout 150 python3 -m pytest -q -m gpu -n 8 tests/test_sdpa_saved.py tests/test_compile_train.py \
  tests/test_dispatch.py tests/test_decode.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10; tail -1 "$OUT/gpu_tests.log"
timeout 120 python3 benchmarks/bench_compile_train.py --cases ${CASES:-causal-S4096-D128-bf16-gqa,causal-S2048-D64-bf16} \
  --out "$OUT/compile_train.json" > "$OUT/compile_train.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; grep -o '"case": "[^"]*"\|"ms": {[^}]*}' "$OUT/compile_train.log"
timeout 150 python3 benchmarks/e2e_gpt.py --compiled --cases ${E2E_CASES:-training,window_training} --quick \
  --out "$OUT/e2e_gpt.json" > "$OUT/e2e_gpt.log" 2>&1
echo "e2e rc=$? ($(( $(date +%s) - T0 )) s)"; tail -6 "$OUT/e2e_gpt.log" | cut -c1-200
[ "${PROFILE:-1}" = 1 ] && timeout 120 python3 benchmarks/profile_compiled_train.py --out "$OUT/prof.json" 2>&1 \
  | grep -v -i warn | tail -32
echo "total $(( $(date +%s) - T0 )) s"
