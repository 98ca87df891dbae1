#!/usr/bin/env bash
# One device call: the whole GPU suite, then per card: on a card the shipped cache.db has no rows for (an
# H100), tune the default suite on top of cache.db (its rows added, the H200's kept); then one generate case
# and the new-length host cost. JSON/logs under $OUT (results.tar.gz, cache.db).
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
GEN="--protocol resident --models llama --caches dynamic,static --batches 1 --prompts 4096 --new-tokens 64 --repeats 2 --no-serving"
if echo "$GPU" | grep -q H200; then
  STAGES="tests generate" T_TESTS=${T_TESTS:-220} GENERATE_ARGS="$GEN" bash benchmarks/run_gpu.sh
else
  STAGES="tests tune generate" T_TESTS=${T_TESTS:-200} TUNE_BASE=cache.db \
    TUNE_ARGS="--trials 8 --time-limit ${TUNE_S:-240}" GENERATE_ARGS="$GEN" bash benchmarks/run_gpu.sh
fi
