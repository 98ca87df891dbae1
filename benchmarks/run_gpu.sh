#!/usr/bin/env bash
# Every GPU test and benchmark in one call, results as JSON under $OUT (default benchmarks/results/latest).
# Usage: STAGES="tests tune suite flash decode fp8 tf32 dispatch e2e generate regret probe profile hfcalls hftrain
#        wintrain bwddiag flashlaunch" bash benchmarks/run_gpu.sh
# Stages run in the order given; a failing stage is logged and the next one runs.
# Output: $OUT/results.tar.gz (every JSON + log) and $OUT/cache.db when the tune stage ran.
set -u
OUT=${OUT:-benchmarks/results/latest}
mkdir -p "$OUT"
W=$(mktemp -d)
STAGES=${STAGES:-"tests tune suite flash decode dispatch e2e"}
TUNE_SUITE=${TUNE_SUITE:-default}
TUNE_ARGS=${TUNE_ARGS:-}          # TUNE_BASE: a cache to start from; e.g. "--trials 8 --time-limit 200" when device time is short
T_TESTS=${T_TESTS:-900}; T_SUITE=${T_SUITE:-900}; T_E2E=${T_E2E:-600}; T_BENCH=${T_BENCH:-600}
export PYTHONUNBUFFERED=1
log() { echo "[run_gpu $(date +%H:%M:%S)] $*"; }

python3 - <<'PY' > "$W/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$W/nvidia-smi.txt" 2>&1

