#!/usr/bin/env bash
# One short device call that checks main end to end on whatever sm_90 card comes: the whole GPU suite,
# `attntune explain` on a sliding-window key (torch's own reasons, nothing on stderr), `attntune doctor`,
# sibling-device plans (the shipped cache without this card's rows: keys it tuned are served by the other
# sm_90 card's rows, source "sibling"), and bench_generate's serving loop + new-length host cost only.
# Under $OUT: gpu_tests.log, explain_*.txt/.err, doctor.txt, generate_serving.json/.log.
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
timeout ${T_TESTS:-170} python3 -m pytest -q -m gpu -n 16 tests -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -1 "$OUT/gpu_tests.log"
attntune explain --shape b=1,hq=32,hkv=8,sq=4096,d=128,causal=1,window=1023:0 > "$OUT/explain_window.txt" \
  2> "$OUT/explain_window.err"
echo "explain window rc=$? stderr bytes $(wc -c < "$OUT/explain_window.err")"; grep -E "^(variant|source|why)" "$OUT/explain_window.txt" | head -8
attntune doctor > "$OUT/doctor.txt" 2>&1; grep -E "^(device|siblings|hints)" "$OUT/doctor.txt"
python3 - "$GPU" <<'PY'
import shutil, sqlite3, sys
shutil.copy("cache.db", "/tmp/sib.db")
c = sqlite3.connect("/tmp/sib.db")
n = c.execute("delete from winners where json_extract(key_json, '$.device.name') = ?", (sys.argv[1],)).rowcount
c.commit(); print(f"sibling check: {n} rows of {sys.argv[1]} removed from a copy of cache.db")
PY
for shape in b=8,hq=32,hkv=8,sq=1,skv=4096,d=128,kv_lens=1 b=1,hq=32,hkv=8,sq=4096,d=128,causal=1,window=1023:0; do
  ATTNTUNE_SYSTEM_CACHE=/tmp/sib.db attntune explain --shape $shape > "$OUT/explain_sibling_$shape.txt" 2>&1
  grep -E "^(variant|source|why       sibling)" "$OUT/explain_sibling_$shape.txt" | head -4
done
timeout ${GEN_S:-200} python3 benchmarks/bench_generate.py --protocol resident --models llama --batches 1 \
  --prompts 512 --caches dynamic --repeats 1 --new-tokens 8 --out "$OUT/generate_serving.json" \
  > "$OUT/generate_serving.log" 2>&1
echo "generate rc=$?"; grep -E "serving|new-length|new_length" "$OUT/generate_serving.log" | tail -6
python3 -c "
import json; s=json.load(open('$OUT/generate_serving.json'))['summary']
print({k: s.get(k) for k in ('serving_loop_causal_vs_sdpa','serving_loop_noncausal_vs_sdpa','serving_loop_graph_vs_sdpa','new_length_extra_us','new_length_extra_us_sdpa','geomean_vs_sdpa')})"
echo "total $(( $(date +%s) - T0 )) s"
