#!/usr/bin/env bash
# One device call for the twenty-sixth session's open GPU questions, any Hopper card (~9 min with TOTAL_S=540):
#   1. bench_suite.py, dense group, no Flex (SUITE_S): do the top-clock ratios bring the A/A control (the same SDPA
#      kernel timed as attntune and as itself) to ~1.0, and which clock reasons does the card report?
#      -> $OUT/suite_<card>.json
#   2. regret.py over the chunked_prefill family (REGRET_S; the only key of the 16 whose default leaves SMs idle):
#      what the tuner's occupancy seeds do to its 2.2-2.6 % regret -> $OUT/regret_<card>.json
#   3. the fidelity of the shipped cache's rows of this card in what is left of TOTAL_S, now with clock reasons and
#      temperatures per row -> $OUT/fidelity_<card>.json
# Logs beside them. Merge 2 and 3 into benchmarks/results/regret_<card>.json with regret.py --merge.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
timeout ${SUITE_S:-220} python3 benchmarks/bench_suite.py --groups dense --no-flex --out "$OUT/suite_$CARD.json" \
    > "$OUT/suite.log" 2>&1
echo "suite rc=$? ($(( $(date +%s) - T0 )) s)"; tail -16 "$OUT/suite.log" | cut -c1-300
timeout $(( ${REGRET_S:-120} + 40 )) python3 benchmarks/regret.py --families chunked_prefill \
    --max-configs ${MAX_CONFIGS:-32} --time-limit ${REGRET_S:-120} --out "$OUT/regret_$CARD.json" > "$OUT/regret.log" 2>&1
echo "regret rc=$? ($(( $(date +%s) - T0 )) s)"; tail -22 "$OUT/regret.log" | cut -c1-300
LEFT=$(( ${TOTAL_S:-540} - ($(date +%s) - T0) - 30 ))
if [ $LEFT -ge 60 ]; then
  timeout $(( LEFT + 25 )) python3 benchmarks/regret.py --keys "" --fidelity cache.db --fidelity-share 1.0 \
      --time-limit $LEFT --out "$OUT/fidelity_$CARD.json" > "$OUT/fidelity.log" 2>&1
  echo "fidelity rc=$? ($(( $(date +%s) - T0 )) s)"; tail -20 "$OUT/fidelity.log" | cut -c1-300
else echo "fidelity skipped: $LEFT s left"; fi
echo "total $(( $(date +%s) - T0 )) s"
