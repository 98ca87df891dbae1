"""Where the host time of decode goes (GPU machine): cProfile of the serving loop and of a Hugging Face
``generate`` per attention implementation, after warm-up. Prints the top functions by own time and writes
them to JSON. A diagnostic, not a benchmark: profiling inflates every Python call.

Usage: python benchmarks/profile_host.py --out profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402


def _top(prof: cProfile.Profile, n: int = 18) -> str:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(n)
    return buf.getvalue()


def serving(out: dict) -> None:
    import attntune

    dev = "cuda"
    B, Hq, Hkv, D, P0, steps = 2, 32, 8, 64, 1024, 64
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, P0 + 3 * steps, D, device=dev, dtype=torch.bfloat16)
    for causal, base in ((True, P0), (False, P0 + steps)):
        for L in range(base - steps, base):  # warm-up on other lengths
            attntune.attention(q, k[:, :, :L], k[:, :, :L], causal=causal)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for L in range(base + steps, base + 2 * steps):
            for _ in range(8):
                attntune.attention(q, k[:, :, :L], k[:, :, :L], causal=causal)
        prof.disable()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e6
        out[f"serving_causal_{causal}"] = {"us_per_step_profiled": wall, "top": _top(prof)}
        print(f"--- serving causal={causal}: {wall:.1f} us/step (profiled)\n{_top(prof)}", flush=True)
    out["plans"] = attntune.stats()["plans"][:4]


def generate(out: dict, batch: int) -> None:
    import transformers

    import attntune.hf

    attntune.hf.register()
    cfg = transformers.MistralConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                                     num_attention_heads=32, num_key_value_heads=8, sliding_window=1024,
                                     max_position_embeddings=8192)
    ids = torch.randint(0, 32000, (batch, 512), device="cuda")
    kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False, attention_mask=torch.ones_like(ids))
    torch.manual_seed(0)
    for impl in ("sdpa", "attntune"):
        m = transformers.MistralForCausalLM._from_config(cfg, attn_implementation=impl, torch_dtype=torch.bfloat16)
        m = m.to("cuda").eval()
        with torch.no_grad():
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            plain = time.perf_counter() - t0
            prof = cProfile.Profile()
            prof.enable()
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            prof.disable()
        out[f"generate_{impl}_B{batch}"] = {"seconds_unprofiled": plain, "top": _top(prof, 25)}
        print(f"--- generate mistral B={batch} {impl}: {plain:.3f} s unprofiled\n{_top(prof, 25)}", flush=True)
        del m
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="profile_host.json")
    args = ap.parse_args()
    out = {"environment": environment()}
    for fn in (serving, lambda o: generate(o, 8)):
        try:
            fn(out)
        except Exception as e:  # noqa: BLE001
            out.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
            print("FAILED", e, flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
