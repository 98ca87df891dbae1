"""The source tree's top-level ``kernels/`` (installed as attntune.kernels) must not break an installed
package named ``kernels`` — Hugging Face's kernel hub, which transformers >= 5.25 imports — when the
repository root is on sys.path (``python -m pytest`` or a script run from the root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_without_another_kernels_package_it_reads_as_absent(tmp_path):
    # transformers probes optional packages this way (utils/import_utils.py, 5.17 to 5.24): find_spec, then
    # an unguarded import, then "no __version__ and no __file__" means not installed. An exception from
    # the import broke every HF model on a machine without the kernel hub.
    probe = ("import importlib, importlib.util\n"
             "for _ in range(2):\n"
             "    assert importlib.util.find_spec('kernels') is not None\n"
             "    m = importlib.import_module('kernels')\n"
             "    print(getattr(m, '__version__', 'N/A'), getattr(m, '__file__', None))\n"
             "try:\n"
             "    m.get_kernel\n"
             "except AttributeError as e:\n"
             "    print('AttributeError', 'import it as attntune.kernels' in str(e))\n"
             "try:\n"
             "    import kernels.registry\n"
             "except ImportError as e:\n"
             "    print(type(e).__name__)\n")
    p = _run(probe, tmp_path, "-S")  # no site-packages: wherever HF's kernels is installed
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["N/A", "None", "N/A", "None", "AttributeError", "True", "ModuleNotFoundError"]


def test_the_source_directory_does_not_break_transformers(tmp_path):
    pytest.importorskip("transformers")
    p = _run("import transformers.modeling_utils, transformers.integrations.hub_kernels as h\n"
             "print('ok')", tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-1] == "ok"
