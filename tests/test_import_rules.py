"""The design's import rules (issue #13), checked on the source: every ``import`` statement of the
package, those inside functions included.

1. ``attntune.policies`` never imports the tuner (``attntune.autotune``, optuna): the online policy gets
   its tuning function from the layer above (``attntune.api`` sets ``runtime.ONLINE_TUNER``).
2. ``attntune.cache`` never imports the kernels: judging a row gets the registry through an argument
   (or the one the registry registers when it is imported).
3. The policies' modules import each other without a cycle (``plan`` ↔ ``runtime`` ↔ ``policy`` was one).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

PACKAGES = ("attntune", "attntune.policies", "attntune.kernels", "attntune.autotune", "attntune.cache",
            "attntune.cli")


def _modules() -> Iterator[Tuple[str, Path]]:
    """(dotted name, file) of every module of the packages above (subpackages mapped to other folders)."""
    seen = set()
    for pkg in PACKAGES:
        spec = importlib.util.find_spec(pkg)
        for root in spec.submodule_search_locations or []:
            for path in sorted(Path(root).rglob("*.py")):
                rel = path.relative_to(root).with_suffix("")
                parts = [p for p in rel.parts if p != "__init__"]
                name = ".".join([pkg, *parts])
                if name not in seen:
                    seen.add(name)
                    yield name, path


def _imports(name: str, path: Path) -> Set[str]:
    """Every module ``path`` imports, at any depth of its code (relative imports resolved)."""
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


GRAPH: Dict[str, Set[str]] = {name: _imports(name, path) for name, path in _modules()}


def _offenders(src_prefix: str, banned: Tuple[str, ...]) -> list:
    return sorted((m, i) for m, imps in GRAPH.items() if m.startswith(src_prefix)
                  for i in imps if i.startswith(banned))


def test_the_modules_were_found():
    assert {"attntune.policies.policy", "attntune.cache.models", "attntune.kernels.registry",
            "attntune.autotune.sweep"} <= set(GRAPH)


def test_policies_never_import_the_tuner():
    assert _offenders("attntune.policies", ("attntune.autotune", "optuna")) == []


def test_the_cache_never_imports_the_kernels():
    assert _offenders("attntune.cache", ("attntune.kernels",)) == []


def test_the_policies_import_each_other_without_a_cycle():
    mods = {m for m in GRAPH if m.startswith("attntune.policies.")}
    edges = {m: {i for i in GRAPH[m] if i in mods and i != m} for m in mods}
    state: Dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in edges[m]:
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [m, n]))
            if n not in state:
                visit(n, stack + [m])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [])
