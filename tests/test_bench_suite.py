"""benchmarks/bench_suite.py's measuring helpers (the suite itself needs a GPU): rounds timed in a rotated
order with enough repetitions, the rounds' spread, times expressed at the card's top clock, and the A/A control
that gives each case its noise floor."""

from __future__ import annotations

from helpers import bench_module, doctest_results


def test_the_suite_rotates_its_rounds_and_reports_its_noise_floor():
    suite = bench_module("bench_suite")
    for fn in (suite.round_order, suite.spread, suite.aa_ratio, suite.rep_ms):
        res = doctest_results(fn)
        assert res and all(failed == 0 for _, failed in res) and sum(n for n, _ in res) == 1, fn.__name__
    # every implementation leads exactly one round in every len(names) rounds
    names = ["attntune", "sdpa_default", "sdpa_flash", "sdpa_cudnn"]
    firsts = [suite.round_order(names, r)[0] for r in range(len(names))]
    assert sorted(firsts) == sorted(names)
    assert all(sorted(suite.round_order(names, r)) == sorted(names) for r in range(9))
