"""``attntune --version`` and a cheap ``--help``: neither imports torch or the other heavy modules."""

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from attntune._version import __version__
from attntune.cli import app

HEAVY = ("torch", "triton", "optuna", "sqlalchemy", "transformers", "matplotlib", "numpy")
COMMANDS = ("show", "export", "import", "doctor", "report", "tune", "suites", "explain", "bench")

# Runs in a fresh interpreter (this test process imported torch long ago): the help of the app and of
# every command, as the console script does it, then which heavy modules got imported. Then the
# public API must still work: ``import attntune`` is lazy, attribute access imports what it needs.
PROBE = r"""
import json, sys
from attntune.cli import main
helps = {}
for argv in ([], *([c] for c in %(commands)r)):
    sys.argv = ["attntune", *argv, "--help"]
    try:
        main()
    except SystemExit as e:
        helps[" ".join(argv) or "-"] = e.code
heavy = sorted(m for m in %(heavy)r if m in sys.modules)
import attntune
lazy_ok = "torch" not in sys.modules
problem = attntune.AttentionProblem.__name__
from attntune import attention
print(json.dumps({"helps": helps, "heavy": heavy, "lazy_ok": lazy_ok, "problem": problem,
                  "attention": attention.__name__}))
"""


def test_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"attntune {__version__}"


def test_help_imports_no_heavy_module_and_the_api_still_loads():
    code = PROBE % {"commands": COMMANDS, "heavy": HEAVY}
    env = dict(os.environ, COLUMNS="100")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["helps"] == {c: 0 for c in ("-", *COMMANDS)}, out["helps"]
    assert out["heavy"] == [], f"--help imported {out['heavy']}"
    assert out["lazy_ok"] and out["problem"] == "AttentionProblem" and out["attention"] == "attention"


def _command_names():
    return [c.name or c.callback.__name__ for c in app.registered_commands]


def test_every_command_is_in_the_readme():
    """The README's command table has a line for every command (bench and suites were missing once)."""
    assert sorted(_command_names()) == sorted(COMMANDS)  # COMMANDS above is complete
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    table = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    missing = [c for c in _command_names() if f"| `attntune {c}" not in table]
    assert missing == [], f"README's command table lacks {missing}"
