# Sourced by gpu_call22.sh / gpu_call23.sh (needs GPU, OUT, T0): on an H200 with REGRET_S set, re-run #13's
# max-regret key (decode B8 KV1024 D64, not re-run on an H200 since 2026-12-04) for REGRET_S seconds. Merge after:
# python benchmarks/regret.py --merge benchmarks/results/regret_h200.json <new>.json --out benchmarks/results/regret_h200.json
if echo "$GPU" | grep -qi h200 && [ "${REGRET_S:-0}" != 0 ]; then
  timeout $(( REGRET_S + 30 )) python3 benchmarks/regret.py --keys families16 --families decode --first-key 1 \
      --max-configs 32 --time-limit $REGRET_S --out "$OUT/regret_h200_decode_b8.json" > "$OUT/regret_decode_b8.log" 2>&1
  echo "regret rc=$? ($(( $(date +%s) - T0 )) s)"; tail -c 800 "$OUT/regret_decode_b8.log"
fi
