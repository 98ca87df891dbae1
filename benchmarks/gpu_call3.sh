#!/usr/bin/env bash
# Follow-up of gpu_call2.sh: finish the re-tune if it was cut (cache.db and .gpu/optuna.db carried back), then
# the generate benchmark with the re-tuned cache in what time is left. Everything under $OUT.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
cp cache.db "$OUT/cache.db"; [ -f .gpu/optuna.db ] && cp .gpu/optuna.db "$OUT/optuna.db"
for suite in default fp8; do
  attntune tune --suite $suite --cache "$OUT/cache.db" --storage "sqlite:///$OUT/optuna.db" --time-limit ${TUNE_S:-200} \
      > "$OUT/tune3_$suite.log" 2>&1; echo "tune $suite rc=$?"; grep -E "keys tuned" "$OUT/tune3_$suite.log" | tail -2
done
python3 - <<'PY' > "$OUT/environment.json"
import json, sys; sys.path.insert(0, "benchmarks")
from env import environment; print(json.dumps(environment(), indent=1))
PY
t=$(left)
if [ $t -gt 120 ]; then
  ATTNTUNE_CACHE="$OUT/cache.db" timeout $t python3 benchmarks/bench_generate.py --out "$OUT/generate.json" \
      ${GENERATE_ARGS:---protocol resident --repeats 2 --no-graphs} > "$OUT/generate.log" 2>&1; tail -40 "$OUT/generate.log"
fi
