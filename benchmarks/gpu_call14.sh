#!/usr/bin/env bash
# Last device call of the 2026-12-06 evening session, adaptive: on an H200, resume the FP8 suite's re-tune
# (its two prefill keys stopped at the time limit in the first call) from RESUME_DB on top of the shipped
# cache.db; on any other card nothing else is worth the remaining budget — print the card and stop.
set -u
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
if echo "$GPU" | grep -q H200; then
  SUITES=fp8 SKIP_TESTS=1 BUDGET_S=${BUDGET_S:-220} bash benchmarks/gpu_call3.sh
fi
