"""attntune's public runtime API (re-exported by ``attntune``).

* :func:`attention` — attention through the fastest correct implementation known for the call
  (causal aligned bottom-right).
* :func:`scaled_dot_product_attention` — a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
  with torch's exact signature and semantics (top-left ``is_causal``).
* :func:`dispatch` / :func:`enable` / :func:`disable` — route ``F.scaled_dot_product_attention`` itself.
* :func:`explain` — the plan a call gets, and why; :func:`plan` — the plan of an ``AttentionProblem``.
* :func:`stats` / :func:`metrics_text` — telemetry; :func:`reset` — re-read the environment, drop plans.

Environment switches are documented in :mod:`attntune.policies.config` and ``docs/runtime.md``.
"""

from attntune.policies.dispatch import (attention, disable, dispatch, enable, explain, is_enabled,
                                        scaled_dot_product_attention)
from attntune.policies import fp8 as _fp8  # noqa: F401 — installs attention()'s FP8 K/V path
from attntune.policies import runtime as _runtime
from attntune.policies.plan import Plan
from attntune.policies.runtime import plan, reset
from attntune.policies.telemetry import metrics_text, stats


def _tune_one(problem, store, trials: int, time_limit: float):
    """The online policy's tuner (``ATTNTUNE_POLICY=online``): :func:`attntune.autotune.tune_one`, imported
    on first use (it pulls in optuna). Handed to the runtime from here, the layer above the policies."""
    from attntune.autotune import tune_one

    return tune_one(problem, store, trials=trials, time_limit=time_limit)


_runtime.ONLINE_TUNER = _tune_one

__all__ = ["attention", "scaled_dot_product_attention", "dispatch", "enable", "disable", "is_enabled",
           "explain", "plan", "Plan", "stats", "metrics_text", "reset"]
