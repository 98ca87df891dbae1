#!/usr/bin/env bash
# gluon_flash training (2026-12-08: the Gluon forward, then triton_flash's backward on its output and LSE) and its
# scale fix. (1) The whole GPU suite, -v so that a timeout still names what failed (gpu_call22's timed out at 150 s
# with two failures unnamed); (2) window training through attntune.attention, each variant pinned at its default
# config, side by side (bench_window_train.py: triton_local, triton_flash, gluon_flash, flex); (3) three training keys
# re-tuned with --force on top of cache.db among gluon_flash, triton_flash, triton_local, flex and the SDPA default.
# On an H200, REGRET_S=75 also re-runs #13's max-regret key (as gpu_call22.sh). TESTS="tests/a.py tests/b.py" narrows
# the suite. Under $OUT: gpu_tests.log, window_train.json, tune.log, cache.db, winners.json.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-230} python3 -m pytest -v -m gpu -n 16 ${TESTS:-tests} -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "(FAILED|ERROR) " "$OUT/gpu_tests.log" | cut -c1-250 | head -20
tail -1 "$OUT/gpu_tests.log"
timeout ${T_WIN:-150} python3 benchmarks/bench_window_train.py --shapes ${WIN_SHAPES:-hf-mistral-S4096-D64-W1024,bench-S16384-D128-W1024} \
    --reps ${WIN_REPS:-7} --out "$OUT/window_train.json" > "$OUT/window_train.log" 2>&1
echo "window train rc=$? ($(( $(date +%s) - T0 )) s)"; cut -c1-600 "$OUT/window_train.log" | tail -4
cp cache.db "$OUT/cache.db"
S="--shape b=1,hq=32,hkv=32,sq=16384,d=128,causal=1,window=1024:0,mode=fwd_bwd
   --shape b=1,hq=32,hkv=8,sq=4096,d=64,causal=1,window=1023:0,mode=fwd_bwd
   --shape b=2,hq=32,hkv=8,sq=4096,d=128,causal=1,mode=fwd_bwd"
ATTNTUNE_VARIANTS=gluon_flash,triton_flash,triton_local,flex,sdpa_default timeout ${T_TUNE:-170} attntune tune $S --force \
    --cache "$OUT/cache.db" --storage memory --trials 8 --refine 4 --time-limit ${TUNE_S:-150} > "$OUT/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - T0 )) s)"; tail -12 "$OUT/tune.log" | cut -c1-220
attntune show --cache "$OUT/cache.db" --no-system --json > "$OUT/winners.json" 2>/dev/null
. benchmarks/gpu_regret_key.sh  # #13: on an H200 with REGRET_S
echo "total $(( $(date +%s) - T0 )) s"
