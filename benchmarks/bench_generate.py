"""Generation benchmark: what users get from Hugging Face ``generate`` with ``attn_implementation="attntune"``
against ``"sdpa"``, plus a raw decode serving loop and the host cost of a new KV length.

    python benchmarks/bench_generate.py --out benchmarks/results/generate_h200.json                 # defaults
    python benchmarks/bench_generate.py --protocol both --out benchmarks/results/generate_h200.json # + fresh
    python benchmarks/bench_generate.py --quick --out /tmp/generate_quick.json
    python benchmarks/bench_generate.py --smoke --out /tmp/generate_smoke.json                      # CPU

Models (random weights, seeded, identical for every implementation: the second is loaded with the first's
state dict): a Llama-style GQA decoder and a Mistral-style sliding-window one (W=1024), 8 layers, hidden
2048, 32 query / 8 KV heads (head dim 64), MLP 5632, vocab 32000, bf16 on CUDA, eval mode. Generation is
greedy, exactly ``--new-tokens`` tokens (min_new_tokens = max_new_tokens, EOS never ends it), with an
all-ones attention mask passed explicitly.

Sections of the JSON (``--out``, rewritten after every case so that a timeout still leaves results):

* ``cases`` -- protocol "resident" (default): per model kind both implementations stay resident; every
  (impl, cache, batch, prompt) is warmed up with one short generate, then ``--repeats`` generates per
  impl are timed, the impl order alternating between repeats (ABAB / BABA), ``cuda.synchronize`` around
  each, wall clock. tokens/s = batch * new_tokens / median seconds. Unless ``--no-prefill-split``, a
  generate with ``max_new_tokens=1`` is timed after each run as the prefill cost, and decode tokens/s =
  batch * (new_tokens - 1) / (median full - median prefill). The greedy tokens of attntune and SDPA are
  compared (fraction equal; bf16 rounding may legitimately make them diverge: reported, not failed).
  ``fp8static`` (opt-in: ``--caches dynamic,static,fp8static``) gives attntune its FP8 KV cache
  (``attntune.hf_fp8.FP8StaticCache``: e4m3 codes in the full-attention layers) against SDPA's bf16 static
  cache, reported apart (``fp8static_vs_sdpa``; with ``--compiled-static`` each compiled case also runs it:
  ``compiled_fp8static_vs_sdpa``), never in the like-for-like ratios.
  Static caches run eagerly (``disable_compile=True``); ``--compiled-static`` adds the cases of
  ``--compiled-cases`` (``model:B:P``, default one small Llama case) with transformers' automatic
  compilation of the decode step (``compiled``; ``compiled_static`` is the first one), where the host
  overhead of an HF step is gone and attention's device time shows.
* ``fresh`` -- protocol "fresh" (``--protocol fresh|both``): per impl a new Python process builds one
  model, runs one long prefill (B=2 x 4096 tokens), one short warm-up generate, then times the case.
* ``serving`` -- a raw decode loop (B=2, 32/8 heads, D=64): per step 8 attention calls over the first L
  keys of a KV buffer, L one longer every step (each timed step sees a KV length never seen before), eager
  attntune (causal and not) vs eager SDPA; and under CUDA graphs with ``kv_lens`` (SDPA: a boolean mask).
* ``new_length`` -- host time of the first call at a never-seen KV length minus that of a call at the length
  seen just before, both after a sync (``extra_us_*``; a generate step's first call follows a sync), and minus
  an immediate back-to-back repeat (``extra_back_to_back_us_*``, the first version's figure).
* ``summary`` -- ratios attntune / SDPA (> 1 = attntune faster).

Without CUDA (or with ``--smoke``) everything runs a tiny float32 configuration on the CPU (the test).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import math
import os
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD_MARK = "BENCH_GENERATE_CHILD_JSON "
KINDS = ("llama", "mistral")
CACHES = ("dynamic", "static", "fp8static")
#: the environment variable through which ``--fp8-v-layout`` (the FP8 cache's V storage order,
#: attntune.fp8.V_LAYOUTS) reaches the child processes that run the cases
FP8_V_LAYOUT_ENV = "BENCH_GENERATE_FP8_V_LAYOUT"
#: the environment variable through which ``--fp8-append`` (how the FP8 cache appends: the Triton kernel on a GPU
#: by itself, or torch ops — ``FP8StaticLayer.append_kernel``) reaches the children
FP8_APPEND_ENV = "BENCH_GENERATE_FP8_APPEND"
FP8_APPENDS = {"auto": None, "kernel": True, "torch": False}
AUTO_PIN_CPUS = 4  # --cpus auto: host work of one generate is one Python thread plus the driver's threads


# ---- small helpers ----------------------------------------------------------------------------------
def _log(*a):
    print(*a, flush=True)


def _csv(s, typ=str):
    return [typ(x) for x in str(s).split(",") if x.strip()]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _err(e: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {e}\n{tb[-2000:]}"


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


# ---- attntune telemetry (public API only) -------------------------------------------------------------
def _att_counts() -> dict:
    """Calls per (variant/source) over all plans, the number of plans and the quarantined variants."""
    import attntune

    try:
        st = attntune.stats()
    except Exception as e:  # noqa: BLE001 — telemetry must never break the benchmark
        return {"_error": repr(e)}
    out: dict = {}
    for p in st.get("plans", []):
        k = f"{p.get('variant')}/{p.get('source')}"
        out[k] = out.get(k, 0) + int(p.get("calls") or 0)
    out["_plans"] = len(st.get("plans", []))
    out["_calls"] = int(st.get("calls") or 0)
    out["_quarantined"] = st.get("quarantined") or []
    return out


def _att_delta(before: dict, after: dict) -> dict:
    d = {}
    for k, v in after.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            dv = v - before.get(k, 0)
            if dv:
                d[k] = dv
    q = after.get("_quarantined") or []
    if q and q != before.get("_quarantined"):
        d["quarantined"] = q
    return d


# ---- models ---------------------------------------------------------------------------------------------
def model_config(kind: str, smoke: bool, max_pos: int = 8192):
    import transformers

    if smoke:
        common = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": max(128, max_pos)}
        window = 8
    else:
        common = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                  "max_position_embeddings": max(8192, max_pos)}
        window = 1024
    common.update(pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if kind == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralForCausalLM, transformers.MistralConfig(sliding_window=window, **common)
    raise ValueError(f"unknown model kind {kind!r} (llama, mistral)")


def build_models(kind, impls, device, dtype, smoke, max_pos):
    """One model per impl, identical weights (seeded; later ones load the first one's state dict)."""
    cls, cfg = model_config(kind, smoke, max_pos)
    models, base = {}, None
    for impl in impls:
        torch.manual_seed(0)
        try:
            with torch.device(device):  # initialise on the device: random init of 0.5B params on a CPU is slow
                m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype)
        except Exception:  # noqa: BLE001 — fall back to a CPU init
            m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype)
        m = m.to(device).eval()  # (no dtype cast: RoPE inv_freq stays float32, as transformers makes it)
        if base is None:
            base = m
        else:
            m.load_state_dict(base.state_dict())
        assert m.config._attn_implementation == impl, (m.config._attn_implementation, impl)
        m.generation_config.pad_token_id = 0
        models[impl] = m
    return models, cfg


