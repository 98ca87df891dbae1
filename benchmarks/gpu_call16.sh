#!/usr/bin/env bash
# Device calls of the 2026-12-06 evening session (#13), one part per call (PART), adaptive to the card:
#   PART=cache    H200: re-tune the shipped cache's stale H200 rows (the fp8 suite's two FP8-KV prefill keys;
#                 no --force: valid rows are kept) into $OUT/cache.db, then the fidelity of every valid H200 row of
#                 that cache in a fresh process (regret.py with no keys, FID_S seconds). Other cards: skipped.
#                 THEN_REGRET_TOTAL_S=N: then the regret part in what is left of N seconds (H200).
#   PART=regret   any card: gpu_call15.sh's regret part without fidelity (RUN_S), $OUT/regret_<card>.json.
#   PART=none     the timer's GPU tests and the probe below only.
#   PART=tunetime any card: bench_tune_time.py (the same keys tuned with cold then warm Triton/inductor caches,
#                 per-trial durations from the optuna storage, a cProfiled warm run).
# Every part first runs benchmarks/probe_graph_timer.py (PROBE_S seconds, 0: skipped): the decode timer's kept
# captures against a capture per measurement, side by side ($OUT/probe_graph_timer_<card>.json), after the
# timer's GPU tests (tests/test_confirm.py -m gpu).
# JSON and logs under $OUT.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
H200=0; echo "$GPU" | grep -q H200 && H200=1
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}  # names the output files
if [ "${PROBE_S:-45}" != 0 ]; then
  timeout 90 python3 -m pytest -q -m gpu tests/test_confirm.py -p no:cacheprovider > "$OUT/gpu_tests_timer.log" 2>&1
  echo "timer gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 "$OUT/gpu_tests_timer.log" | cut -c1-300
  timeout $(( ${PROBE_S:-45} + 30 )) python3 benchmarks/probe_graph_timer.py --time-limit ${PROBE_S:-45} \
      --out "$OUT/probe_graph_timer_$CARD.json" > "$OUT/probe_graph_timer.log" 2>&1
  echo "probe_graph_timer rc=$? ($(( $(date +%s) - T0 )) s)"; tail -4 "$OUT/probe_graph_timer.log" | cut -c1-400
fi
case ${PART:-tunetime} in
  cache)
    if [ $H200 = 1 ]; then
      SUITES=fp8 SKIP_TESTS=1 BUDGET_S=${TUNE_S:-300} bash benchmarks/gpu_call3.sh
      timeout $(( ${FID_S:-180} + 40 )) python3 benchmarks/regret.py --keys "" --fidelity "$OUT/cache.db" \
          --fidelity-share 1.0 --time-limit ${FID_S:-180} --out "$OUT/fidelity_h200.json" > "$OUT/fidelity.log" 2>&1
      echo "fidelity rc=$? ($(( $(date +%s) - T0 )) s)"; tail -4 "$OUT/fidelity.log" | cut -c1-400
      # THEN_REGRET_TOTAL_S: the call's whole wall budget; what the cache and fidelity left goes to the regret
      # part (from FIRST_KEY, MAX_CONFIGS) when that is at least 120 s (60 s kept for its start and exit)
      if [ -n "${THEN_REGRET_TOTAL_S:-}" ]; then
        R=$(( THEN_REGRET_TOTAL_S - ($(date +%s) - T0) - 60 ))
        if [ $R -ge 120 ]; then PART=regret FIDELITY=0 RUN_S=$R bash benchmarks/gpu_call15.sh
        else echo "regret skipped: $R s left"; fi
      fi
    else echo "not an H200: cache skipped"; fi ;;
  regret) PART=regret FIDELITY=0 ANY_CARD=1 bash benchmarks/gpu_call15.sh ;;
  tunetime)
    timeout ${RUN_S:-560} python3 benchmarks/bench_tune_time.py --profile --trials ${TRIALS:-8} \
        --out "$OUT/tune_time.json" > "$OUT/tune_time.log" 2>&1
    echo "tune_time rc=$? ($(( $(date +%s) - T0 )) s)"; tail -5 "$OUT/tune_time.log" | cut -c1-600 ;;
esac
echo "total $(( $(date +%s) - T0 )) s"
