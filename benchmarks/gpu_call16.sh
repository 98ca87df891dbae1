#!/usr/bin/env bash
# 2026-12-06 late session, the tuner's compile-ahead batches (autotune/precompile.py) on a GPU: their GPU tests
# (a real flash key compiled ahead then launched without compiling; the tuner over every registered variant),
# then bench_tune_time.py (attntune tune with --compile-workers 0 against the default, fresh Triton caches).
set -u
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $GPU"
python3 -c "import triton, triton.runtime._async_compile as a; print('triton', triton.__version__, 'async compile mode:', a.AsyncCompileMode)" 2>&1 | tail -1
timeout ${T_TESTS:-170} python3 -m pytest -q -m gpu -n 8 tests/test_precompile.py tests/test_tuner.py \
  tests/test_triton_flash.py -k "precompile or compiled_ahead or gpu_tune or fast_launch" -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10; tail -1 "$OUT/gpu_tests.log"; echo "tests ($(( $(date +%s) - T0 )) s)"
timeout ${T_BENCH:-400} python3 benchmarks/bench_tune_time.py --out "$OUT/tune_time.json" --timeout ${T_RUN:-190} \
  ${BENCH_ARGS:-} > "$OUT/tune_time.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$OUT/tune_time.log" | cut -c1-1500
echo "total $(( $(date +%s) - T0 )) s"
