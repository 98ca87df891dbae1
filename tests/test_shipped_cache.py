"""The shipped ``cache.db`` against the kernels as they are: rows tuned on the current kernel sources stay
valid through edits that do not change what a row measured (declared in ``kernels/equivalences.py``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from attntune.kernels import registry
from attntune.key import TuneKey


def _changed_source(family: str):
    """``(rows, changed)``: the shipped winners ``(key_id, variant)`` of variants named ``family*`` and those whose
    stored variant hash this code no longer accepts (``Variant.accepts_source``)."""
    shipped = Path(__file__).resolve().parent.parent / "cache.db"
    con = sqlite3.connect(f"file:{shipped}?mode=ro", uri=True)
    rows = con.execute("SELECT key_id, variant, fingerprint_json, key_json FROM winners WHERE variant LIKE ?",
                       (f"{family}%",)).fetchall()
    con.close()
    changed = {(k, v) for k, v, fp, key in rows
               if not registry.get(v).accepts_source(json.loads(fp)["variant_hash"], TuneKey.model_validate_json(key))}
    return [(k, v) for k, v, _, _ in rows], changed


def test_the_shipped_sdpa_rows_keep_their_source():
    """Editing the SDPA variants' hashed modules stales every shipped SDPA row (the dense keys of both GPUs):
    such an edit either re-tunes and re-ships cache.db or, when the run path did not change, lists the old
    hashes in kernels/equivalences.py. This fails on an edit that did neither."""
    rows, changed = _changed_source("sdpa_")
    assert rows
    changed = {v for _, v in changed}
    assert not changed, f"shipped rows of {sorted(changed)} would be stale: variant source changed"

#: The shipped rows of Triton variants written under an earlier kernel source that no re-tune has replaced
#: yet (H200 rows: an H200 re-tune re-ships them, and this set shrinks — the test then still passes).
STALE_BY_SOURCE_AWAITING_RETUNE = frozenset({
    # the H200's two FP8-KV prefill keys (B1 H32/8 D128 causal e4m3fn, S4096 and S512x4096): the 2026-12-06
    # re-tune of the other twelve ran out of its time limit before these
    "1e80e5f4009a7c4468e5", "daf1d8c69ca133dd798b",  # triton_flash
    # triton_decode after its loop changed (2026-12-07, whole tiles unmasked and the tail masked): the H200 re-tuned
    # its twelve bf16 decode keys under the new source the same day (tune_default_h200_2026-12-07_vkeys.log); these
    # await a re-tune — the H200's window decode key and its six FP8-KV keys (the time limit came first). The H100's
    # nineteen decode rows were re-tuned on 2026-12-07 (tune_default_h100_2026-12-07f_loop.log, tune_fp8_...).
    "ae343d20923a800ae72c", "173539985f1b9e2064aa", "8f1c5441dc401b748c0a", "878c2e99b1c8f3cf77fd",
    "5eaf4d0d37e0b8c07c58", "b27b16206504a5f62043", "3284a864ced576ceb793",
    # triton_flash after V_T (2026-12-07: descriptor loads over the FP8/TF32 V copy, the copy padded to 16-byte rows;
    # kernels/equivalences.py keeps the other keys' rows): the H200's three TF32 keys (dense and causal forward,
    # causal training). The H100's three TF32 and two FP8-KV prefill keys were re-tuned the same day
    # (gpu_call19.sh; tune_fp8_h100_2026-12-07g_vt.log).
    "e23add7bd2b8f0a0112c", "b2b4b42a792232b4f558", "957d8285933018cf0845",
})


def test_the_shipped_triton_rows_keep_their_source():
    """As for the SDPA variants: an edit of their hashed modules (a default config, a comment) stales
    every shipped row tuned on the current source unless it re-tunes or lists the old hash in
    ``kernels/equivalences.py``. Only the rows already known to await a re-tune may read as a changed source."""
    rows, changed = _changed_source("triton_")
    assert len(rows) > len(STALE_BY_SOURCE_AWAITING_RETUNE)
    changed = {k for k, _ in changed}
    assert changed <= STALE_BY_SOURCE_AWAITING_RETUNE, f"shipped rows newly stale by source: {sorted(changed)}"
