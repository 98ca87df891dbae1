"""attntune — the fastest correct attention for every call, chosen by measurement.

The runtime API (``attention``, ``scaled_dot_product_attention``, ``dispatch``, ``enable``/``disable``,
``explain``, ``plan``, ``stats``, ``metrics_text``, ``reset``) and the Hugging Face backend (``hf``) are
imported on first use, so ``import attntune`` stays cheap and never imports the tuner (optuna).
"""

from attntune._version import __version__
from attntune.problem import AttentionProblem, problem_from_tensors

_API = ("attention", "scaled_dot_product_attention", "dispatch", "enable", "disable", "is_enabled", "explain",
        "plan", "Plan", "stats", "metrics_text", "reset")

__all__ = ["__version__", "AttentionProblem", "problem_from_tensors", *_API, "hf"]


def __getattr__(name: str):
    if name in _API:
        from attntune import api

        value = getattr(api, name)
        globals()[name] = value  # later look-ups are plain module attributes (the hot path's cost)
        return value
    if name == "hf":
        import importlib

        return importlib.import_module("attntune.hf")
    raise AttributeError(f"module 'attntune' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
