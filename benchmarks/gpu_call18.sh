#!/usr/bin/env bash
# One device call for the two GPU-untested patches of 2026-12-07, any Hopper card (~6-7 min), applied to this copy
# of the tree only: docs/wip/fp8-decode-vkeys.patch (#15: FP8-KV decode with V stored keys-contiguous) and
# docs/wip/flash-vt-exp2.patch (#14/#15: descriptor loads over the FP8/TF32 keys-contiguous V copy, V_T, which
# lets the FP8 forward take LOADS 1/2; then the flash forward's exp2 split between the SFU and the FMA pipe).
#   1. (PROBE=1 only) the static picture first (no GPU needed): PTX counts of the probe's modes -> $OUT/ptx.txt
#   2. (PROBE=1 only) probe_fp8_decode.py, modes fp16 / vt, from HBM and L2-resident (B32 KV8192): does reading V keys-contiguous
#      lower the loop's own cost (131 µs L2-resident on the H100 on 2026-12-07)? -> $OUT/probe_vt_<card>.json
#   3. main's decode loop as it is: bench_fp8.py --quick --no-prefill -> $OUT/fp8_main_<card>.json; then with the
#      patches: the decode, FP8-decode and FP8-prefill GPU tests (odd shapes, windows, kv_lens, the keys layout bit
#      for bit against the d layout) -> $OUT/gpu_tests_vkeys.log
#   4. with the patch: bench_fp8.py --quick --no-prefill: fp8_decode (V as stored) and fp8_decode_vkeys side by
#      side with SDPA bf16, default config and swept -> $OUT/fp8_vkeys_<card>.json
#   5. with the patch: probe_exp2.py — EXP2 0/1 x LOADS 0/1/2 side by side with cuDNN, bf16 D128/D64 and FP8 prefill
#      -> $OUT/probe_exp2_<card>.json (and the flash GPU tests of the split, in 3)
# Land a patch only if its GPU tests pass and it is faster; landing stales the shipped rows of the kernels it edits
# (tests/test_equivalences.py and tests/test_shipped_cache.py say so): re-tune them or list the H200's as awaiting.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
if [ "${PROBE:-0}" = 1 ]; then  # diagnostic only (the landing decision is bench_fp8 below): ~3 min
  python3 benchmarks/probe_fp8_decode.py --ptx --modes fp16,vt > "$OUT/ptx.txt" 2>&1; tail -3 "$OUT/ptx.txt" | cut -c1-300
  timeout 150 python3 benchmarks/probe_fp8_decode.py --modes fp16,vt --cases 1 --l2-keys 256 --time-limit 60 \
      --grid '{"BLOCK_N": [64, 128, 256]}' --out "$OUT/probe_vt_$CARD.json" > "$OUT/probe_vt.log" 2>&1
  echo "probe rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(32|64|8) " "$OUT/probe_vt.log" | cut -c1-200
fi
show_fp8() {  # per case: graph µs of our entries and SDPA's default, the best configs; the summary
  python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cases"]:
    g = c.get("graph_us", {})
    print(c["B"], c["kv_len"], {k: round(v, 2) for k, v in g.items() if "decode" in k or k == "sdpa_default"},
          c.get("fp8_best_config"), c.get("fp8_decode_vkeys_best_config"))
print(json.dumps(d.get("summary")))
EOF
}
# main's decode loop first (the patch edits it for every layout and dtype): bf16_decode and fp8_decode as they run
# today, each against SDPA's default timed in the same run (~1 min)
timeout 120 python3 benchmarks/bench_fp8.py --quick --no-prefill --out "$OUT/fp8_main_$CARD.json" > "$OUT/fp8_main.log" 2>&1
echo "bench_fp8 (main) rc=$? ($(( $(date +%s) - T0 )) s)"; show_fp8 "$OUT/fp8_main_$CARD.json"
for p in fp8-decode-vkeys flash-vt-exp2; do
  git apply "docs/wip/$p.patch" || patch -p1 < "docs/wip/$p.patch" || { echo "$p did not apply"; exit 3; }
done
timeout 170 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_decode.py tests/test_fp8_decode.py tests/test_fp8_prefill.py \
    "tests/test_triton_flash.py::test_gpu_split_exp2_forward" > "$OUT/gpu_tests_vkeys.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; tail -3 "$OUT/gpu_tests_vkeys.log" | cut -c1-300
timeout 200 python3 benchmarks/bench_fp8.py --quick --no-prefill --out "$OUT/fp8_vkeys_$CARD.json" \
    > "$OUT/fp8_vkeys.log" 2>&1
echo "bench_fp8 rc=$? ($(( $(date +%s) - T0 )) s)"
show_fp8 "$OUT/fp8_vkeys_$CARD.json"
timeout 240 python3 benchmarks/probe_exp2.py --out "$OUT/probe_exp2_$CARD.json" > "$OUT/probe_exp2.log" 2>&1
echo "probe_exp2 rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/probe_exp2.log" | cut -c1-400
echo "total $(( $(date +%s) - T0 )) s"
