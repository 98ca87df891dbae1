"""The source tree's top-level ``kernels/`` (installed as attntune.kernels) must not break an installed
package named ``kernels`` — Hugging Face's kernel hub, which transformers >= 5.25 imports — when the
repository root is on sys.path (``python -m pytest`` or a script run from the root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, extra: Path, *flags: str) -> subprocess.CompletedProcess:
    prog = f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(extra)!r}]\n" + code
    return subprocess.run([sys.executable, *flags, "-c", prog], capture_output=True, text=True, timeout=120,
                          cwd=extra)


def test_an_installed_kernels_package_wins_over_the_source_directory(tmp_path):
    pkg = tmp_path / "kernels"
    (pkg / "layer").mkdir(parents=True)
    (pkg / "__init__.py").write_text("MARKER = 'hub'\n")
    (pkg / "layer" / "__init__.py").write_text("SUB = 'hub.layer'\n")
    p = _run("import kernels, kernels.layer\nprint(kernels.MARKER, kernels.layer.SUB)\n"
             "import attntune.kernels as ak\nprint('registry' in dir(ak))", tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["hub", "hub.layer", "True"]


def test_without_another_kernels_package_the_error_names_attntune_kernels(tmp_path):
    p = _run("import kernels", tmp_path, "-S")  # no site-packages: wherever HF's kernels is installed
    assert p.returncode != 0
    assert "import it as attntune.kernels" in p.stderr and "no other package of that name" in p.stderr
