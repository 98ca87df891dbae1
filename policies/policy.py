"""Policies: how a problem becomes a :class:`~attntune.policies.plan.Plan`.

* ``tuned`` (default): the exact key's cached winner → its *hint* (the key's row tuned on this device
  under other torch/triton/CUDA versions with the same variant source: still a correct implementation
  and very likely a good one; counted as a miss) → the nearest tuned bucket of the same family
  (``TuneKey.family()``, within :data:`~attntune.policies.index.MAX_NEAREST_DISTANCE`) → a *sibling*
  device's row (same backend and architecture, another name or unit count: the exact key first, then its
  nearest bucket, ``TuneKey.sibling_distance``; counted as a miss) → heuristic. A sibling's configs were
  measured on another card of the same architecture: the same tiles, warps and stages fit (shared memory
  and registers are per architecture), split counts may be a little off (they depend on the unit count,
  which the distance weighs) — better than the rule table, which knows nothing of the shape.
* ``heuristic``: the rule table :data:`HEURISTIC_RULES` below, for devices nobody tuned.
* ``fixed:NAME``: one variant for everything it supports; the safe fallback for the rest.
* ``online``: like ``tuned``, but an untuned key is tuned in place (``attntune.autotune.tune_one``,
  small budget) before falling back to nearest/heuristic.

Every candidate — a cached winner, a neighbour's winner, a rule's variant — must pass
``registry.reasons`` for the *actual* problem (environment switches, exactness/approximation, the
variant's own ``supports``), its config must be valid in the variant's space for that problem, and it
must not be quarantined (it failed earlier in this process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from attntune.cache import WinnerRecord
from attntune.cache.layered import warn_once
from attntune.kernels import registry
from attntune.kernels.masks import needs_mask
from attntune.key import TuneKey, config_key
from attntune.policies.config import LOG, RuntimeConfig
from attntune.policies.index import MAX_NEAREST_DISTANCE, CacheIndex
from attntune.policies.plan import Plan
from attntune.problem import DECODE_MAX_SQ, AttentionProblem

# ---- the heuristic rule table ----------------------------------------------------------------------
#: Head dims the SDPA flash/cuDNN kernels take natively (multiples of 8 up to 256); others drop to
#: slower SDPA backends, where the Triton kernel is the better first guess.
SDPA_HEAD_DIM_MAX = 256


def _sdpa_native(p: AttentionProblem) -> bool:
    """SDPA runs the problem without a materialised mask, in a dtype and head dim its fused kernels
    take (fp32 goes to the memory-efficient kernel, which is exact)."""
    return (not needs_mask(p) and p.head_dim % 8 == 0 and p.head_dim_v % 8 == 0
            and max(p.head_dim, p.head_dim_v) <= SDPA_HEAD_DIM_MAX)


def _gluon_wide(p: AttentionProblem) -> bool:
    """An inference prefill call whose head dim is where the Gluon forward was measured ahead of our Triton one
    (64 < D <= 128; its ``supports()`` decides the rest: sm_90, 16-bit, D a multiple of 8, no kv_lens)."""
    return p.mode == "fwd" and 64 < p.head_dim <= 128


@dataclass(frozen=True)
class Rule:
    """If ``when(problem)`` holds on one of ``devices``, try the variants of ``prefer`` in order."""

    name: str
    devices: Tuple[str, ...]
    when: Callable[[AttentionProblem], bool]
    prefer: Tuple[str, ...]
    why: str


#: The one place that ranks variants by name for untuned devices. Rules are tried top to bottom; in a
#: matching rule, the first variant that exists, passes ``registry.reasons`` and is not quarantined
#: wins. The last rule matches everything, so a plan always exists (``eager`` runs every exact problem).
#: These are first guesses, not measurements: ``attntune tune`` replaces them with winners.
HEURISTIC_RULES: Tuple[Rule, ...] = (
    Rule("decode", ("cuda",), lambda p: p.seqlen_q <= DECODE_MAX_SQ,
         ("triton_decode", "sdpa_default"),
         f"decode (Sq <= {DECODE_MAX_SQ}): split-K decoding reads K/V once per GQA group, skips kv_lens "
         "padding and keys outside a window, and launches through its cached compiled kernel (host cost of a bare "
         "launch); SDPA needs a materialised mask for kv_lens/windows and its default cuDNN backend builds "
         "a graph per new KV length (35-54 ms each on the H200)"),
    Rule("local-training", ("cuda",), lambda p: p.is_local and p.mode == "fwd_bwd",
         ("triton_local", "triton_flash", "flex"),
         "finite left window, forward+backward: ours untuned is ahead of FlexAttention or tied on every shape "
         "measured through attntune.attention (benchmarks/bench_window_train.py). H200: W 1024 S 16384 D128 "
         "1.21x, W 4096 S 8192 D128 GQA 1.00x, W 128 S 4096 D64 GQA 1.47x, W 256 S 1024 D64 1.06x, W 1024 "
         "S 4096 D64 GQA B4 1.12x, B1 0.94x back to back / 1.11x as a single call; an HF Mistral-style eager "
         "training step 36.9 ms against 38.2 with Flex (window_train_h200_2026-12-06_*.json, "
         "hf_train_h200_2026-12-06_*.json); H100: 1.10-1.41x on the D128 and short-window shapes "
         "(window_train_h100_2026-12-06*.json). Not everywhere: at W 512 S 2048 D128 the H200's tuner chose "
         "Flex on 2026-12-03 (regret_h200.json), the H100's chose ours on 2026-12-06: ours first untuned, "
         "tuning decides"),
    Rule("local-hopper", ("cuda",), lambda p: p.is_local and _gluon_wide(p),
         ("gluon_flash", "triton_local", "triton_flash"),
         "finite left window, inference, 64 < D <= 128, Hopper (gluon_flash runs on sm_90 only; elsewhere the next "
         "ones): the Gluon forward (softmax overlapped with the tensor cores) at its default config beat our Triton "
         "forward on every D128 window key the H100 tuned, 1.07-1.21x (W 1024 B2 S4096, W 4096 S8192, W 1024 S16384; "
         "benchmarks/results/tune_gluon_fwd_h100_2026-12-08_trials.json); at D64 it lost (0.81-0.92x), so not there"),
    Rule("local", ("cuda",), lambda p: p.is_local,
         ("triton_local", "triton_flash"),
         "finite left window: a block-skipping kernel costs O(S*W), SDPA's masked kernels O(S^2)"),
    Rule("fp8-prefill", ("cuda",), lambda p: p.kv_dtype is not None,
         ("triton_flash", "fp8_dequant"),
         "FP8 K/V, prefill: both dots on FP8 tensor cores read the codes as they are (H200, B1 S4096 D128 "
         "causal e4m3: 279 us against 333 us widened to bf16 for cuDNN; benchmarks/results/fp8_h200.json)"),
    Rule("fp32-tf32", ("cuda",), lambda p: p.tf32,
         ("triton_flash",),
         "float32 with TF32 allowed (matmul precision not 'highest'): SDPA has no TF32 fused path; ours is "
         "4.7x SDPA default on the H200 (B4 H16 S4096 D128, benchmarks/results/probe_tf32_h200.json)"),
    Rule("sdpa-native", ("cuda",), _sdpa_native,
         ("sdpa_default",),
         "SDPA takes this mask (none / top-left causal) and head dim natively"),
    Rule("sdpa-cannot-hopper", ("cuda",), _gluon_wide,
         ("gluon_flash", "triton_flash"),
         "SDPA would need a materialised mask (bottom-right causal with Sq != Skv, a window); inference, "
         "64 < D <= 128, Hopper: the Gluon forward 1.21x our Triton forward on the H100's chunked-prefill key "
         "(B1 Sq 512 Skv 4096 causal, 60.5 vs 73.4 us; tune_gluon_fwd_h100_2026-12-08_trials.json)"),
    Rule("sdpa-cannot", ("cuda",), lambda p: True,
         ("triton_flash",),
         "SDPA would need a materialised mask (bottom-right causal with Sq != Skv, window, kv_lens) "
         "or a slow backend (odd head dim)"),
    Rule("safe", ("cuda", "cpu"), lambda p: True,
         ("sdpa_default", "eager", "fp8_dequant"),
         "torch SDPA (a materialised mask where needed), else eager; FP8 K/V: fp8_dequant (codes widened)"),
)

#: The safe fallback (``ATTNTUNE_DISABLE``, ``ATTNTUNE_MAX_SEQLEN``, after a failure): torch SDPA if it
#: supports the problem, else eager. Environment allow-lists do not apply: this is the last resort.
FALLBACK_CHAIN = ("sdpa_default", "eager", "fp8_dequant")

Quarantine = Set[Tuple[str, str]]


def _config_reasons(variant, problem: AttentionProblem, config) -> List[str]:
    try:
        return variant.space(problem).validate(config)
    except Exception as e:  # noqa: BLE001
        return [f"space() raised {type(e).__name__}: {e}"]


def usable(name: str, config: Optional[dict], problem: AttentionProblem, quarantine: Quarantine) -> List[str]:
    """Why ``name`` (with ``config``; None = its default config) cannot serve ``problem`` now."""
    if not registry.exists(name):
        return [f"variant {name!r} is not registered"]
    v = registry.get(name)
    out = registry.reasons(v, problem)
    if out:
        return out
    if config is not None:
        out = _config_reasons(v, problem, config)
        if out:
            return [f"config invalid here: {'; '.join(out)}"]
    else:
        try:
            config = v.space(problem).first()
        except Exception as e:  # noqa: BLE001
            return [f"no valid default config ({e})"]
    if (name, config_key(config)) in quarantine:
        return ["quarantined (failed earlier in this process)"]
    return []


def _supports(v, problem) -> List[str]:
    return registry.reasons(v, problem, env=False)


def _make(name: str, config: Optional[dict], source: str, problem: AttentionProblem, key: Optional[TuneKey],
          reasons: Sequence[str], rec: Optional[WinnerRecord] = None, runner_up: Optional[str] = None,
          runner_up_ms: Optional[float] = None) -> Plan:
    v = registry.get(name)
    cfg = dict(config) if config is not None else v.space(problem).first()
    if rec is not None:
        runner_up, runner_up_ms = rec.runner_up, rec.runner_up_ms
        reasons = list(reasons) + [_timing_note(rec.key)]
        if rec.measured_busy:
            reasons.append(busy_note(rec.busy))
        if rec.rel_error is not None and (rec.key.kv_dtype is not None or rec.key.approx):
            what = f"{rec.key.kv_dtype} K/V" if rec.key.kv_dtype is not None else "approximation"
            reasons.append(f"{what}: relative error {rec.rel_error:.2e} against the exact float result, "
                           "measured by the gate on the tuning inputs")
    return Plan(variant=name, config=cfg, source=source, problem=problem, key=key,
                expected_ms=rec.median_ms if rec is not None else None,
                expected_spread=rec.spread if rec is not None else None, runner_up=runner_up,
                runner_up_ms=runner_up_ms, reasons=tuple(reasons), impl=v)


def busy_note(busy: float) -> str:
    """What a row measured on a busy CPU means (``WinnerRecord.busy``)."""
    return (f"measured on a busy CPU: other processes kept the tuner's threads waiting for a CPU "
            f"{busy * 100:.0f}% of a measurement, so the times are inflated and only a clear win over SDPA's "
            "choice could be stored; `attntune tune` re-times this key (run it when the machine is quiet)")


def _timing_note(key: TuneKey) -> str:
    """How the row's time was measured (the tuner's rule, autotune.timing.graph_timed; a TF32 key under
    TF32 dots, gate.key_numerics)."""
    note = _timing_mode(key)
    if getattr(key, "tf32", False):
        note += "; float32 with TF32 dots (float32_matmul_precision 'high'), the numerics this call runs under"
    return note


def _timing_mode(key: TuneKey) -> str:
    if key.device.device_type == "cuda" and key.mode == "fwd" and key.seqlen_q <= DECODE_MAX_SQ:
        return ("row timed as device time under CUDA graphs (decode keys: serving captures decode), where "
                "split-K runs two kernels; eager calls are host-bound and launch by size: one split where a "
                "program reads little K/V, else the last split combines in the same launch, two kernels "
                "for the largest (triton_decode: EAGER_ONE_SPLIT_BYTES, EAGER_FUSE_MAX_BYTES)")
    return "row timed eagerly (device time: do_bench's method with the host's launch gaps held out)"


# ---- the individual decisions -----------------------------------------------------------------------
def fallback_plan(problem: AttentionProblem, key: Optional[TuneKey], why: Sequence[str],
                  quarantine: Quarantine = frozenset()) -> Plan:
    """torch SDPA if it supports ``problem`` (and has not failed in this process), else eager (which
    runs every exact problem); for FP8 K/V, ``fp8_dequant`` (the codes widened, then the same)."""
    notes = list(why)
    for name in FALLBACK_CHAIN:
        if not registry.exists(name):
            continue
        r = _supports(registry.get(name), problem)
        if not r and (name, config_key(registry.get(name).space(problem).first())) in quarantine:
            r = ["quarantined (failed earlier in this process)"]
        if not r:
            return _make(name, None, "fallback", problem, key, notes + [f"safe fallback: {name}"])
        notes.append(f"{name}: {'; '.join(r)}")
    # the last of the chain that reads this problem's K/V: eager runs every exact problem in q's dtype,
    # fp8_dequant every FP8 one (the registry's kv_dtypes say which)
    readers = [n for n in FALLBACK_CHAIN if registry.exists(n) and not registry.kv_reasons(registry.get(n), problem)]
    name = (readers or ["eager"])[-1]
    return _make(name, None, "fallback", problem, key, notes + [f"last resort: {name}"])


def heuristic_plan(problem: AttentionProblem, key: Optional[TuneKey], quarantine: Quarantine,
                   notes: Sequence[str] = ()) -> Plan:
    """Walk :data:`HEURISTIC_RULES`; the first usable variant wins, the next usable one is the
    runner-up."""
    notes = list(notes)
    chosen: Optional[Tuple[str, str]] = None
    runner_up: Optional[str] = None
    for rule in HEURISTIC_RULES:
        if problem.device_type not in rule.devices or not rule.when(problem):
            continue
        for name in rule.prefer:
            if chosen is not None and name == chosen[0]:
                continue
            r = usable(name, None, problem, quarantine)
            if r:
                if chosen is None and registry.exists(name):
                    notes.append(f"rule {rule.name}: {name} cannot run: {'; '.join(r)}")
                continue
            if chosen is None:
                chosen = (name, f"rule {rule.name}: {rule.why} -> {name}")
            elif runner_up is None:
                runner_up = name
                break
        if runner_up is not None:
            break
    if chosen is None:
        return fallback_plan(problem, key, notes + ["no heuristic rule found a usable variant"], quarantine)
    return _make(chosen[0], None, "heuristic", problem, key, notes + [chosen[1]], runner_up=runner_up)


def fixed_plan(problem: AttentionProblem, key: Optional[TuneKey], name: str, quarantine: Quarantine,
               warn: Callable[[str, str], None] = warn_once) -> Plan:
    if not registry.exists(name):
        warn(f"fixed:{name}", f"ATTNTUNE_POLICY=fixed:{name}: no such variant "
                                   f"(known: {', '.join(sorted(v.name for v in registry.all_variants()))}); "
                                   "using the heuristic policy")
        return heuristic_plan(problem, key, quarantine, [f"fixed variant {name!r} does not exist"])
    r = usable(name, None, problem, quarantine)
    if r:
        # once per process: a fixed policy the variant cannot follow is otherwise silent (explain() says it)
        warn(f"fixed-cannot:{name}", f"ATTNTUNE_POLICY=fixed:{name} cannot run {problem.short()} ({'; '.join(r)}); "
                                     "calls it cannot run use the safe fallback (shown once; attntune.explain() "
                                     "gives each call's reason)")
        return fallback_plan(problem, key, [f"fixed variant {name} cannot run this problem: {'; '.join(r)}"],
                             quarantine)
    return _make(name, None, "fixed", problem, key, [f"ATTNTUNE_POLICY=fixed:{name}"])


def _from_record(rec: WinnerRecord, source: str, problem: AttentionProblem, key: TuneKey,
                 quarantine: Quarantine, notes: List[str], what: str) -> Optional[Plan]:
    r = usable(rec.variant, rec.config, problem, quarantine)
    if r:
        notes.append(f"{what} winner {rec.variant} unusable here: {'; '.join(r)}")
        return None
    return _make(rec.variant, rec.config, source, problem, key, notes + [f"{what}: {rec.variant}"], rec=rec)


def _online(problem: AttentionProblem, key: TuneKey, index: CacheIndex, cfg: RuntimeConfig,
            notes: List[str], warn: Callable[[str, str], None],
            tuner: Optional[Callable[..., Optional[WinnerRecord]]]) -> Optional[WinnerRecord]:
    """Tune ``key`` now with ``tuner`` — ``tune_one(problem, store, trials=, time_limit=)``, handed down by
    the layer above (:data:`attntune.policies.runtime.ONLINE_TUNER`, set by :mod:`attntune.api`): the
    policies never import the tuner (and optuna) themselves. None when it cannot."""
    if tuner is None:
        warn("online:import", "ATTNTUNE_POLICY=online has no tuner (attntune.api was not imported); "
                              "untuned keys use the nearest bucket or heuristics")
        notes.append("online tuning unavailable (no tuner)")
        return None
    if index.online_off:
        notes.append(f"online tuning off for this process: {index.online_off}")
        return None
    store = index.user
    if store is None:
        notes.append("online tuning skipped: no writable user cache")
        return None
    locked = store.locked_now()
    if locked:  # another process is writing: this key stays a miss (tuned by a later call or `tune`)
        notes.append(f"online tuning skipped: the user cache is locked now ({locked})")
        return None
    LOG.info("online: tuning %s (%d trials, %.0f s)", key.short(), cfg.online_trials, cfg.online_seconds)
    try:
        rec = tuner(problem, store, trials=cfg.online_trials, time_limit=cfg.online_seconds)
    except Exception as e:  # noqa: BLE001 — tuning is best effort; the call must still be served
        # off for the rest of the process after one failure: each new key would pay the tuner's lock
        # retries (~8 s) again, and warn with the whole failing SQL statement
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        index.online_off = f"it failed on {key.short()} ({why})"
        warn("online:failed", f"online tuning failed on {key.short()} ({why}); it is off for this process "
                              "(untuned keys use the nearest bucket or heuristics; `attntune tune` tunes them)")
        notes.append(f"online tuning failed: {why}")
        return None
    if rec is None:
        notes.append("online tuning found no valid winner")
        return None
    index.add(rec)
    return rec


def resolve(problem: AttentionProblem, key: TuneKey, cfg: RuntimeConfig, index_fn: Callable[[], CacheIndex],
            quarantine: Quarantine, dry: bool = False,
            warn: Callable[[str, str], None] = warn_once,
            tuner: Optional[Callable[..., Optional[WinnerRecord]]] = None) -> Tuple[Plan, bool]:
    """Decide the plan for ``problem`` (whose key is ``key``). Returns ``(plan, missed)``: ``missed``
    is True when a cache-consulting policy found no exact tuned row (the key is worth tuning).
    ``dry`` (explain): never tune online."""
    big = max(problem.seqlen_q, problem.seqlen_kv)
    if cfg.disabled:
        return fallback_plan(problem, key, ["ATTNTUNE_DISABLE=1"]), False
    if cfg.too_long(problem):
        return fallback_plan(problem, key, [f"max(Sq, Skv) = {big} > ATTNTUNE_MAX_SEQLEN={cfg.max_seqlen}"]), False
    if cfg.policy == "heuristic":
        return heuristic_plan(problem, key, quarantine, ["policy heuristic"]), False
    if cfg.policy == "fixed":
        return fixed_plan(problem, key, cfg.fixed_variant or "", quarantine, warn), False

    index = index_fn()
    notes: List[str] = []
    if index.error:
        notes.append(f"cache unusable ({index.error})")
    rec = index.exact(key)
    if rec is not None:
        p = _from_record(rec, "tuned", problem, key, quarantine, notes, f"exact key {key.key_id}")
        if p is not None:
            return p, False
    else:
        notes.append(f"no tuned row for key {key.short()}")
    hint = index.hint(key) if rec is None else None
    if hint is not None:
        p = _from_record(hint.record, "hint", problem, key, quarantine, notes,
                         f"hint: tuned here under other versions ({'; '.join(hint.reasons)}); "
                         "`attntune tune --revalidate` re-times it")
        if p is not None:
            return p, True
    if cfg.policy == "online" and not dry:
        rec = _online(problem, key, index, cfg, notes, warn, tuner)
        if rec is not None:
            p = _from_record(rec, "online", problem, key, quarantine, notes, "tuned online")
            if p is not None:
                return p, False
    for dist, rec in index.nearest(key):
        p = _from_record(rec, "nearest", problem, key, quarantine, notes,
                         f"nearest bucket {rec.key.short()} (distance {dist:.2f})")
        if p is not None:
            return p, True
    if index.by_family.get(key.family()):
        notes.append(f"no usable tuned bucket of this family within distance {MAX_NEAREST_DISTANCE:.1f}")
    for dist, rec in index.siblings(key):
        p = _from_record(rec, "sibling", problem, key, quarantine, notes,
                         f"sibling device {rec.key.device.label()}, key {rec.key.short()} (distance {dist:.2f})")
        if p is not None:
            return p, True
    return heuristic_plan(problem, key, quarantine, notes), True


def candidates_table(problem: AttentionProblem) -> List[Dict[str, object]]:
    """Every registered variant with the reasons it cannot run ``problem`` (empty = it can)."""
    return [{"variant": v.name, "family": v.family, "exact": v.exact, "reasons": r}
            for v, r in registry.explain_candidates(problem)]