def case_inputs(kind, batch, prompt, vocab, device):
    g = torch.Generator().manual_seed(_seed("ids", kind, batch, prompt))
    ids = torch.randint(3, vocab, (batch, prompt), generator=g).to(device)
    return ids, torch.ones_like(ids)


class StepClock:
    """A logits processor that only reads the host clock: transformers calls it once per generated token,
    after that token's forward, and ``generate`` waits for the device every step (its stopping check reads
    a tensor), so the gaps between stamps are decode steps as the user sees them. The median gap is robust
    to the host's hiccups (a preempted core, a garbage collection) that move a whole run's wall time."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores

    def step_us(self):
        """Median µs between consecutive decode steps (None with fewer than 3 stamps)."""
        gaps = [(b - a) * 1e6 for a, b in zip(self.stamps, self.stamps[1:])]
        return _median(gaps) if len(gaps) >= 2 else None


class GcMeter:
    """Python's garbage collections during a block: count and seconds per generation (a full collection
    walks every live object; a process that grew many objects pays it inside its timed runs)."""

    def __init__(self):
        self.t0 = None
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]

    def _cb(self, phase, info):
        if phase == "start":
            self.t0 = time.perf_counter()
        elif self.t0 is not None:
            g = info.get("generation", 0)
            self.seconds[g] += time.perf_counter() - self.t0
            self.count[g] += 1

    def __enter__(self):
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._cb)

    def summary(self):
        return {"count": list(self.count), "ms": [round(x * 1e3, 3) for x in self.seconds],
                "live_objects": len(gc.get_objects())}


class RunMeter:
    """What the host and the GPU were doing during one timed run, to tell a slow *state* of the machine
    from a slow implementation (identical runs here differ by up to 1.9x, a whole run at a time):

    * ``cpu_s`` / ``wall_s`` — this process's CPU time (all threads) and wall time: a preempted or
      throttled host shows as less CPU per wall second, or as more CPU for the same work;
    * ``vcsw`` / ``ivcsw`` — voluntary and involuntary context switches (``getrusage``): involuntary ones
      are the scheduler taking the core away;
    * ``sm_mhz`` — the GPU's SM clock sampled every ``period`` s by a thread through NVML (min, median,
      max; absent without ``pynvml``): ``generate`` waits for the device every step, so a GPU that clocked
      down lengthens the step even where the host sets the pace;
    * ``gpu_util`` — NVML's share of time the GPU ran a kernel (min, median, max of the same samples): a
      slow run with the GPU busier is a slow device, one with it idler a slow host;
    * ``power_w`` — the board's power draw (W; min, median, max): a power-capped card lowers its clock;
    * ``clock_reasons`` — why the clock sat below its top in any sample (NVML's clock event / throttle reasons,
      named by :data:`CLOCK_REASONS`; "gpu_idle" left out) and ``temp_c`` (min, median, max): a card that clocks
      down under sustained load for power ("sw_power_cap") does so for every user of that workload, one that
      does for heat ("sw_thermal", "hw_thermal") depends on the machine (the H100 of 2026-12-07 timed heavy
      kernels at 1695-1755 MHz against 1980, reason unknown then);
    * ``probe_us`` — a fixed piece of pure-Python work (:func:`host_probe_us`) timed just before and just
      after the run: CPU time alone cannot tell a slow host from a waiting one, because CUDA's default
      synchronisation spins (a sync on a slow GPU is CPU time too), but a host that computes slower runs
      the probe slower;
    * ``steal`` — the hypervisor's steal ticks (``/proc/stat``, 1/100 s) on this process's CPUs during
      the run (absent where unreadable): time a virtual CPU wanted to run and was not given."""

    def __init__(self, device, period: float = 0.1):
        self.period = period
        self.samples, self.util, self.power, self.temp = [], [], [], []
        self.reasons = 0  # NVML clock reason bits seen in any sample
        self._stop = None
        self._nvml = None
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            self._nvml = _nvml_handle(idx)

    def _sample(self):
        nv, h = self._nvml
        while not self._stop.wait(self.period):
            try:
                self.samples.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
                self.util.append(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # noqa: BLE001
                return
            try:  # not every board reports its power: the clocks go on without it
                self.power.append(round(nv.nvmlDeviceGetPowerUsage(h) / 1000))
            except Exception:  # noqa: BLE001
                pass
            try:  # NVML >= 12 names it "clocks event reasons", older ones "throttle reasons"
                get = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                    nv.nvmlDeviceGetCurrentClocksThrottleReasons
                self.reasons |= int(get(h))
                self.temp.append(int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self):
        import resource
        import threading

        self._probe = host_probe_us()
        self._steal = steal_ticks()
        self._ru = resource.getrusage(resource.RUSAGE_SELF)
        self._t = (time.perf_counter(), time.process_time())
        if self._nvml is not None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        import resource

        wall, cpu = time.perf_counter() - self._t[0], time.process_time() - self._t[1]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        self.result = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                       "vcsw": ru.ru_nvcsw - self._ru.ru_nvcsw, "ivcsw": ru.ru_nivcsw - self._ru.ru_nivcsw}
        self.result["probe_us"] = [round(self._probe, 1), round(host_probe_us(), 1)]
        steal = steal_ticks()
        if steal is not None and self._steal is not None:
            self.result["steal"] = steal - self._steal
        for name, xs in (("sm_mhz", self.samples), ("gpu_util", self.util), ("power_w", self.power),
                         ("temp_c", self.temp)):
            if xs:
                xs = sorted(xs)
                self.result[name] = [xs[0], xs[len(xs) // 2], xs[-1]]
        if self._nvml is not None:
            self.result["clock_reasons"] = clock_reasons(self.reasons)


#: NVML's clock event (throttle) reason bits (``nvmlClocksEventReason*``)
CLOCK_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                 0x100: "display_clocks"}


def clock_reasons(bits: int) -> list:
    """The names of NVML clock reason ``bits`` but "gpu_idle" (samples between kernels are idle), unknown
    bits as hex.

    >>> clock_reasons(0x1 | 0x4 | 0x20), clock_reasons(0), clock_reasons(0x1000)
    (['sw_power_cap', 'sw_thermal'], [], ['0x1000'])
    """
    names = [name for bit, name in CLOCK_REASONS.items() if bits & bit and bit != 0x1]
    rest = bits & ~sum(CLOCK_REASONS)
    return names + ([hex(rest)] if rest else [])


_NVML: dict = {}


def _nvml_handle(idx: int):
    """``(pynvml, handle)`` of GPU ``idx``, initialised once per process (None without NVML: the clocks
    are then simply not recorded)."""
    if idx not in _NVML:
        try:
            import pynvml

            if not _NVML:
                pynvml.nvmlInit()
            _NVML[idx] = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx))
        except Exception:  # noqa: BLE001
            _NVML[idx] = None
    return _NVML[idx]


def host_probe_us(reps: int = 5) -> float:
    """Median µs of a fixed piece of pure-Python work (dict and integer operations, about 0.3 ms on a
    2 GHz core): the host's speed at this moment, for :class:`RunMeter`."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        d = {}
        for i in range(3000):
            d[i & 255] = d.get(i & 255, 0) + i * 3
        ts.append(time.perf_counter() - t0)
    return _median(ts) * 1e6


