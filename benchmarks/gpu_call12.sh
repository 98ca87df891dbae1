#!/usr/bin/env bash
# The first device call of the 2026-12-06 evening session: the whole GPU suite (the flash op now launches
# through FastKernel: every flash-family test is also a launch-key test), then probe_flash_launch.py (host
# cost, Triton's launch path vs FastKernel's, side by side); on an H200 with the time left of BUDGET_S,
# #11's compiled static-cache generate figure. JSON and logs under $OUT.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu -n 16 ${TESTS:-tests} -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -12; tail -1 "$OUT/gpu_tests.log"; echo "tests ($(( $(date +%s) - T0 )) s)"
ATTNTUNE_SYSTEM_CACHE= ATTNTUNE_CACHE="$OUT/probe.db" timeout 150 python3 benchmarks/probe_flash_launch.py \
  --out "$OUT/probe_flash_launch.json" ${PROBE_ARGS:-} > "$OUT/probe_flash_launch.log" 2>&1
echo "probe rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/probe_flash_launch.log" | cut -c1-900; tail -3 "$OUT/probe_flash_launch.log" | grep -v '^{' | cut -c1-300
t=$(left)
if echo "$GPU" | grep -q H200 && [ "$t" -gt 150 ]; then
  timeout $(( t - 10 )) python3 benchmarks/bench_generate.py --protocol resident --batches 1,8 --prompts 4096 \
      --compiled-static --compiled-cases ${GEN_CASES:-llama:1:512,llama:8:4096,mistral:8:4096} \
      --out "$OUT/generate_h200_compiled.json" > "$OUT/generate_h200_compiled.log" 2>&1
  echo "generate rc=$? ($(( $(date +%s) - T0 )) s)"; tail -3 "$OUT/generate_h200_compiled.log" | cut -c1-400
fi
echo "total $(( $(date +%s) - T0 )) s"
