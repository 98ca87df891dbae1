#!/usr/bin/env bash
# One device call, adaptive to the card: on an H200, #11's compiled static-cache generate figure first
# (bench_generate.py --compiled-static); on any card, the HF GPU tests and #14's HF training step
# (bench_hf_train.py, eager and compiled, SDPA vs attntune). JSON and logs under $OUT.
# BUDGET_S: seconds the whole script may use (default 560).
set -u
T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if echo "$GPU" | grep -q H200; then
  timeout $(( $(left) - 200 )) python3 benchmarks/bench_generate.py --protocol resident --batches 1,8 --prompts 4096 \
      --compiled-static --compiled-cases llama:1:512,llama:8:4096,mistral:8:4096,mistral:8:512 \
      --out "$OUT/generate_h200_compiled.json" > "$OUT/generate_h200_compiled.log" 2>&1
  echo "generate rc=$? ($(( $(date +%s) - T0 )) s)"; tail -3 "$OUT/generate_h200_compiled.log" | cut -c1-400
fi
timeout 120 python3 -m pytest -q -m gpu -n 8 ${TESTS:-tests/test_hf.py tests/test_sdpa_saved.py} -p no:cacheprovider \
  > "$OUT/gpu_tests_hf.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_hf.log" | head -10; tail -1 "$OUT/gpu_tests_hf.log"
L=$(left); [ "$L" -gt 60 ] && timeout $L python3 benchmarks/bench_hf_train.py ${HF_ARGS:-} --out "$OUT/hf_train.json" \
  > "$OUT/hf_train.log" 2>&1
echo "hf_train rc=$? ($(( $(date +%s) - T0 )) s)"; tail -12 "$OUT/hf_train.log" | cut -c1-400
