#!/usr/bin/env bash
# The 2026-12-07 (twenty-ninth) session's device call, adaptive to the card. JSON and logs under $OUT.
#   any card first: benchmarks/probe_pdl.py (PDL at a split-K pair's boundary under CUDA graphs, ~30 s).
#   H200: #13's figures — gpu_call15.sh PART=regret (benchmarks/regret.py over the 16-key set, every family, plus
#         the fidelity of every valid H200 row of the shipped cache.db, one run of RUN_S seconds).
#   other cards: (1) the GPU tests of V_T (landed this session: descriptor loads over the FP8/TF32 V copy) —
#         FP8 prefill and the float32/TF32 flash tests; (2) re-tune that card's rows V_T staled (gpu_call3.sh, no
#         tests, TUNE_S seconds); (3) Hugging Face generate with attntune's FP8 KV cache, V as given (d) and
#         keys-contiguous (keys), each against SDPA's bf16 static cache in its own run (bench_generate --quick at prompt 4096,
#         llama, eager): the eager B1 question of the FP8 decode notes, as a user's tokens/s.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
# first, any card (~30 s): what programmatic dependent launch saves at a split-K pair's boundary under graphs (#15 B1)
timeout 90 python3 benchmarks/probe_pdl.py --out "$OUT/probe_pdl_$CARD.json" > "$OUT/probe_pdl.log" 2>&1
echo "probe_pdl rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "MB x|Error" "$OUT/probe_pdl.log" | cut -c1-250
if [ "$CARD" = h200 ] && [ "${FORCE_OTHER:-0}" != 1 ]; then
  PART=regret RUN_S=${RUN_S:-470} MAX_CONFIGS=${MAX_CONFIGS:-32} bash benchmarks/gpu_call15.sh
  exit 0
fi
timeout ${T_TESTS:-150} python3 -m pytest -q -m gpu -n 16 tests/test_fp8_prefill.py tests/test_triton_flash.py \
    -k "fp8 or fp32 or tf32 or transpose" -p no:cacheprovider > "$OUT/gpu_tests_vt.log" 2>&1
echo "V_T gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_vt.log" | head -10
tail -1 "$OUT/gpu_tests_vt.log"
SKIP_TESTS=1 BUDGET_S=${TUNE_S:-170} bash benchmarks/gpu_call3.sh
for layout in d keys; do
  ATTNTUNE_CACHE="$OUT/gen.db" timeout ${GEN_S:-110} python3 benchmarks/bench_generate.py --quick --models llama \
      --caches static,fp8static --fp8-v-layout $layout --protocol resident --prompts 4096 --no-serving --no-new-length \
      --out "$OUT/generate_fp8_${layout}_$CARD.json" > "$OUT/generate_fp8_$layout.log" 2>&1
  echo "generate fp8 $layout rc=$? ($(( $(date +%s) - T0 )) s)"; grep -iE "fp8|tok/s|ratio" "$OUT/generate_fp8_$layout.log" | tail -12 | cut -c1-250
done
echo "total $(( $(date +%s) - T0 )) s"
