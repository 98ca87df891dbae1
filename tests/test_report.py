"""`attntune report`: renders a self-contained page; headless Chromium loads it with its images."""

import base64
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from attntune.cache import CacheStore
from attntune.cli import app

from test_cache import make_key, make_rec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]


def _seeded(tmp_path):
    db = tmp_path / "u.db"
    st = CacheStore(db)
    for i, sq in enumerate((64, 128, 256, 512)):
        for variant, causal in (("sdpa_math", False), ("sdpa_flash", True)):
            k = make_key(sq=sq)
            if causal:
                k = k.model_copy(update={"causal": True})
            st.upsert_winner(make_rec(key=k, variant=variant, ms=0.1 * (i + 1), sdpa_default_ms=0.13 * (i + 1),
                                      tflops=1.5, runner_up="eager", runner_up_ms=0.5, trials=5))
    return db


def test_report_html_is_self_contained(tmp_path):
    db = _seeded(tmp_path)
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["report", "--cache", str(db), "--out", str(out), "--no-system"])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    imgs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(imgs) == 2
    for b in imgs:
        assert base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n" and len(b) > 2000
    assert "http://" not in page and "https://" not in page  # nothing fetched from outside
    assert page.count("<tr>") == 1 + 8 and "1.30x" in page


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (installed by .ci/run)")
def test_report_loads_in_headless_chromium(tmp_path):
    db = _seeded(tmp_path)
    out = tmp_path / "report.html"
    CliRunner().invoke(app, ["report", "--cache", str(db), "--out", str(out), "--no-system"])
    prof = tmp_path / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", "--dump-dom", out.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert 'data-images-ok="true"' in dom.stdout, dom.stderr[-2000:]
    assert 'data-image-count="2"' in dom.stdout
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", "--window-size=1400,1000",
                    f"--screenshot={shot}", out.as_uri()], capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses far smaller


def test_report_include_stale_draws_foreign_rows(tmp_path):
    import sqlite3

    from attntune.device import SoftwareFingerprint

    db = _seeded(tmp_path)
    with sqlite3.connect(db) as c:  # as if tuned under another torch (a cache from another machine)
        c.execute("UPDATE winners SET fingerprint_json = ?",
                  (SoftwareFingerprint(torch="1.0.0", variant_hash="x").model_dump_json(),))
    out = tmp_path / "r.html"
    CliRunner().invoke(app, ["report", "--cache", str(db), "--out", str(out), "--no-system"])
    assert "data:image/png" not in out.read_text() and "Stale and rejected rows" in out.read_text()
    r = CliRunner().invoke(app, ["report", "--cache", str(db), "--out", str(out), "--no-system", "--include-stale"])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert page.count("data:image/png") == 2 and "8 stale (drawn)" in page and "Stale and rejected rows" not in page


def test_heatmap_axes_sort_numerically():
    """Columns are ``Sq x Skv`` buckets and rows key families: both sort by the numbers in them, so a
    decode bucket ``1x512`` comes first and ``D64`` before ``D128`` (as text: ``128x128`` < ``1x512``,
    ``D128`` < ``D64``)."""
    from attntune.report import _grid

    recs = []
    for sq, skv in ((512, 512), (1, 512), (128, 128), (256, 256), (1, 4096)):
        for d in (128, 64):
            k = make_key(sq=sq, d=d).model_copy(update={"seqlen_kv": skv})
            recs.append(make_rec(key=k, ms=1.0))
    rows, cols, cells = _grid(recs)
    assert cols == ["1x512", "1x4096", "128x128", "256x256", "512x512"]
    assert [r.split()[1] for r in rows] == ["D64", "D128"]
    assert len(cells) == 10
