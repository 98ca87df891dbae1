#!/usr/bin/env bash
# Landing the split-D / V_T flash series on the H200: the whole GPU suite; only if it passes, re-tune the
# rows it stales on top of the shipped cache (default + fp8 suites, no --force: stale and missing keys only,
# resumable through $OUT/optuna.db); then the flash bench cases the series adds, in what time is left.
# Everything under $OUT: gpu_tests.log, tune_*.log, cache.db, optuna.db, flash.json/log.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
python3 - <<'PY' > "$OUT/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -2 "$OUT/gpu_tests.log"
  if grep -qE "^(FAILED|ERROR)| failed" "$OUT/gpu_tests.log" || ! grep -q " passed" "$OUT/gpu_tests.log"; then
    echo "tests not green: no re-tune"; exit 1; fi
fi
[ -f "$OUT/cache.db" ] || cp "${TUNE_BASE:-cache.db}" "$OUT/cache.db"
for suite in default fp8; do
  t=$(left); [ $t -gt 40 ] || break
  lim=$(( t - 20 )); [ "$suite" = default ] && [ $t -gt 300 ] && lim=$(( t - 90 ))
  attntune tune --suite $suite --cache "$OUT/cache.db" --storage "sqlite:///$OUT/optuna.db" --time-limit $lim \
      > "$OUT/tune_$suite.log" 2>&1; echo "tune $suite rc=$? limit=$lim"; grep -E "keys tuned|stale|error" "$OUT/tune_$suite.log" | tail -4
done
ATTNTUNE_CACHE="$OUT/cache.db" attntune doctor 2>&1 | grep -iE "stale|valid|rows" | head -8
t=$(left)
if [ $t -gt 60 ]; then
  timeout $t python3 benchmarks/bench_flash.py --out "$OUT/flash.json" --cases ${FLASH_CASES:-dense-fwd-S4096-D96,dense-fwd-S4096-D80} \
      --budget-s $(( t - 45 )) > "$OUT/flash.log" 2>&1; tail -15 "$OUT/flash.log"
fi