for st in $STAGES; do
  t0=$(date +%s); log "stage $st"
  case $st in
    tests)    XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TEST_WORKERS:-8}")
              ATTNTUNE_TEST_TIMES="$W/test_times.txt" timeout $T_TESTS python3 -m pytest -q -m gpu $XDIST ${TEST_PATHS:-tests} ${TEST_ARGS:-} -p no:cacheprovider > "$W/gpu_tests.log" 2>&1; grep -E "^(FAILED|ERROR)" "$W/gpu_tests.log" | head -30; sort -rn "$W/test_times.txt" 2>/dev/null | head -${DURATION_LINES:-0}; tail -3 "$W/gpu_tests.log" ;;
    tune)     rm -f "$W/cache.db" "$W/optuna.db"
              # TUNE_BASE=cache.db: tune on top of the shipped cache (another GPU's rows kept, its own added)
              [ -n "${TUNE_BASE:-}" ] && cp "$TUNE_BASE" "$W/cache.db"
              t1=$(date +%s)
              timeout 1800 attntune tune --suite "$TUNE_SUITE" --cache "$W/cache.db" \
                  --storage "sqlite:///$W/optuna.db" $TUNE_ARGS > "$W/tune.log" 2>&1
              echo "rc=$? wall_s=$(( $(date +%s) - t1 )) args: --suite $TUNE_SUITE $TUNE_ARGS" >> "$W/tune.log"; tail -45 "$W/tune.log"
              attntune show --cache "$W/cache.db" --no-system --json > "$W/tuned_winners.json" 2>/dev/null
              cp "$W/cache.db" "$OUT/cache.db" 2>/dev/null ;;
    retune)   # re-tune some keys (RETUNE_ARGS: --shape … --trials N) on top of the shipped cache.db
              cp cache.db "$W/cache.db"
              timeout ${T_RETUNE:-600} attntune tune --cache "$W/cache.db" --storage memory --force $RETUNE_ARGS \
                  > "$W/retune.log" 2>&1; echo "rc=$?" >> "$W/retune.log"; tail -30 "$W/retune.log"
              attntune show --cache "$W/cache.db" --no-system --json > "$W/tuned_winners.json" 2>/dev/null
              cp "$W/cache.db" "$OUT/cache.db" ;;
    doctor)   attntune doctor --json > "$W/doctor.json" 2>&1; python3 -c "import json;d=json.load(open('$W/doctor.json'));print([(c['layer'],c['rows'],c['valid'],c['stale'],c['rejected']) for c in d['caches']])" ;;
    suite)    CACHE_ARG=${ATTNTUNE_CACHE:-$W/cache.db}
              ATTNTUNE_CACHE=$CACHE_ARG timeout $T_SUITE python3 benchmarks/bench_suite.py --out "$W/suite.json" ${SUITE_ARGS:-} > "$W/suite.log" 2>&1; tail -60 "$W/suite.log" ;;
    flash)    timeout $T_BENCH python3 benchmarks/bench_flash.py --out "$W/flash.json" ${FLASH_ARGS:-} > "$W/flash.log" 2>&1; tail -30 "$W/flash.log" ;;
    decode)   timeout $T_BENCH python3 benchmarks/bench_decode.py --out "$W/decode.json" > "$W/decode.log" 2>&1; tail -30 "$W/decode.log" ;;
    fp8)      timeout $T_BENCH python3 -m pytest -q -m gpu tests/test_fp8_decode.py tests/test_fp8_dispatch.py tests/test_hf_fp8.py tests/test_fp8_prefill.py -p no:cacheprovider > "$W/fp8_tests.log" 2>&1; tail -3 "$W/fp8_tests.log"
              timeout $T_BENCH python3 benchmarks/bench_fp8.py --out "$W/fp8.json" ${FP8_ARGS:-} > "$W/fp8.log" 2>&1; tail -12 "$W/fp8.log" ;;
    dispatch) ATTNTUNE_CACHE=${ATTNTUNE_CACHE:-$W/cache.db} timeout $T_BENCH python3 benchmarks/bench_dispatch.py --out "$W/dispatch_gpu.json" > "$W/dispatch.log" 2>&1; tail -15 "$W/dispatch.log" ;;
    e2e)      ATTNTUNE_CACHE=${ATTNTUNE_CACHE:-$W/cache.db} timeout $T_E2E python3 benchmarks/e2e_gpt.py --out "$W/e2e_gpt.json" > "$W/e2e.log" 2>&1; tail -25 "$W/e2e.log" ;;
    regret)   timeout $T_BENCH python3 benchmarks/regret.py --out "$W/regret.json" ${REGRET_ARGS:-} > "$W/regret.log" 2>&1; tail -20 "$W/regret.log" ;;
    generate) ATTNTUNE_CACHE=${ATTNTUNE_CACHE:-$W/cache.db} timeout $T_BENCH python3 benchmarks/bench_generate.py --out "$W/generate.json" ${GENERATE_ARGS:-} > "$W/generate.log" 2>&1; tail -40 "$W/generate.log" ;;
    hfcalls)  ATTNTUNE_CACHE=${ATTNTUNE_CACHE:-$W/cache.db} timeout $T_BENCH python3 benchmarks/probe_hf_calls.py --out "$W/probe_hf_calls.json" ${HFCALLS_ARGS:-} > "$W/hfcalls.log" 2>&1; tail -20 "$W/hfcalls.log" | cut -c1-900 ;;
    hftrain)  timeout $T_BENCH python3 benchmarks/bench_hf_train.py --out "$W/hf_train.json" ${HFTRAIN_ARGS:-} > "$W/hf_train.log" 2>&1; grep '^{' "$W/hf_train.log" | cut -c1-400 ;;
    wintrain) ATTNTUNE_SYSTEM_CACHE= ATTNTUNE_CACHE="$W/empty.db" timeout $T_BENCH python3 benchmarks/bench_window_train.py --out "$W/window_train.json" ${WINTRAIN_ARGS:-} > "$W/window_train.log" 2>&1; grep '^{' "$W/window_train.log" | cut -c1-500 ;;
    bwddiag)  timeout $T_BENCH python3 benchmarks/diag_bwd_kernels.py --out "$W/diag_bwd_kernels.json" ${BWDDIAG_ARGS:-} > "$W/diag_bwd.log" 2>&1; grep '^{' "$W/diag_bwd.log" | cut -c1-700 ;;
    flashlaunch) ATTNTUNE_SYSTEM_CACHE= ATTNTUNE_CACHE="$W/empty.db" timeout $T_BENCH python3 benchmarks/probe_flash_launch.py --out "$W/probe_flash_launch.json" > "$W/probe_flash_launch.log" 2>&1; grep '^{' "$W/probe_flash_launch.log" | cut -c1-700 ;;
    tf32)     timeout $T_BENCH python3 benchmarks/probe_tf32.py --out "$W/probe_tf32.json" ${TF32_ARGS:-} > "$W/tf32.log" 2>&1; grep -v Warning "$W/tf32.log" | tail -20 ;;
    probe)    timeout $T_BENCH python3 benchmarks/probe_host.py --out "$W/probe_host.json" > "$W/probe.log" 2>&1; tail -30 "$W/probe.log" ;;
    profile)  ATTNTUNE_CACHE=${ATTNTUNE_CACHE:-$W/cache.db} timeout $T_BENCH python3 benchmarks/profile_host.py --out "$W/profile_host.json" > "$W/profile.log" 2>&1; grep -E "^---|tottime|attntune|launch|triton|sdpa|scaled_dot" "$W/profile.log" | head -${PROFILE_LINES:-60} ;;
    *)        log "unknown stage $st" ;;
  esac
  log "stage $st took $(( $(date +%s) - t0 )) s"
  tar -czf "$OUT/results.tar.gz" -C "$W" . 2>/dev/null  # after every stage: a timeout still returns what ran
done
log "done"
