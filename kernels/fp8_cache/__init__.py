"""The FP8 cache append: quantise new keys and values into a float8 KV cache's next slots in one Triton launch
(:func:`~attntune.kernels.fp8_cache.launch.append_kv_`; device code in :mod:`.jit`)."""