def steal_ticks() -> Optional[int]:
    """Steal ticks summed over this process's CPUs (``/proc/stat``, field 8 of each ``cpuN`` line), or
    None where unreadable."""
    try:
        cpus = os.sched_getaffinity(0)
        total = 0
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                f = line.split()
                if int(f[0][3:]) in cpus and len(f) > 8:
                    total += int(f[8])
        return total
    except (OSError, ValueError, AttributeError):
        return None


def generate(model, ids, mask, new_tokens, cache, compile_ok=False, clock=None):
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0,
          "disable_compile": not compile_ok}
    if clock is not None:
        from transformers import LogitsProcessorList

        kw["logits_processor"] = LogitsProcessorList([clock])
    if cache == "fp8static" and model.config._attn_implementation == "attntune":
        # attntune's FP8 KV cache (e4m3 codes, per-kv-head scales); SDPA cannot read codes: its side of an
        # fp8static case is the bf16 static cache below, what a user compares against
        from attntune.hf_fp8 import FP8StaticCache

        fp8_cache = FP8StaticCache(config=model.config, max_cache_len=ids.shape[1] + new_tokens,
                                   v_layout=os.environ.get(FP8_V_LAYOUT_ENV, "d"))
        append = FP8_APPENDS[os.environ.get(FP8_APPEND_ENV, "auto")]
        for layer in fp8_cache.layers:
            if hasattr(layer, "append_kernel"):
                layer.append_kernel = append
        kw["past_key_values"] = fp8_cache
    elif cache in ("static", "fp8static"):
        kw["cache_implementation"] = "static"
        if not compile_ok:
            # transformers sizes a new static cache to max(this call, every earlier call): keep each case's own
            model.__dict__.pop("_previous_max_cache_length", None)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate produced {out.shape[1] - ids.shape[1]} tokens, wanted {new_tokens}")
    return out


