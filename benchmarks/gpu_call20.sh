#!/usr/bin/env bash
# The 2026-12-07 (thirtieth) session's device calls, adaptive to the card. JSON and logs under $OUT.
#   STEP=1 (default): H200: the append kernel's GPU tests, then #13's regret + fidelity (gpu_call15.sh PART=regret,
#          RUN_S seconds); other cards: STEP=2.
#   STEP=2: the GPU tests of the FP8 append kernel (tests/test_fp8_append.py, tests/test_hf_fp8.py), the launch-cost
#          probe, HF generate with the FP8 KV cache against SDPA's bf16 static cache, appending through the kernel
#          (auto) and through torch ops, each in its own run, 3 repeats; then H200: re-tune its stale rows
#          (gpu_call3.sh, no tests, TUNE_S s; 0: none, and the suite instead); other cards: the whole GPU suite (SUITE_S s).
#   (probe_pdl ran first in this session's first call: PDL saves 0.18-0.32 µs, the decode-pdl patch is dropped.)
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
append_tests() {
  timeout 150 python3 -m pytest -q -m gpu -n 8 tests/test_fp8_append.py tests/test_hf_fp8.py -p no:cacheprovider \
      > "$OUT/gpu_tests_append.log" 2>&1
  echo "append gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_append.log" | head
  tail -1 "$OUT/gpu_tests_append.log"
}
if [ "${STEP:-1}" = 1 ] && [ "$CARD" = h200 ]; then
  append_tests
  PART=regret RUN_S=${RUN_S:-430} MAX_CONFIGS=${MAX_CONFIGS:-32} bash benchmarks/gpu_call15.sh
  echo "total $(( $(date +%s) - T0 )) s"; exit 0
fi
append_tests
timeout 60 python3 benchmarks/probe_launch_cost.py --out "$OUT/probe_launch_cost_$CARD.json" 2>&1 | tail -4
for append in auto torch; do  # auto: the append kernel on the GPU; torch: the 9 torch ops it replaces
  ATTNTUNE_CACHE="$OUT/gen.db" timeout ${GEN_S:-120} python3 benchmarks/bench_generate.py --quick --models llama \
      --caches static,fp8static --fp8-append $append --protocol resident --prompts 4096 --no-serving \
      --no-new-length --repeats 3 --out "$OUT/generate_fp8_${append}_$CARD.json" > "$OUT/generate_fp8_$append.log" 2>&1
  echo "generate fp8 append=$append rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -E "^\[|^llama" "$OUT/generate_fp8_$append.log" | tail -6 | cut -c1-200
done
if [ "$CARD" = h200 ] && [ "${TUNE_S:-300}" != 0 ]; then SKIP_TESTS=1 BUDGET_S=${TUNE_S:-300} bash benchmarks/gpu_call3.sh
else  # another card: then the whole GPU suite with the append kernel
  timeout ${SUITE_S:-240} python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider > "$OUT/gpu_tests_$CARD.log" 2>&1
  echo "gpu suite rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_$CARD.log" | head
  tail -1 "$OUT/gpu_tests_$CARD.log"
fi
echo "total $(( $(date +%s) - T0 )) s"
