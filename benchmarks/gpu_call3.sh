#!/usr/bin/env bash
# One device call after a hashed kernel source changed: the whole GPU suite, then re-tune what the change
# staled on top of the shipped cache.db (default suite, then fp8; no --force: valid rows are kept, only stale
# or missing keys are tuned; on a card without rows, e.g. an H100, its own rows are added). Resumable: the
# optuna storage is written to $OUT/optuna.db; pass it back as RESUME_DB to continue an interrupted key.
# Under $OUT: environment.json, gpu_tests.log, tune_default.log, tune_fp8.log, cache.db, optuna.db.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
python3 - <<'PY' > "$OUT/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -1 "$OUT/gpu_tests.log"
fi
cp "${CACHE_BASE:-cache.db}" "$OUT/cache.db"
[ -n "${RESUME_DB:-}" ] && cp "$RESUME_DB" "$OUT/optuna.db"
for suite in ${SUITES:-default fp8}; do
  t=$(left); [ "$t" -lt 20 ] && { echo "no time left for $suite"; break; }
  attntune tune --suite $suite --cache "$OUT/cache.db" --storage "sqlite:///$OUT/optuna.db" \
      --time-limit $(( t - 10 )) ${TUNE_ARGS:-} > "$OUT/tune_$suite.log" 2>&1
  echo "tune $suite rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "keys tuned|error|stale|interrupted|time limit" "$OUT/tune_$suite.log" | tail -4
done
attntune show --cache "$OUT/cache.db" --no-system --json > "$OUT/winners.json" 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"
