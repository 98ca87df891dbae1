#!/usr/bin/env bash
# One device call that settles a WIP kernel patch and re-tunes on whichever source wins:
#   1. apply PATCH (a plain diff against main), run the whole GPU suite and a bench_flash subset (CASES);
#   2. keep the patch only if the suite passed and the patch's knob (KNOB, value 1) beats the old path (value 0)
#      on every case by >= 3 % (fwd_best_ms_by_<knob> of bench_flash's summary); otherwise revert it;
#   3. re-tune stale/missing rows on top of cache.db with the time left of TOTAL_S (benchmarks/gpu_call3.sh).
# Under $OUT: decision.txt (kept|reverted and why), gpu_tests.log, flash.json, flash.log, gpu_call3.sh's files.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
git apply "$PATCH" 2>/dev/null || patch -p1 -s < "$PATCH" || { echo "patch does not apply"; exit 3; }
timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
SUITE_RC=$?
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -1 "$OUT/gpu_tests.log"
timeout $(( ${BENCH_S:-100} + 120 )) python3 benchmarks/bench_flash.py --cases "$CASES" --budget-s ${BENCH_S:-100} \
  --out "$OUT/flash.json" > "$OUT/flash.log" 2>&1
echo "bench_flash rc=$? ($(( $(date +%s) - T0 )) s)"; tail -${BENCH_TAIL:-12} "$OUT/flash.log"
python3 - "$SUITE_RC" "${KNOB:-SPLIT_D}" > "$OUT/decision.txt" <<'PY'
import json, os, sys
rc, knob = int(sys.argv[1]), sys.argv[2]
try:
    by = json.load(open(os.path.join(os.environ["OUT"], "flash.json")))["summary"][f"fwd_best_ms_by_{knob.lower()}"]
except Exception as e:  # noqa: BLE001 - any missing figure means "no evidence": revert
    by = {}; print(f"no figures: {e!r}")
wins = {n: b.get("0", float("inf")) / b["1"] for n, b in by.items() if "1" in b}
ok = rc == 0 and bool(wins) and all(w >= 1.03 for w in wins.values())
print("kept" if ok else "reverted", f"suite_rc={rc}", "speedup(1 over 0)=", json.dumps(wins))
PY
cat "$OUT/decision.txt"
if ! head -1 "$OUT/decision.txt" | grep -q '^kept'; then
  git apply -R "$PATCH" 2>/dev/null || patch -R -p1 -s < "$PATCH"
fi
LEFT=$(( ${TOTAL_S:-580} - ($(date +%s) - T0) ))
[ "$LEFT" -gt 40 ] && SKIP_TESTS=1 BUDGET_S=$LEFT bash benchmarks/gpu_call3.sh
echo "total $(( $(date +%s) - T0 )) s"
