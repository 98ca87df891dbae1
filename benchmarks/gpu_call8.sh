#!/usr/bin/env bash
# One device call for the compiled-training op (attntune::attention_train): its GPU tests, the compile and
# dispatch GPU tests beside it, then bench_compile_train.py; on an H200 with time left, the compiled
# generate cases of bench_generate.py (#11's missing H200 figure). JSON and logs under $OUT.
# TESTS: the GPU test files (default below); E2E_ARGS: when set, benchmarks/e2e_gpt.py runs with them
# (e.g. "--compiled --cases training,window_training": a compiled model's training step, SDPA vs attntune).
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout 150 python3 -m pytest -q -m gpu -n 8 ${TESTS:-tests/test_compile_train.py tests/test_dispatch.py} \
  -p no:cacheprovider > "$OUT/gpu_tests_compile_train.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_compile_train.log" | head -10; tail -1 "$OUT/gpu_tests_compile_train.log"
timeout 200 python3 benchmarks/bench_compile_train.py ${BENCH_ARGS:-} --out "$OUT/compile_train.json" > "$OUT/compile_train.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; tail -6 "$OUT/compile_train.log" | cut -c1-600
if [ -n "${E2E_ARGS:-}" ]; then
  timeout 240 python3 benchmarks/e2e_gpt.py $E2E_ARGS --out "$OUT/e2e_gpt.json" > "$OUT/e2e_gpt.log" 2>&1
  echo "e2e rc=$? ($(( $(date +%s) - T0 )) s)"; tail -8 "$OUT/e2e_gpt.log" | cut -c1-300
fi
if echo "$GPU" | grep -q H200; then
  L=$(( ${BUDGET_S:-560} - ($(date +%s) - T0) ))
  [ "$L" -gt 120 ] && timeout $L python3 benchmarks/bench_generate.py --protocol resident --batches 1,8 --prompts 4096 \
      --compiled-static --compiled-cases llama:1:512,llama:8:4096,mistral:8:4096,mistral:8:512 \
      --out "$OUT/generate_h200_compiled.json" > "$OUT/generate_h200_compiled.log" 2>&1
  echo "generate rc=$? ($(( $(date +%s) - T0 )) s)"; tail -3 "$OUT/generate_h200_compiled.log" | cut -c1-400
fi
