#!/usr/bin/env bash
# The 2026-12-07 (thirtieth) session's device calls, adaptive to the card. JSON and logs under $OUT.
#   STEP=1 (default): any card first: benchmarks/probe_pdl.py (~30 s). H200: #13's regret + fidelity
#          (gpu_call15.sh PART=regret, RUN_S seconds). Other cards: STEP=2's generate re-time.
#   STEP=2: H200: re-tune its stale rows (gpu_call3.sh, no tests, TUNE_S seconds); any card: HF generate with the
#          FP8 KV cache (9-op update) against SDPA's bf16 static cache, V as given and keys-contiguous, 3 repeats.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
generate() {
  for layout in d keys; do
    ATTNTUNE_CACHE="$OUT/gen.db" timeout ${GEN_S:-120} python3 benchmarks/bench_generate.py --quick --models llama \
        --caches static,fp8static --fp8-v-layout $layout --protocol resident --prompts 4096 --no-serving \
        --no-new-length --repeats 3 --out "$OUT/generate_fp8_${layout}_$CARD.json" > "$OUT/generate_fp8_$layout.log" 2>&1
    echo "generate fp8 $layout rc=$? ($(( $(date +%s) - T0 )) s)"
    grep -iE "fp8|tok/s|ratio" "$OUT/generate_fp8_$layout.log" | tail -12 | cut -c1-250
  done
}
if [ "${STEP:-1}" = 1 ]; then
  timeout 90 python3 benchmarks/probe_pdl.py --out "$OUT/probe_pdl_$CARD.json" > "$OUT/probe_pdl.log" 2>&1
  echo "probe_pdl rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "MB x|Error" "$OUT/probe_pdl.log" | cut -c1-250
  if [ "$CARD" = h200 ]; then
    PART=regret RUN_S=${RUN_S:-440} MAX_CONFIGS=${MAX_CONFIGS:-32} bash benchmarks/gpu_call15.sh
  else
    generate
  fi
else
  if [ "$CARD" = h200 ]; then SKIP_TESTS=1 BUDGET_S=${TUNE_S:-300} bash benchmarks/gpu_call3.sh; fi
  generate
fi
echo "total $(( $(date +%s) - T0 )) s"
