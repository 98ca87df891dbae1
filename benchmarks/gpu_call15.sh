#!/usr/bin/env bash
# Device calls of the 2026-12-06 late session: the H200 figures that #11 and #13 still lack, on the code of
# main (no hashed source changed since the last re-tune). One part per call (PART), adaptive to the card:
#   PART=regret   H200: benchmarks/regret.py over the 16-key set (KEYS; all families) plus the fidelity of every
#                 valid row of the shipped cache.db (FIDELITY=0: none; KEYS= : fidelity only), one run
#                 (--time-limit RUN_S); any other card with ANY_CARD=1 (file named by card), else skipped.
#   PART=generate H200 (any card with ANY_CARD=1): the full bench_generate.py table (both protocols, serving
#                 loop, new length) with REPEATS timed generates per case (the JSON is saved after each part).
#   PART=train    any card: the flash GPU tests of the FastKernel launch keys (commit a040513's shared pointer
#                 alignments were never run on a GPU), then bench_hf_train.py (eager and compiled, Mistral-style
#                 sliding window and Llama-style, S4096: #14's HF training step).
# JSON and logs under $OUT.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
H200=0; echo "$GPU" | grep -q H200 && H200=1
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}  # names the output files
python3 - <<'PY' > "$OUT/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
case ${PART:-train} in
  regret)
    if [ $H200 = 1 ] || [ "${ANY_CARD:-0}" = 1 ]; then
      FID="--fidelity cache.db --fidelity-share ${FID_SHARE:-0.3}"; [ "${FIDELITY:-1}" = 0 ] && FID=""
      timeout $(( ${RUN_S:-480} + 60 )) python3 benchmarks/regret.py --keys "${KEYS-families16}" $FID --max-configs ${MAX_CONFIGS:-48} --first-key ${FIRST_KEY:-0} --families "${FAMILIES:-}" \
          --time-limit ${RUN_S:-480} --out "$OUT/regret_$CARD.json" > "$OUT/regret.log" 2>&1
      echo "regret rc=$? ($(( $(date +%s) - T0 )) s)"; tail -25 "$OUT/regret.log" | cut -c1-300
    else echo "not an H200: regret skipped"; fi ;;
  generate)
    if [ $H200 = 1 ] || [ "${ANY_CARD:-0}" = 1 ]; then
      ATTNTUNE_CACHE="$OUT/gen.db" timeout ${RUN_S:-540} python3 benchmarks/bench_generate.py --protocol both \
          --repeats ${REPEATS:-2} --out "$OUT/generate_$CARD.json" > "$OUT/generate.log" 2>&1
      echo "generate rc=$? ($(( $(date +%s) - T0 )) s)"; tail -30 "$OUT/generate.log" | cut -c1-300
    else echo "not an H200: generate skipped"; fi ;;
  train)
    timeout 150 python3 -m pytest -q -m gpu -n 8 tests/test_triton_flash.py -k "fast_launch or torch_compile or realistic" \
        -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10; tail -1 "$OUT/gpu_tests.log"; echo "tests ($(( $(date +%s) - T0 )) s)"
    timeout ${RUN_S:-360} python3 benchmarks/bench_hf_train.py ${HF_ARGS:-} --out "$OUT/hf_train.json" > "$OUT/hf_train.log" 2>&1
    echo "hf_train rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/hf_train.log" | cut -c1-400; tail -3 "$OUT/hf_train.log" | cut -c1-300 ;;
esac
echo "total $(( $(date +%s) - T0 )) s"
