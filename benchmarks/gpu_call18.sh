#!/usr/bin/env bash
# One device call for the GPU-untested patches of 2026-12-07, any Hopper card, applied to this copy of the tree
# only: docs/wip/fp8-decode-vkeys.patch (#15: FP8-KV decode with V stored keys-contiguous; the decode loop takes
# whole tiles unmasked and the tail masked, for every layout and dtype) and docs/wip/flash-vt-exp2.patch (#14/#15:
# descriptor loads over the FP8/TF32 keys-contiguous V copy, V_T, which lets the FP8 forward take LOADS 1/2; then
# the flash forward's exp2 split between the SFU and the FMA pipe, EXP2).
# Sections in order of what they decide, each only while BUDGET_S (default 570) leaves it room:
#   1. the GPU tests of both patches: decode, FP8 decode (the keys layout bit for bit against the d layout), FP8
#      prefill (LOADS 0/1/2 with V_T), the split exp2 at odd shapes -> $OUT/gpu_tests.log            (~2 min)
#   2. probe_exp2.py: EXP2 0/1 x LOADS 0/1/2 beside cuDNN, FP8 and bf16 prefill -> probe_exp2_<card>.json (~3 min)
#   3. probe_fp8_decode.py, modes fp16 / vt, from HBM and L2-resident (B32 KV8192): the loop's own cost with V read
#      keys-contiguous (131 µs L2-resident on the H100 on 2026-12-07; on an H100 the HBM figure is bandwidth-bound,
#      so this is where the H200's gain shows) -> probe_vt_<card>.json                                   (~2 min)
#   4. bench_fp8.py --quick --no-prefill with the patch: fp8_decode and fp8_decode_vkeys beside SDPA bf16 and our
#      bf16 decode (compare with fp8_h100_2026-12-07.json: the old loop, against SDPA timed in its run) (~1.5 min)
# Land a patch only if its GPU tests pass and it is faster; landing stales the shipped rows of the kernels it edits
# (tests/test_equivalences.py and tests/test_shipped_cache.py say so): re-tune them or list the H200's as awaiting.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-570} - ($(date +%s) - T0) )); }
room() { [ "$(left)" -ge "$1" ] || { echo "skipped $2: $(left) s left"; return 1; }; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
CARD=$(echo "$GPU" | grep -oiE 'h200|h100|a100|l40s|mi[0-9]+' | head -1 | tr 'A-Z' 'a-z'); CARD=${CARD:-gpu}
for p in fp8-decode-vkeys flash-vt-exp2; do
  git apply "docs/wip/$p.patch" || patch -p1 < "docs/wip/$p.patch" || { echo "$p did not apply"; exit 3; }
done
timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_decode.py tests/test_fp8_decode.py \
    tests/test_fp8_prefill.py "tests/test_triton_flash.py::test_gpu_split_exp2_forward" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head; tail -1 "$OUT/gpu_tests.log"
if room 120 probe_exp2; then
  timeout $(( $(left) < 220 ? $(left) : 220 )) python3 benchmarks/probe_exp2.py --out "$OUT/probe_exp2_$CARD.json" \
      > "$OUT/probe_exp2.log" 2>&1
  echo "probe_exp2 rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/probe_exp2.log" | cut -c1-400
fi
if room 100 probe_vt; then
  timeout $(( $(left) < 140 ? $(left) : 140 )) python3 benchmarks/probe_fp8_decode.py --modes fp16,vt --cases 1 \
      --l2-keys 256 --time-limit 50 --grid '{"BLOCK_N": [64, 128, 256]}' --out "$OUT/probe_vt_$CARD.json" \
      > "$OUT/probe_vt.log" 2>&1
  echo "probe_vt rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(32|64|8) " "$OUT/probe_vt.log" | cut -c1-200
fi
if room 70 bench_fp8; then
  timeout $(( $(left) - 5 )) python3 benchmarks/bench_fp8.py --quick --no-prefill --out "$OUT/fp8_vkeys_$CARD.json" \
      > "$OUT/fp8_vkeys.log" 2>&1
  echo "bench_fp8 rc=$? ($(( $(date +%s) - T0 )) s)"
  python3 - "$OUT/fp8_vkeys_$CARD.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cases"]:
    g = c.get("graph_us", {})
    print(c["B"], c["kv_len"], {k: round(v, 2) for k, v in g.items() if "decode" in k or k == "sdpa_default"},
          c.get("fp8_best_config"), c.get("fp8_decode_vkeys_best_config"))
print(json.dumps(d.get("summary")))
EOF
fi
echo "total $(( $(date +%s) - T0 )) s"
