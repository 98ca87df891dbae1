"""attntune — the fastest correct attention for every call, chosen by measurement."""

from attntune._version import __version__
from attntune.problem import AttentionProblem, problem_from_tensors

__all__ = ["__version__", "AttentionProblem", "problem_from_tensors"]