def _dynamo_graphs():
    """torch.compile's count of compiled graphs so far (None where it cannot be read)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return None


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _token_match(a, b):
    """Fraction of equal generated tokens, and the first position where any row differs (None: none)."""
    if a is None or b is None or a.shape != b.shape:
        return None, None
    eq = a == b
    frac = float(eq.float().mean())
    bad = (~eq).any(dim=0).nonzero()
    return frac, (int(bad[0]) if bad.numel() else None)


def _impl_stats(rec, batch, new_tokens):
    runs = rec.get("runs_s") or []
    if not runs:
        return
    med = _median(runs)
    rec.update(median_s=med, min_s=min(runs), max_s=max(runs), tok_s=batch * new_tokens / med)
    steps = [x for x in rec.get("step_us") or [] if x]
    if steps:
        rec["step_us_median"] = _median(steps)
    pre = rec.get("prefill_runs_s") or []
    if pre and new_tokens > 1:
        pm = _median(pre)
        rec["prefill_median_s"] = pm
        rec["decode_tok_s"] = batch * (new_tokens - 1) / (med - pm) if med > pm else None


def _ratio(per, key):
    if "sdpa" in per and "attntune" in per:
        a, s = per["attntune"].get(key), per["sdpa"].get(key)
        if a and s:
            return a / s
    return None


def _spread_fields(per) -> dict:
    """How far apart repeated runs are, next to the median ratio (the host of a lent GPU is noisy: whole
    runs of one implementation differ by 10-30 % there). ``pair_ratios``: SDPA's run over attntune's within
    each repeat (the two ran back to back, order alternating); ``ratio_best``: SDPA's fastest run over
    attntune's fastest (the run least disturbed by the host); ``same_impl_spread``: slowest over fastest
    run of each implementation, minus one — a ratio between implementations closer to 1 than this is
    within the noise of one of them."""
    s, a = (per.get(i, {}).get("runs_s") or [] for i in ("sdpa", "attntune"))
    return {"pair_ratios": [x / y for x, y in zip(s, a)] if s and a else None,
            "ratio_best": min(s) / min(a) if s and a else None,
            "same_impl_spread": {i: max(r["runs_s"]) / min(r["runs_s"]) - 1 for i, r in per.items()
                                 if len(r.get("runs_s") or []) >= 2}}


# ---- resident protocol ----------------------------------------------------------------------------------
def run_case(models, kind, cache, batch, prompt, args, device, vocab, compile_ok=False):
    impls = list(models)
    t_case = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ids, mask = case_inputs(kind, batch, prompt, vocab, device)
    n = args.new_tokens
    per = {impl: {"runs_s": [], "prefill_runs_s": []} for impl in impls}
    tokens = {}
    before = _att_counts()
    warm_n = n if compile_ok else args.warmup_tokens
    if compile_ok:
        # Every compiled case starts from an empty dynamo cache, as a user's process compiles its one model:
        # the graphs of earlier cases (both implementations, prefill and decode) count against dynamo's
        # recompile limit of the shared `wrapper` frame, and past it (the 4th case of a run, H100
        # 2026-12-05: "hit config.recompile_limit (8)") the case ran uncompiled — Mistral B8 P512 measured
        # 0.30x SDPA in a run of four cases, 1.26x as the run's first (generate_h100_2026-12-05d/e).
        torch._dynamo.reset()
    for impl in impls:  # warm-up (compiled: two full-length generates; the first one compiles)
        graphs0 = _dynamo_graphs()
        try:
            per[impl]["warmup_s"] = []
            for _ in range(2 if compile_ok else 1):
                t, out = _timed(functools.partial(generate, models[impl], ids, mask, warm_n, cache, compile_ok),
                                device)
                per[impl]["warmup_s"].append(t)
                del out
        except Exception as e:  # noqa: BLE001 — record and go on
            per[impl]["error"] = _err(e)
            _log(f"  {impl}: warm-up failed: {type(e).__name__}: {e}")
            _free(device)
        if compile_ok and graphs0 is not None:  # did transformers' auto-compile really compile something?
            per[impl]["dynamo_graphs_compiled"] = _dynamo_graphs() - graphs0
    for r in range(args.repeats):
        order = impls if r % 2 == 0 else impls[::-1]
        for impl in order:
            if "error" in per[impl]:
                continue
            try:
                clock, meter = StepClock(), RunMeter(device)
                with meter:
                    t, out = _timed(functools.partial(generate, models[impl], ids, mask, n, cache, compile_ok,
                                                      clock), device)
                per[impl]["runs_s"].append(t)
                per[impl].setdefault("step_us", []).append(clock.step_us())
                per[impl].setdefault("meter", []).append(meter.result)
                tokens[impl] = out[:, prompt:].cpu()
                del out
                if args.prefill_split and not compile_ok:
                    t1, out = _timed(functools.partial(generate, models[impl], ids, mask, 1, cache), device)
                    per[impl]["prefill_runs_s"].append(t1)
                    del out
            except Exception as e:  # noqa: BLE001
                per[impl]["error"] = _err(e)
                _log(f"  {impl}: failed: {type(e).__name__}: {e}")
                _free(device)
    for impl in impls:
        _impl_stats(per[impl], batch, n)
    frac, first = _token_match(tokens.get("attntune"), tokens.get("sdpa"))
    su = {i: per[i].get("step_us_median") for i in impls}
    rec = {"model": kind, "cache": cache, "batch": batch, "prompt": prompt, "new_tokens": n,
           "compiled": compile_ok, "impls": per, "ratio": _ratio(per, "tok_s"),
           # SDPA's median decode step over attntune's (> 1: attntune's steps are shorter)
           "step_ratio": su["sdpa"] / su["attntune"] if su.get("sdpa") and su.get("attntune") else None,
           "decode_ratio": _ratio(per, "decode_tok_s"), **_spread_fields(per), "tokens_equal_frac": frac,
           "first_divergence": first, "attntune_calls": _att_delta(before, _att_counts())}
    if device.type == "cuda":
        rec["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del tokens
    _free(device)
    rec["elapsed_s"] = time.perf_counter() - t_case
    return rec


def _case_line(rec, elapsed_total):
    per = rec["impls"]

    def tok(impl):
        r = per.get(impl, {})
        return "ERROR" if "error" in r else (f"{r['tok_s']:.0f}" if r.get("tok_s") else "-")

    ratio = f"{rec['ratio']:.3f}" if rec.get("ratio") else "-"
    if rec.get("step_ratio"):
        ratio += f" (steps {rec['step_ratio']:.3f})"
    eq = f"{rec['tokens_equal_frac']:.2f}" if rec.get("tokens_equal_frac") is not None else "-"
    return (f"[{elapsed_total:7.1f}s] {rec['model']:7s} {rec['cache']:7s} B={rec['batch']:<3d} "
            f"P={rec['prompt']:<5d} sdpa {tok('sdpa')} tok/s  attntune {tok('attntune')} tok/s  "
            f"ratio {ratio}  tokens equal {eq}  ({rec['elapsed_s']:.1f}s)")


# ---- fresh protocol ---------------------------------------------------------------------------------------
def child_main(spec: dict) -> None:
    """One fresh process: build ONE model, one long prefill, one warm-up generate, timed generates."""
    import transformers

    import attntune
    import attntune.hf

    transformers.logging.set_verbosity_error()
    attntune.hf.register()
    if spec["smoke"]:
        torch.set_num_threads(1)
    t_start = time.perf_counter()
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    kind, impl, cache = spec["model"], spec["impl"], spec["cache"]
    batch, prompt, n = spec["batch"], spec["prompt"], spec["new_tokens"]
    res: dict = {"impl": impl, "pid": os.getpid()}
    try:
        t0 = time.perf_counter()
        models, cfg = build_models(kind, [impl], device, dtype, spec["smoke"], spec["max_pos"])
        model = models[impl]
        _sync(device)
        res["build_s"] = time.perf_counter() - t0
        g = torch.Generator().manual_seed(_seed("long", kind))
        long_ids = torch.randint(3, cfg.vocab_size, (2, spec["prefill_tokens"]), generator=g).to(device)
        with torch.no_grad():
            t, out = _timed(functools.partial(model, input_ids=long_ids, use_cache=False), device)
        res["long_prefill_s"] = t
        del out
        ids, mask = case_inputs(kind, batch, prompt, cfg.vocab_size, device)
        t, out = _timed(lambda: generate(model, ids, mask, spec["warmup_tokens"], cache), device)
        res["warmup_s"] = t
        del out
        res["cpu"] = cpu_state()
        runs, toks, steps, gcs, meters = [], None, [], [], []
        for _ in range(spec["repeats"]):
            clock, gcm, meter = StepClock(), GcMeter(), RunMeter(device)
            with gcm, meter:
                t, out = _timed(lambda: generate(model, ids, mask, n, cache, clock=clock), device)
            runs.append(t)
            steps.append(clock.step_us())
            gcs.append(gcm.summary())
            meters.append(meter.result)
            toks = out[:, prompt:].cpu()
            del out
        res["runs_s"], res["step_us"], res["gc"], res["meter"] = runs, steps, gcs, meters
        if spec.get("profile_last"):  # where the host time of a run goes: one more run, not in the timings
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            t, out = _timed(lambda: generate(model, ids, mask, n, cache), device)
            prof.disable()
            del out
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
            res["profiled_run_s"], res["profile_last_run"] = t, buf.getvalue()
        _impl_stats(res, batch, n)
        res["tokens"] = toks.tolist()
    except Exception as e:  # noqa: BLE001 — reported to the parent
        res["error"] = _err(e)
    res["attntune_calls"] = _att_delta({}, _att_counts())
    res["process_s"] = time.perf_counter() - t_start
    print(CHILD_MARK + json.dumps(res), flush=True)


def parse_cpus(spec: str, available=None) -> Optional[list]:
    """``--cpus``: ``none`` (no pinning), ``auto`` (the first ``AUTO_PIN_CPUS`` of this process's allowed
    CPUs, only where at least twice as many are allowed: a small CI machine stays unpinned), or a list
    such as ``0-3,8``. Pinning keeps every process of the run, the fresh protocol's children included (they
    inherit the mask), on the same cores: one fresh process per implementation made identical HF code run
    up to 1.58x slower in one process than in another (``generate_h200_fresh_profile.json``)."""
    avail = sorted(available if available is not None else os.sched_getaffinity(0))
    if spec == "none":
        return None
    if spec == "auto":
        return avail[:AUTO_PIN_CPUS] if len(avail) >= 2 * AUTO_PIN_CPUS else None
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise SystemExit(f"--cpus: {spec!r} is not none, auto or a list like 0-3,8")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    missing = cpus - set(avail)
    if missing:
        raise SystemExit(f"--cpus: CPUs {sorted(missing)} are not available to this process (allowed: {avail})")
    return sorted(cpus)


def cpu_state() -> dict:
    """The CPUs this process may run on and their current clocks (MHz, /proc/cpuinfo; absent elsewhere):
    a process whose host work is slow may simply sit on slower cores."""
    cpus = sorted(os.sched_getaffinity(0))
    mhz = {}
    try:
        cur = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("processor"):
                cur = int(line.split(":")[1])
            elif line.startswith("cpu MHz") and cur in cpus:
                mhz[cur] = float(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return {"cpus": cpus, "mhz": mhz}


def run_fresh(args, cfgs, device, dtype, doc, save, t0):
    for i, kind in enumerate(args.fresh_models):
        order = args.impls if i % 2 == 0 else args.impls[::-1]
        per, tokens = {}, {}
        t_case = time.perf_counter()
        for impl in order:
            spec = {"model": kind, "impl": impl, "cache": args.fresh_cache, "batch": args.fresh_batch,
                    "prompt": args.fresh_prompt, "new_tokens": args.new_tokens, "repeats": args.repeats,
                    "warmup_tokens": args.warmup_tokens, "prefill_tokens": args.fresh_prefill,
                    "device": device.type, "dtype": str(dtype).replace("torch.", ""), "smoke": args.smoke,
                    "max_pos": cfgs["max_pos"], "profile_last": args.fresh_profile}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(spec)]
            t1 = time.perf_counter()
            try:
                p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.fresh_timeout)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith(CHILD_MARK)]
                if lines:
                    r = json.loads(lines[-1][len(CHILD_MARK):])
                else:
                    r = {"impl": impl, "error": f"child exited {p.returncode} without a result:\n"
                                                 f"{(p.stdout + p.stderr)[-3000:]}"}
            except subprocess.TimeoutExpired:
                r = {"impl": impl, "error": f"child timed out after {args.fresh_timeout}s"}
            except Exception as e:  # noqa: BLE001
                r = {"impl": impl, "error": _err(e)}
            r["wall_s"] = time.perf_counter() - t1
            toks = r.pop("tokens", None)
            if toks is not None:
                tokens[impl] = torch.tensor(toks)
            per[impl] = r
            if "error" in r:
                _log(f"  fresh {kind} {impl}: {r['error'].splitlines()[0]}")
        frac, first = _token_match(tokens.get("attntune"), tokens.get("sdpa"))
        rec = {"model": kind, "cache": args.fresh_cache, "batch": args.fresh_batch, "prompt": args.fresh_prompt,
               "new_tokens": args.new_tokens, "prefill_tokens": args.fresh_prefill, "order": order,
               "impls": per, "ratio": _ratio(per, "tok_s"), **_spread_fields(per), "tokens_equal_frac": frac,
               "first_divergence": first, "elapsed_s": time.perf_counter() - t_case}
        doc["fresh"].append(rec)
        save()
        _log(_case_line({**rec, "cache": f"fresh-{rec['cache']}"[:7]}, time.perf_counter() - t0))


# ---- serving loop -------------------------------------------------------------------------------------------
def _serving_dims(args):
    return (2, 4, 2, 16) if args.smoke else (2, 32, 8, 64)


def run_serving(args, device, dtype):
    import attntune

    B, Hq, Hkv, D = _serving_dims(args)
    P0, steps, layers = args.serving_p0, args.serving_steps, args.serving_layers
    smax = P0 + steps
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    qs = [rnd(B, Hq, 1, D) for _ in range(layers)]
    ks = [rnd(B, Hkv, smax, D) for _ in range(layers)]
    vs = [rnd(B, Hkv, smax, D) for _ in range(layers)]
    warm_lengths = [L for L in range(P0 - steps + 1, P0 + 1) if L >= 1]  # disjoint from the timed ones
    timed_lengths = list(range(P0 + 1, smax + 1))
    res = {"batch": B, "heads_q": Hq, "heads_kv": Hkv, "head_dim": D, "dtype": str(dtype), "layers": layers,
           "p0": P0, "steps": steps, "timed_lengths": [timed_lengths[0], timed_lengths[-1]],
           "warmup_lengths": [warm_lengths[0], warm_lengths[-1]] if warm_lengths else None, "eager": {}}

    def att_step(causal):
        def step(L):
            return [attntune.attention(q, k[:, :, :L], v[:, :, :L], causal=causal) for q, k, v in zip(qs, ks, vs)]
        return step

    def sdpa_step(L):
        return [F.scaled_dot_product_attention(q, k[:, :, :L], v[:, :, :L], enable_gqa=True)
                for q, k, v in zip(qs, ks, vs)]

    eager = {"sdpa": sdpa_step, "attntune_causal": att_step(True), "attntune_noncausal": att_step(False)}
    for name, step in eager.items():
        try:
            for L in warm_lengths:
                step(L)
            _sync(device)
            t0 = time.perf_counter()
            for L in timed_lengths:
                step(L)
            _sync(device)
            res["eager"][name] = {"us_per_step": (time.perf_counter() - t0) / steps * 1e6}
        except Exception as e:  # noqa: BLE001
            res["eager"][name] = {"error": _err(e)}
            _log(f"  serving eager {name}: {type(e).__name__}: {e}")
    try:  # correctness of what was timed, at the last length
        ref = sdpa_step(smax)[0].float()
        res["eager"]["max_abs_diff"] = {n: float((eager[n](smax)[0].float() - ref).abs().max())
                                        for n in ("attntune_causal", "attntune_noncausal")}
    except Exception as e:  # noqa: BLE001
        res["eager"]["max_abs_diff"] = {"error": _err(e)}
    e = res["eager"]
    for name in ("attntune_causal", "attntune_noncausal"):
        s, a = e.get("sdpa", {}).get("us_per_step"), e.get(name, {}).get("us_per_step")
        e[f"{name}_vs_sdpa"] = s / a if s and a else None
    if device.type == "cuda" and args.graphs:
        res["graph"] = run_serving_graphs(qs, ks, vs, B, smax, P0, timed_lengths, device)
    return res


def run_serving_graphs(qs, ks, vs, B, smax, P0, timed_lengths, device):
    """One decode step (all layers) captured once per impl; kv_lens / the SDPA mask are updated in place
    (one small kernel each) before every replay, outside the graph. Times: update + replay per step, and
    replay alone."""
    import attntune

    lens = torch.full((B,), P0, dtype=torch.int32, device=device)
    ar = torch.arange(smax, device=device).view(1, 1, 1, smax).expand(B, 1, 1, smax).contiguous()
    mask = torch.empty(B, 1, 1, smax, dtype=torch.bool, device=device)

    def upd_lens(L):
        lens.fill_(L)

    def upd_mask(L):
        torch.lt(ar, L, out=mask)

    def att_step():
        return [attntune.attention(q, k, v, kv_lens=lens) for q, k, v in zip(qs, ks, vs)]

    def sdpa_step():
        return [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                for q, k, v in zip(qs, ks, vs)]

    res, outs = {}, {}
    steps = len(timed_lengths)
    for name, step, upd in (("sdpa", sdpa_step, upd_mask), ("attntune", att_step, upd_lens)):
        try:
            upd(P0)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up on a side stream before capture (PyTorch's CUDA-graph docs)
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = step()
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for L in timed_lengths:
                upd(L)
                g.replay()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / steps * 1e6
            t0 = time.perf_counter()
            for _ in timed_lengths:
                g.replay()
            torch.cuda.synchronize()
            res[name] = {"us_per_step": us, "replay_only_us_per_step": (time.perf_counter() - t0) / steps * 1e6}
            upd(timed_lengths[-1])
            g.replay()
            outs[name] = out[0].float().clone()
            del g, out
        except Exception as e:  # noqa: BLE001
            res[name] = {"error": _err(e)}
            _log(f"  serving graph {name}: {type(e).__name__}: {e}")
    if "sdpa" in outs and "attntune" in outs:
        res["max_abs_diff"] = float((outs["sdpa"] - outs["attntune"]).abs().max())
    s, a = res.get("sdpa", {}).get("us_per_step"), res.get("attntune", {}).get("us_per_step")
    res["attntune_vs_sdpa"] = s / a if s and a else None
    return res


# ---- new-length host cost ----------------------------------------------------------------------------------
def run_new_length(args, device, dtype):
    import attntune

    B, Hq, Hkv, D = _serving_dims(args)
    n = args.new_length_count
    base = args.serving_p0 + args.serving_steps + 64  # beyond every length the serving loop used
    smax = base + 2 * n
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(B, Hq, 1, D, generator=gen, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, smax, D, generator=gen, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, smax, D, generator=gen, device=device, dtype=dtype)

    def att(kk, vv):
        return attntune.attention(q, kk, vv, causal=True)

    def sdpa(kk, vv):
        return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)

    def timed(fn, kk, vv):
        _sync(device)
        t0 = time.perf_counter()
        fn(kk, vv)
        return (time.perf_counter() - t0) * 1e6

    def pairs(fn, lengths):
        # Per length: (1) a call at the previous, already seen length, after a sync; (2) the first call at the
        # new length, after a sync; (3) an immediate repeat of (2). The first call of a generate step comes
        # after a sync (the step's stopping check), so (2) - (1) is what a new length adds to a step: both
        # start with an idle queue. (2) - (3) mixes in the cost of that idle start (the back-to-back repeat
        # queues behind a running kernel), the figure of the first version of this benchmark.
        first, again, seen = [], [], []
        for L in lengths:
            kk, vv = k[:, :, :L], v[:, :, :L]
            seen.append(timed(fn, k[:, :, :L - 1], v[:, :, :L - 1]))
            _sync(device)
            t0 = time.perf_counter()
            fn(kk, vv)
            t1 = time.perf_counter()
            fn(kk, vv)
            t2 = time.perf_counter()
            _sync(device)
            first.append((t1 - t0) * 1e6)
            again.append((t2 - t1) * 1e6)
        extra = [a - b for a, b in zip(first, seen)]
        b2b = [a - b for a, b in zip(first, again)]
        return {"extra_us_median": _median(extra), "extra_us_p90": _pct(extra, 90),
                "extra_back_to_back_us_median": _median(b2b), "extra_back_to_back_us_p90": _pct(b2b, 90),
                "first_us_median": _median(first), "seen_after_sync_us_median": _median(seen),
                "repeat_us_median": _median(again), "lengths": [lengths[0], lengths[-1]]}

    res = {"batch": B, "heads_q": Hq, "heads_kv": Hkv, "head_dim": D, "count": n}
    # each impl gets its own never-seen range (attntune may call SDPA underneath with its lengths)
    for name, fn, lo in (("attntune", att, base), ("sdpa", sdpa, base + n)):
        try:
            pairs(fn, list(range(lo - 8, lo)))  # warm-up, ending at the length before the first timed one
            res[name] = pairs(fn, list(range(lo, lo + n)))
        except Exception as e:  # noqa: BLE001
            res[name] = {"error": _err(e)}
            _log(f"  new_length {name}: {type(e).__name__}: {e}")
    return res


# ---- summary / output ------------------------------------------------------------------------------------
def _lopsided_compile(case: dict) -> bool:
    """One implementation's warm-up compiled graphs and another's none (unknown counts: not lopsided; on a
    CPU transformers compiles neither)."""
    counts = [r.get("dynamo_graphs_compiled") for r in (case.get("impls") or {}).values()]
    return None not in counts and len(counts) > 1 and min(counts) == 0 < max(counts)


def summarize(doc) -> dict:
    fp8 = [c["ratio"] for c in doc["cases"] if c.get("cache") == "fp8static" and c.get("ratio")]
    cases = [c for c in doc["cases"] if not c.get("compiled") and c.get("cache") != "fp8static"]
    rs = [c["ratio"] for c in cases if c.get("ratio")]
    swa = [c["ratio"] for c in cases if c.get("ratio") and c["model"] == "mistral" and c["cache"] == "dynamic"
           and c["prompt"] == 4096]
    static = [c["ratio"] for c in cases if c.get("ratio") and c["cache"] == "static"]
    srv = doc.get("serving") or {}
    nl = (doc.get("new_length") or {}).get("attntune") or {}
    eq = [c["tokens_equal_frac"] for c in cases if c.get("tokens_equal_frac") is not None]
    cs = doc.get("compiled_static") or {}
    # a compiled case where one implementation compiled graphs and the other none (dynamo gave up, e.g. at
    # its recompile limit) compares a compiled model with an eager one: reported, never in the ratios
    lopsided = [c for c in doc.get("compiled") or [] if _lopsided_compile(c)]
    fair = [c for c in doc.get("compiled") or [] if c.get("ratio") and not _lopsided_compile(c)]
    comp = [c["ratio"] for c in fair if c.get("cache") != "fp8static"]
    comp8 = [c["ratio"] for c in fair if c.get("cache") == "fp8static"]
    return {
        "geomean_vs_sdpa": _geomean(rs),
        "min_vs_sdpa": min(rs) if rs else None,
        "swa_prompt4096_vs_sdpa": _geomean(swa),
        "static_vs_sdpa": _geomean(static),
        "decode_geomean_vs_sdpa": _geomean([c.get("decode_ratio") for c in cases]),
        "step_geomean_vs_sdpa": _geomean([c.get("step_ratio") for c in cases]),
        "step_min_vs_sdpa": min([c["step_ratio"] for c in cases if c.get("step_ratio")], default=None),
        # fastest run over fastest run per case (see _spread_fields), and the noise to read them against
        "best_geomean_vs_sdpa": _geomean([c.get("ratio_best") for c in cases]),
        "best_min_vs_sdpa": min([c["ratio_best"] for c in cases if c.get("ratio_best")], default=None),
        "pair_ratio_min": min([x for c in cases for x in (c.get("pair_ratios") or [])], default=None),
        "same_impl_spread_median": _median([x for c in cases for x in (c.get("same_impl_spread") or {}).values()]),
        # the first timed generate of each case: SDPA meets most KV lengths for the first time there (the
        # warm-up generates only a few tokens), as a serving process meets them with every new prompt length
        "first_run_geomean_vs_sdpa": _geomean([_first_ratio(c) for c in cases]),
        "serving_loop_causal_vs_sdpa": (srv.get("eager") or {}).get("attntune_causal_vs_sdpa"),
        "serving_loop_noncausal_vs_sdpa": (srv.get("eager") or {}).get("attntune_noncausal_vs_sdpa"),
        "serving_loop_graph_vs_sdpa": (srv.get("graph") or {}).get("attntune_vs_sdpa"),
        "new_length_extra_us": nl.get("extra_us_median"),
        "new_length_extra_us_sdpa": ((doc.get("new_length") or {}).get("sdpa") or {}).get("extra_us_median"),
        "fresh_vs_sdpa": _geomean([f.get("ratio") for f in doc.get("fresh", [])]),
        "fp8static_vs_sdpa": _geomean(fp8),  # attntune's FP8 cache against SDPA's bf16 static cache
        "compiled_fp8static_vs_sdpa": _geomean(comp8),  # the same, both decode steps compiled
        "compiled_static_vs_sdpa": None if _lopsided_compile(cs) else cs.get("ratio"),
        "compiled_lopsided_cases": [f"{c['model']}:{c['batch']}:{c['prompt']}:{c['cache']}" for c in lopsided],
        "compiled_geomean_vs_sdpa": _geomean(comp),
        "compiled_min_vs_sdpa": min(comp) if comp else None,
        "tokens_equal_frac_min": min(eq) if eq else None,
        "slow_runs": slow_run_attribution(cases),
        "cases": len(doc["cases"]),
        "failed_impl_runs": sum("error" in r for c in doc["cases"] + doc.get("fresh", [])
                                for r in c["impls"].values()),
    }


SLOW_RUN = 1.25  # a run whose median step is this much above its (case, implementation)'s fastest run


def slow_run_attribution(cases) -> dict:
    """What the slow runs of the resident protocol had in common (:class:`RunMeter`). A run is slow when its
    median decode step is >= ``SLOW_RUN`` x the fastest run of the same case and implementation; each case's
    first timed run is left out (SDPA's pays cuDNN's graph builds there, a real cost, not a state). For the
    slow and the fast runs: the median host probe (µs, the mean of before and after), GPU utilisation
    (median of each run's median) and steal ticks. A host probe slower in the slow runs means a slower host."""
    groups = {"slow": [], "fast": []}
    for c in cases:
        for impl, r in c["impls"].items():
            steps, meters = r.get("step_us") or [], r.get("meter") or []
            if len(steps) < 2 or len(meters) != len(steps):
                continue
            lo = min(steps)
            for st, m in list(zip(steps, meters))[1:]:
                groups["slow" if st >= SLOW_RUN * lo else "fast"].append(m)
    out = {"threshold": SLOW_RUN}
    for name, ms in groups.items():
        probes = [sum(m["probe_us"]) / 2 for m in ms if m.get("probe_us")]
        utils = [m["gpu_util"][1] for m in ms if m.get("gpu_util")]
        steal = [m["steal"] for m in ms if m.get("steal") is not None]
        out[name] = {"runs": len(ms), "probe_us_median": _median(probes), "gpu_util_median": _median(utils),
                     "steal_ticks": sum(steal) if steal else None}
    p_slow, p_fast = out["slow"]["probe_us_median"], out["fast"]["probe_us_median"]
    out["probe_slow_over_fast"] = p_slow / p_fast if p_slow and p_fast else None
    return out


def _first_ratio(case):
    s, a = ((case["impls"].get(i) or {}).get("runs_s") or [None] for i in ("sdpa", "attntune"))
    return s[0] / a[0] if s[0] and a[0] else None


def _resolve(args, gpu: bool):
    """Fill mode-dependent defaults (GPU full / --quick / --smoke); explicit flags always win."""
    smoke = args.smoke
    quick = args.quick and not smoke
    d = {"models": "llama,mistral", "caches": "dynamic,static", "batches": "1,8,32", "prompts": "512,4096",
         "new_tokens": 128, "repeats": 3, "warmup_tokens": 8, "serving_p0": 1024, "serving_steps": 256,
         "new_length_count": 200, "fresh_batch": 2, "fresh_prompt": 512, "fresh_prefill": 4096}
    if quick:
        d.update(batches="1,8", prompts="512", new_tokens=64, repeats=2)
    if smoke:
        d.update(batches="2", prompts="12", new_tokens=4, repeats=1, warmup_tokens=2, serving_p0=16,
                 serving_steps=4, new_length_count=20, fresh_prompt=12, fresh_prefill=32)
    for k, v in d.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.models = _csv(args.models)
    args.caches = _csv(args.caches)
    args.batches = _csv(args.batches, int)
    args.prompts = _csv(args.prompts, int)
    args.impls = _csv(args.impls)
    args.fresh_models = _csv(args.fresh_models) if args.fresh_models else list(args.models)
    if args.smoke and args.compiled_cases == "llama:1:512":
        args.compiled_cases = "llama:2:12"
    args.compiled_cases = _compiled_cases(args.compiled_cases)
    for k in args.models + args.fresh_models:
        if k not in KINDS:
            raise SystemExit(f"--models: unknown kind {k!r} (choose from {', '.join(KINDS)})")
    for c in args.caches:
        if c not in CACHES:
            raise SystemExit(f"--caches: unknown cache {c!r} (choose from {', '.join(CACHES)})")
    if args.smoke:
        args.graphs = False
    return args


def _compiled_cases(text: str):
    """``model:B:P,...`` -> [(model, B, P)]; a clear error naming ``--compiled-cases`` otherwise."""
    out = []
    for item in _csv(text):
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[0] not in KINDS or not (parts[1].isdigit() and parts[2].isdigit()):
            raise SystemExit(f"--compiled-cases: expected model:B:P with model in {', '.join(KINDS)}, got {item!r}")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/generate.json")
    ap.add_argument("--quick", action="store_true", help="B 1,8, prompt 512, 64 new tokens, 2 repeats")
    ap.add_argument("--smoke", action="store_true", help="tiny float32 models on the CPU (default without CUDA)")
    ap.add_argument("--models", help="llama,mistral")
    ap.add_argument("--caches", help="dynamic,static (default); fp8static: attntune's FP8 KV cache vs SDPA static")
    ap.add_argument("--fp8-v-layout", choices=("d", "keys"), default="d",
                    help="fp8static: the FP8 cache's V storage order (FP8StaticCache(v_layout=...))")
    ap.add_argument("--fp8-append", choices=tuple(FP8_APPENDS), default="auto",
                    help="fp8static: how the FP8 cache appends (auto: the Triton kernel on a GPU; torch: torch ops)")
    ap.add_argument("--batches", help="default 1,8,32")
    ap.add_argument("--prompts", help="default 512,4096")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--repeats", type=int, help="timed generates per impl and case (default 3)")
    ap.add_argument("--fresh-profile", action="store_true",
                    help="cProfile one extra run of each fresh process after the timed ones (for diagnosis; "
                         "its time is reported apart, never in the ratios)")
    ap.add_argument("--warmup-tokens", type=int, help="new tokens of the warm-up generate (default 8)")
    ap.add_argument("--impls", default="sdpa,attntune")
    ap.add_argument("--protocol", choices=("resident", "fresh", "both"), default="both")
    ap.add_argument("--prefill-split", action=argparse.BooleanOptionalAction, default=True,
                    help="also time max_new_tokens=1 generates to report decode-only tokens/s")
    ap.add_argument("--compiled-static", action="store_true",
                    help="the --compiled-cases with a static cache and transformers' auto-compile")
    ap.add_argument("--compiled-cases", default="llama:1:512",
                    help="model:B:P list of the compiled static cases (default llama:1:512; --smoke: llama:2:12)")
    ap.add_argument("--fresh-models", help="model kinds of the fresh protocol (default: --models)")
    ap.add_argument("--fresh-batch", type=int)
    ap.add_argument("--fresh-prompt", type=int)
    ap.add_argument("--fresh-cache", default="dynamic", choices=CACHES)
    ap.add_argument("--fresh-prefill", type=int, help="tokens of the long prefill (B=2), default 4096")
    ap.add_argument("--fresh-timeout", type=int, default=600)
    ap.add_argument("--serving", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--serving-p0", type=int)
    ap.add_argument("--serving-steps", type=int)
    ap.add_argument("--serving-layers", type=int, default=8)
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="the CUDA-graph part of the serving loop")
    ap.add_argument("--new-length", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--new-length-count", type=int)
    ap.add_argument("--cpus", default="auto",
                    help="pin this process and the fresh children: none, auto (the first "
                         f"{AUTO_PIN_CPUS} allowed CPUs where at least {2 * AUTO_PIN_CPUS} are) or a list like 0-3")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _print_table(doc):
    _log("")
    for f in doc.get("fresh", []):
        _log(f"fresh   {f['model']:7s} {f['cache']:7s} B={f['batch']} P={f['prompt']}: "
             + "  ".join(f"{i} {r.get('tok_s') or float('nan'):.0f} tok/s" for i, r in f["impls"].items())
             + (f"  ratio {f['ratio']:.3f}" if f.get("ratio") else ""))
    for cs in doc.get("compiled") or []:
        _log(f"compiled static {cs['model']} B={cs['batch']} P={cs['prompt']}: "
             + "  ".join(f"{i} {'ERROR' if 'error' in r else format(r.get('tok_s') or float('nan'), '.0f')}"
                         for i, r in cs["impls"].items())
             + (f"  ratio {cs['ratio']:.3f}" if cs.get("ratio") else ""))
    srv = doc.get("serving") or {}
    if srv:
        e = srv.get("eager", {})
        _log("serving loop us/step eager: " + "  ".join(f"{k} {v['us_per_step']:.1f}" for k, v in e.items()
                                                      if isinstance(v, dict) and "us_per_step" in v))
        g = srv.get("graph") or {}
        if g:
            _log("serving loop us/step graph: " + "  ".join(f"{k} {v['us_per_step']:.1f}" for k, v in g.items()
                                                          if isinstance(v, dict) and "us_per_step" in v))
    nl = doc.get("new_length") or {}
    for k in ("attntune", "sdpa"):
        if (nl.get(k) or {}).get("extra_us_median") is not None:
            _log(f"new-length extra host us ({k}): median {nl[k]['extra_us_median']:.1f}  "
                 f"p90 {nl[k]['extra_us_p90']:.1f}")
    _log("summary: " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                   for k, v in doc["summary"].items()}))
    _log("")
    _log(f"{'model':8s} {'cache':8s} {'B':>3s} {'P':>5s} {'sdpa tok/s':>11s} {'attntune tok/s':>15s} {'ratio':>7s} "
         f"{'steps':>7s} {'best':>7s} {'noise s/a':>11s}")
    for c in doc["cases"]:
        if c.get("compiled"):
            continue
        s, a = (c["impls"].get(i, {}) for i in ("sdpa", "attntune"))

        def f(r):
            return "ERROR" if "error" in r else (f"{r['tok_s']:.0f}" if r.get("tok_s") else "-")

        _log(f"{c['model']:8s} {c['cache']:8s} {c['batch']:3d} {c['prompt']:5d} {f(s):>11s} {f(a):>15s} "
             f"{(format(c['ratio'], '.3f') if c.get('ratio') else '-'):>7s} "
             f"{(format(c['step_ratio'], '.3f') if c.get('step_ratio') else '-'):>7s} "
             f"{(format(c['ratio_best'], '.3f') if c.get('ratio_best') else '-'):>7s} "
             + "/".join(f"{(c.get('same_impl_spread') or {}).get(i, 0) * 100:.0f}%" for i in ("sdpa", "attntune")))


