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
#: yet (key ids, each with the reason and the re-tune awaited). Empty since 2026-12-07, when the H200's last twelve
#: (window decode, six FP8-KV decode, two FP8-KV prefill, three TF32) re-tuned (tune_fp8_h200_2026-12-07i_retune.log).
STALE_BY_SOURCE_AWAITING_RETUNE: frozenset = frozenset()


def test_the_shipped_triton_rows_keep_their_source():
    """As for the SDPA variants: an edit of their hashed modules (a default config, a comment) stales
    every shipped row tuned on the current source unless it re-tunes or lists the old hash in
    ``kernels/equivalences.py``. Only the rows already known to await a re-tune may read as a changed source."""
    rows, changed = _changed_source("triton_")
    assert len(rows) > len(STALE_BY_SOURCE_AWAITING_RETUNE)
    changed = {k for k, _ in changed}
    assert changed <= STALE_BY_SOURCE_AWAITING_RETUNE, f"shipped rows newly stale by source: {sorted(changed)}"
