"""``attntune report`` on a plain ``pip install .`` (matplotlib is only in the [plots] extra): the page is
written with its summary and every table, and one line says how to get the plots."""

import sys

from typer.testing import CliRunner

from attntune.cache import CacheStore
from attntune.cli import app

from test_cache import make_key, make_rec


def test_report_without_matplotlib(tmp_path, monkeypatch):
    db = tmp_path / "u.db"
    st = CacheStore(db)
    for sq in (64, 128):
        st.upsert_winner(make_rec(key=make_key(sq=sq), ms=0.1, sdpa_default_ms=0.13))
    # None in sys.modules makes ``import matplotlib`` (and every submodule import) raise ImportError,
    # as on an install without it, whatever this test process imported before.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--cache", str(db), "--out", str(out), "--no-system"])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    [hint] = [line for line in res.stdout.splitlines() if "attntune[plots]" in line]
    assert "matplotlib is not installed" in hint and "pip install 'attntune[plots]'" in hint
    page = out.read_text()
    assert "data:image/png" not in page
    assert page.count("<tr>") == 1 + 2 and "1.30x" in page  # header + both keys, speedups in the table
    assert "attntune[plots]" in page  # the page itself says why it has no pictures
