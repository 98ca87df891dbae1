"""The command line's help reads as written: paragraphs reflow to the terminal and square brackets stay
text (rich markup mode had dropped ``[plots]`` from "pip install 'attntune[plots]'" as a style tag)."""

from __future__ import annotations

from typer.testing import CliRunner

from attntune.cli import app


def _help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100", "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    return r.output


def test_square_brackets_in_docstrings_survive():
    assert "attntune[plots]" in _help("report")


def test_docstring_paragraphs_reflow():
    """Greedy wrapping: within a paragraph of the description, no line could have taken the next line's
    first word (rich mode kept the docstring's own line breaks, then wrapped again: ragged lines)."""
    width = 100
    r = CliRunner().invoke(app, ["explain", "--help"], env={"COLUMNS": str(width), "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    desc = r.output.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[2:]  # the description's lines
    paragraphs, cur = [], []
    for ln in desc:
        if ln.strip():
            cur.append(ln.rstrip())
        elif cur:
            paragraphs.append(cur)
            cur = []
    assert len(paragraphs) >= 2, desc
    for para in paragraphs:
        for line, nxt in zip(para, para[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > width - 2, (line, nxt)  # rich keeps a 1-column margin
