"""attntune — the fastest correct attention for every call, chosen by measurement.

Everything but ``__version__`` is imported on first use: the problem model (``AttentionProblem``,
``problem_from_tensors``), the runtime API (``attention``, ``scaled_dot_product_attention``,
``dispatch``, ``enable``/``disable``, ``explain``, ``plan``, ``stats``, ``metrics_text``, ``reset``) and
the Hugging Face backend (``hf``). So ``import attntune`` never imports the tuner (optuna), and the
``attntune`` command can print ``--help``/``--version`` without importing torch (seconds on a cold disk).
"""

from attntune._version import __version__

_API = ("attention", "scaled_dot_product_attention", "dispatch", "enable", "disable", "is_enabled", "explain",
        "plan", "Plan", "stats", "metrics_text", "reset")
_PROBLEM = ("AttentionProblem", "problem_from_tensors")

__all__ = ["__version__", *_PROBLEM, *_API, "hf"]


def __getattr__(name: str):
    if name in _API or name in _PROBLEM:
        import importlib

        module = importlib.import_module("attntune.api" if name in _API else "attntune.problem")
        value = getattr(module, name)
        globals()[name] = value  # later look-ups are plain module attributes (the hot path's cost)
        return value
    if name == "hf":
        import importlib

        return importlib.import_module("attntune.hf")
    raise AttributeError(f"module 'attntune' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
