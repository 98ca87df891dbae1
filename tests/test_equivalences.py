"""Declared source equivalences (attntune.kernels.equivalences) hold for the source they were declared against
and for no other: an edit of a hashed kernel module after a declaration stales the declared earlier rows too."""
from __future__ import annotations

import pytest
from helpers import doctest_results

from attntune.kernels import equivalences, registry
from attntune.kernels.equivalences import Equivalence


def test_every_declaration_names_its_variants_current_source():
    """A declaration whose ``current`` is not the variant's hash any more is dead: its rows (and the current
    ones) went stale with the edit. Either the edit re-tunes the rows and the declaration goes, or the edit is
    declared too (its replaced hash into ``earlier``, the new hash into ``current``)."""
    declared = equivalences.declared()
    assert declared
    for name, eq in declared.items():
        v = registry.get(name)
        assert eq.current == v.source_hash(), (
            f"{name}: declared against {eq.current}, the source is now {v.source_hash()} — re-tune its rows and drop "
            "the declaration, or declare this edit (kernels/equivalences.py)")
        assert eq.current not in eq.earlier and dict(v.equivalent_sources) == dict(eq.earlier)


def test_an_earlier_source_counts_only_while_the_declared_one_runs(monkeypatch):
    monkeypatch.setitem(equivalences._EQUIVALENCES, "v", Equivalence("cur0000000000000", {"old0000000000000": "why"}))
    assert equivalences.accepts("v", "cur0000000000000", "old0000000000000")
    assert equivalences.accepts("v", "cur0000000000000", "cur0000000000000")
    # the variant's source changed again without a declaration: the declared rows are stale with the rest
    assert not equivalences.accepts("v", "new0000000000000", "old0000000000000")
    assert not equivalences.accepts("v", "new0000000000000", "cur0000000000000")
    assert equivalences.accepts("v", "new0000000000000", "new0000000000000")
    assert not equivalences.accepts("v", "cur0000000000000", "unknown000000000")


@pytest.mark.parametrize("name", ["triton_local", "triton_flash", "sdpa_default", "flex"])
def test_a_registered_variant_accepts_its_declared_rows_only_under_the_declared_source(name):
    v = registry.get(name)
    earlier = next(iter(v.equivalent_sources))
    assert v.accepts_source(earlier) and v.accepts_source(v.source_hash())
    assert not v.accepts_source("0123456789abcdef")
    # what accepts_source asks for this variant once its hash is another (an undeclared edit)
    assert not equivalences.accepts(name, "fedcba9876543210", earlier)


def test_doctests():
    assert all(failed == 0 for _, failed in doctest_results(equivalences.accepts))
    assert sum(n for n, _ in doctest_results(equivalences.accepts)) >= 1