def main(argv=None):
    args = parse_args(argv)
    if args._child:
        child_main(json.loads(args._child))
        return
    os.environ[FP8_V_LAYOUT_ENV] = args.fp8_v_layout  # the children inherit it
    os.environ[FP8_APPEND_ENV] = args.fp8_append
    gpu = torch.cuda.is_available()
    if not gpu:
        args.smoke = True
    args = _resolve(args, gpu)
    pinned = parse_cpus(args.cpus)
    if pinned:
        os.sched_setaffinity(0, pinned)
        torch.set_num_threads(min(torch.get_num_threads(), len(pinned)))  # set at import, from all CPUs

    import transformers
    from env import environment

    import attntune
    import attntune.hf

    transformers.logging.set_verbosity_error()
    attntune.hf.register()
    if args.smoke:
        torch.set_num_threads(1)  # tiny tensors: threads only add noise (and stalls on a busy CPU)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    max_pos = max([8192, args.fresh_prefill] + [p + args.new_tokens for p in args.prompts]
                  + [p + args.new_tokens for _, _, p in args.compiled_cases])
    t0 = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "bench_generate", "environment": environment(),
           "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
           "device": str(device), "dtype": str(dtype),
           "models": {k: model_config(k, args.smoke, max_pos)[1].to_dict() for k in KINDS},
           "transformers": transformers.__version__,
           "cpu": cpu_state(), "cases": [], "fresh": [], "serving": {}, "new_length": {}, "compiled_static": None,
           "compiled": [],
           "summary": {}}

    def save():
        doc["summary"] = summarize(doc)
        doc["elapsed_s"] = time.perf_counter() - t0
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, out)

    _log(f"bench_generate on {device} ({doc['environment'].get('gpu') or 'cpu'}), {dtype}, "
         f"transformers {transformers.__version__}, protocol {args.protocol}")
    if args.serving:
        doc["serving"] = run_serving(args, device, dtype)
        save()
        _log(f"[{time.perf_counter() - t0:7.1f}s] serving loop done")
    if args.new_length:
        doc["new_length"] = run_new_length(args, device, dtype)
        save()
        _log(f"[{time.perf_counter() - t0:7.1f}s] new-length host cost done")

    resident = args.protocol in ("resident", "both")
    compiled = {k: [(b, p) for m, b, p in args.compiled_cases if m == k] for k in KINDS} if args.compiled_static \
        else {k: [] for k in KINDS}
    kinds = [k for k in KINDS if (resident and k in args.models) or compiled[k]]
    for kind in kinds:
        t1 = time.perf_counter()
        models, cfg = build_models(kind, args.impls, device, dtype, args.smoke, max_pos)
        _sync(device)
        _log(f"[{time.perf_counter() - t0:7.1f}s] built {kind} x{len(models)} in {time.perf_counter() - t1:.1f}s")
        if resident and kind in args.models:
            for cache in args.caches:
                for b in args.batches:
                    for p in args.prompts:
                        rec = run_case(models, kind, cache, b, p, args, device, cfg.vocab_size)
                        doc["cases"].append(rec)
                        save()
                        _log(_case_line(rec, time.perf_counter() - t0))
        # with fp8static among --caches, each compiled case also runs attntune's FP8 cache (vs SDPA static)
        comp_caches = ["static"] + (["fp8static"] if "fp8static" in args.caches else [])
        for (b, p), ccache in ((bp, c) for bp in compiled[kind] for c in comp_caches):
            try:
                rec = run_case(models, kind, ccache, b, p, args, device, cfg.vocab_size, compile_ok=True)
                rec["worked"] = {i: "error" not in r for i, r in rec["impls"].items()}
            except Exception as e:  # noqa: BLE001 — never crash the run
                rec = {"model": kind, "cache": ccache, "batch": b, "prompt": p, "compiled": True,
                       "impls": {}, "error": _err(e), "worked": False}
            doc["compiled"].append(rec)
            doc["compiled_static"] = next(c for c in doc["compiled"] if c["cache"] == "static")
            save()
            _log(_case_line({**rec, "cache": "st-comp" if ccache == "static" else "f8-comp", "elapsed_s": rec.get("elapsed_s", 0.0)},
                            time.perf_counter() - t0))
        del models
        _free(device)
    if args.protocol in ("fresh", "both"):
        run_fresh(args, {"max_pos": max_pos}, device, dtype, doc, save, t0)
    doc["attntune_final"] = _att_counts()
    save()
    _print_table(doc)
    _log(f"\nwrote {out} in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
