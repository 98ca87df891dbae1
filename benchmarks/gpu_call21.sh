#!/usr/bin/env bash
# The 2026-12-07 (thirty-first) session's last device call: the Gluon forward probe (#14: explicit async wgmma,
# softmax overlapped with PV; checked against SDPA, timed beside cuDNN, FA2 and our Triton forward), then on an
# H200 the one regret key of families16 the day's 7-key run did not reach and that holds the max (decode B8 KV1024 D64).
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
timeout ${PROBE_S:-110} python3 benchmarks/probe_gluon_fwd.py --time-limit 70 --out "$OUT/probe_gluon_fwd_$CARD.json" \
    > "$OUT/probe_gluon_fwd.log" 2>&1
echo "probe rc=$? ($(( $(date +%s) - T0 )) s)"; grep -vE "^\s*$" "$OUT/probe_gluon_fwd.log" | tail -16 | cut -c1-330
if [ "$CARD" = h200 ] && [ "${REGRET_S:-0}" != 0 ]; then
  timeout $(( REGRET_S + 30 )) python3 benchmarks/regret.py --keys families16 --families decode --first-key 1 \
      --max-configs 32 --time-limit $REGRET_S --out "$OUT/regret_h200_decode_b8.json" > "$OUT/regret_decode_b8.log" 2>&1
  echo "regret rc=$? ($(( $(date +%s) - T0 )) s)"; tail -c 1500 "$OUT/regret_decode_b8.log"
fi
echo "total $(( $(date +%s) - T0 )) s"
