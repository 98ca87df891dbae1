"""One launch of probe_fp8_decode's loop per mode, for a profiler (``ncu``) to read: B32 KV8192 Hq32/Hkv8 D128,
BLOCK_N 128, 4 warps, 2 stages, reads from HBM (``--l2-keys 0``) or L2 (``--l2-keys 256``).

    ncu --kernel-name probe_kernel --section WarpStateStats ... python benchmarks/ncu_fp8_decode.py --modes fp16
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_fp8_decode as p  # noqa: E402

from attntune import fp8  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--modes", default="fp16")
ap.add_argument("--l2-keys", type=int, default=0)
args = ap.parse_args()
b, s, hq, hkv, D = 32, 8192, 32, 8, 128
q = torch.randn(b, hq, D, device="cuda", dtype=torch.float16)
k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
k8, v8, ks, vs = fp8.quantize_kv(k, v)
ks, vs = ks.reshape(hkv).float().contiguous(), vs.reshape(hkv).float().contiguous()
out = torch.empty(b, hq, D, device="cuda", dtype=torch.float32)
cfg = dict(BLOCK_N=128, num_warps=4, num_stages=2)
for mode in args.modes.split(","):
    for _ in range(2):  # the first launch compiles
        p.launch(mode, q, k8, v8, ks, vs, out, cfg, hq // hkv, args.l2_keys or None)
torch.cuda.synchronize()
