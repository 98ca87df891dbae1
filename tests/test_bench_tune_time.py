"""benchmarks/bench_tune_time.py: per-trial durations read back from a real optuna sqlite storage, and the
summary that splits a cold run's time into compiles (cold - warm) and the rest (CPU, no tune process)."""

from __future__ import annotations

import datetime as dt

import optuna
import pytest

from helpers import bench_module

tt = bench_module("bench_tune_time")


def _study(url: str, name: str, trials) -> None:
    """A study whose trials carry a ``variant`` user attr and last the given seconds, one after another."""
    study = optuna.create_study(study_name=name, storage=url)
    t = dt.datetime(2026, 12, 6, 12, 0, 0)
    for variant, seconds in trials:
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0,
                                                  user_attrs={"variant": variant}))
        # create_trial stamps both ends with now(): set them to the duration under test
        _set_times(url, study.get_trials(deepcopy=False)[-1]._trial_id, t, t + dt.timedelta(seconds=seconds))
        t += dt.timedelta(seconds=seconds)


def _set_times(url: str, tid: int, start, end) -> None:
    import sqlalchemy as sa

    eng = sa.create_engine(url)
    with eng.begin() as con:
        con.execute(sa.text("UPDATE trials SET datetime_start=:s, datetime_complete=:e WHERE trial_id=:i"),
                    {"s": start, "e": end, "i": tid})
    eng.dispose()


def test_trial_times_groups_durations_by_variant(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    _study(url, "keyA", [("triton_flash", 1.5), ("sdpa_default", 0.25), ("triton_flash", 0.5)])
    got = tt.trial_times(url)["keyA"]
    assert got["trials"] == 3
    assert got["by_variant"]["triton_flash"] == [2, 2.0, 1.5]
    assert got["by_variant"]["sdpa_default"] == [1, 0.25, 0.25]
    assert got["in_trials_s"] == pytest.approx(2.25)
    assert got["span_s"] == pytest.approx(2.25)


def test_summary_splits_compile_time_from_the_rest():
    runs = [{"run": "cold", "wall_s": 100.0, "studies": {"a": {"trials": 40, "in_trials_s": 80.0}}},
            {"run": "warm", "wall_s": 40.0, "studies": {"a": {"trials": 40, "in_trials_s": 20.0}}}]
    s = tt.summarize(runs)
    assert s["compile_share"] == pytest.approx(0.6)
    assert s["cold_s_per_trial"] == pytest.approx(2.0) and s["warm_s_per_trial"] == pytest.approx(0.5)
    assert s["cold_outside_trials_s"] == pytest.approx(20.0) and s["warm_outside_trials_s"] == pytest.approx(20.0)
    assert "compile_share" not in tt.summarize(runs[:1])  # one run alone: nothing to compare
