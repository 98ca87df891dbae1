#!/usr/bin/env bash
# The closing device call of 2026-12-06: the whole GPU suite; bench_compile_train.py on the flash-planned
# cases (TF32 dense, window GQA); e2e_gpt.py's compiled training; and, with the time left of BUDGET_S,
# bench_generate.py's compiled static-cache generate (Llama and Mistral, B8 P4096) — the compiled decode path
# after the layout rule. JSON and logs under $OUT.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-400} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-150} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10; tail -1 "$OUT/gpu_tests.log"
timeout 90 python3 benchmarks/bench_compile_train.py --cases causal-S2048-D64-fp32-tf32,window1024-S4096-D128-bf16-gqa \
  --out "$OUT/compile_train.json" > "$OUT/compile_train.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; grep -o '"case": "[^"]*"\|"ms": {[^}]*}' "$OUT/compile_train.log"
timeout 90 python3 benchmarks/e2e_gpt.py --compiled --cases training,window_training --quick \
  --out "$OUT/e2e_gpt.json" > "$OUT/e2e_gpt.log" 2>&1
echo "e2e rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 "$OUT/e2e_gpt.log" | cut -c1-200
t=$(left)
if [ "$t" -gt 90 ]; then
  timeout $t python3 benchmarks/bench_generate.py --protocol resident --models llama --caches static --batches 8 \
    --prompts 4096 --repeats 2 --no-serving --no-new-length --compiled-static \
    --compiled-cases ${GEN_CASES:-llama:8:4096,mistral:8:4096} --out "$OUT/generate_compiled.json" \
    > "$OUT/generate_compiled.log" 2>&1
  echo "generate rc=$? ($(( $(date +%s) - T0 )) s)"; tail -4 "$OUT/generate_compiled.log" | cut -c1-300
fi
echo "total $(( $(date +%s) - T0 )) s"
