"""attntune.autotune — suites, correctness gate, timing and the optuna sweep (``attntune tune``).

Never imported by the runtime hot path: the names below load their modules (and optuna) on first use.

>>> from attntune.autotune import SUITES
>>> sorted(SUITES)
['decode', 'default', 'demo', 'long', 'seed', 'training']
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "tune": "attntune.autotune.runner",
    "tune_one": "attntune.autotune.runner",
    "run_tuning": "attntune.autotune.runner",
    "Interrupted": "attntune.autotune.runner",
    "KeyResult": "attntune.autotune.sweep",
    "SweepOptions": "attntune.autotune.sweep",
    "TimingOptions": "attntune.autotune.timing",
    "SUITES": "attntune.autotune.suites",
    "get_suite": "attntune.autotune.suites",
    "materialize": "attntune.autotune.suites",
    "parse_shape": "attntune.autotune.shapes",
    "ShapeSpecError": "attntune.autotune.shapes",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'attntune.autotune' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
