#!/usr/bin/env bash
# One device call: finish re-tuning the default suite's staled rows (TUNE_S seconds, resumable through
# RESUME_DB), then a generate subset against the cache just tuned: eager resident cases (B 1/8, prompt 4096,
# dynamic + static) and transformers' compiled static-cache generation (CUDA graphs: where the host overhead
# of an HF step is gone and attention's device time shows). Under $OUT: tune_default.log, cache.db,
# optuna.db, generate.json, generate.log, environment.json.
set -u
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
SKIP_TESTS=1 SUITES=default BUDGET_S=${TUNE_S:-200} CACHE_BASE=cache.db RESUME_DB=${RESUME_DB:-} \
  bash benchmarks/gpu_call3.sh
export ATTNTUNE_SYSTEM_CACHE="$OUT/cache.db"
timeout ${GEN_S:-340} python3 benchmarks/bench_generate.py --protocol resident --no-serving --no-new-length \
  --models llama,mistral --batches 1,8 --prompts 4096 --caches dynamic,static --repeats 3 \
  --compiled-static --compiled-cases ${COMPILED:-llama:1:512,llama:8:4096,mistral:8:4096} \
  --out "$OUT/generate.json" > "$OUT/generate.log" 2>&1
echo "generate rc=$?"; tail -25 "$OUT/generate.log"
