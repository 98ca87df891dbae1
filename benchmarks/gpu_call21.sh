#!/usr/bin/env bash
# The Gluon forward (#14, 2026-12-07: kernels/gluon_flash, explicit async wgmma, the softmax overlapped with PV; WS=1 its
# warp-specialized ping-pong), ~4-6 min:
# its GPU tests (tests/test_gluon_flash.py); then the probe (benchmarks/probe_gluon_fwd.py): its
# odd-shape correctness grid against a float32 reference, then its configs timed beside SDPA cuDNN, SDPA flash and
# our Triton forward (D128 dense/causal, D64, D96, S8192). Then, on an H200 and with REGRET_S set, the one regret
# key of families16 that holds the H200's max and was not re-run on 2026-12-07 (decode B8 KV1024 D64).
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
timeout 150 python3 -m pytest -q -m gpu -n 4 tests/test_gluon_flash.py -p no:cacheprovider > "$OUT/gpu_tests_gluon.log" 2>&1
echo "gluon gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_gluon.log" | head; tail -1 "$OUT/gpu_tests_gluon.log"
timeout ${PROBE_S:-240} python3 benchmarks/probe_gluon_fwd.py --time-limit 170 --out "$OUT/probe_gluon_fwd_$CARD.json" \
    > "$OUT/probe_gluon_fwd.log" 2>&1
echo "probe rc=$? ($(( $(date +%s) - T0 )) s)"; grep -vE "^\s*$" "$OUT/probe_gluon_fwd.log" | tail -16 | cut -c1-330
if [ "$CARD" = h200 ] && [ "${REGRET_S:-0}" != 0 ]; then
  timeout $(( REGRET_S + 30 )) python3 benchmarks/regret.py --keys families16 --families decode --first-key 1 \
      --max-configs 32 --time-limit $REGRET_S --out "$OUT/regret_h200_decode_b8.json" > "$OUT/regret_decode_b8.log" 2>&1
  echo "regret rc=$? ($(( $(date +%s) - T0 )) s)"; tail -c 1500 "$OUT/regret_decode_b8.log"
fi
echo "total $(( $(date +%s) - T0 )) s"
