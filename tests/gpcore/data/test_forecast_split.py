"""The forecast split (gpcore/data/splits.py, docs/methods/spacetime.md "The forecast split") and the quarter helpers
of gpcore/data/temporal.py it uses: no test-period row ever lands in train or validation, validation is the last
quarter before the test period (a seeded 10 % of the earlier rows when they hold one quarter), rows after the
test period are in no part, and malformed or empty periods are errors naming the flag."""

from __future__ import annotations

import numpy as np
import pytest

from gpcore.data.splits import forecast_split
from gpcore.data.temporal import decimal_year, parse_quarter, period_bounds, quarter_index, quarter_label
from gpcore.errors import DataError

QUARTERS = [f"{y}Q{q}" for y in (2019, 2020, 2021) for q in range(1, 5)]


def _times(n=600, seed=0, quarters=QUARTERS):
    labels = np.random.default_rng(seed).choice(quarters, n)
    return labels, decimal_year(labels)


@pytest.mark.parametrize("period", ["2021Q1", "2021Q1:2021Q4", "2021", "2020Q3:2021Q2"])
def test_no_test_period_row_in_train_or_validation(period):
    labels, t = _times()
    tr, va, te = forecast_split(t, period, seed=3)
    lo, hi = period_bounds(period)
    qi = quarter_index(t)
    assert len(tr) and len(va) and len(te)
    assert set(tr).isdisjoint(va) and set(tr).isdisjoint(te) and set(va).isdisjoint(te)
    assert np.all(qi[tr] < lo) and np.all(qi[va] < lo), "train / validation rows come only from before the period"
    assert np.array_equal(te, np.flatnonzero((qi >= lo) & (qi <= hi))), "test = every row of the period"
    assert set(labels[va]) == {quarter_label(lo - 1)}, "validation = the last quarter before the test period"
    after = np.flatnonzero(qi > hi)
    assert set(after).isdisjoint(np.concatenate([tr, va, te])), "rows after the test period are in no part"
    assert len(tr) + len(va) == int((qi < lo).sum())


def test_dates_split_by_their_calendar_quarter():
    t = decimal_year(["2022-02-01", "2022-05-03", "2022-11-30", "2023-01-15", "2023-03-30", "2023-04-02"])
    tr, va, te = forecast_split(t, "2023Q1")
    assert te.tolist() == [3, 4] and va.tolist() == [2] and tr.tolist() == [0, 1]


def test_one_earlier_quarter_validates_on_a_seeded_tenth():
    labels, t = _times(quarters=["2022Q4", "2023Q1"])
    tr, va, te = forecast_split(t, "2023Q1", seed=1)
    earlier = np.flatnonzero(labels == "2022Q4")
    assert np.array_equal(np.sort(np.concatenate([tr, va])), earlier)
    assert len(va) == round(0.1 * len(earlier))
    assert np.array_equal(va, forecast_split(t, "2023Q1", seed=1)[1]), "seeded"
    assert not np.array_equal(va, forecast_split(t, "2023Q1", seed=2)[1])


@pytest.mark.parametrize("period, needle", [
    ("2023Q1", "no row falls in it"),
    ("2019Q1", "no row comes before it"),
    ("2021Q5", "is not a period"),
    ("2021Q4:2021Q1", "ends before it starts"),
])
def test_bad_periods_are_errors_naming_the_flag(period, needle):
    _, t = _times()
    with pytest.raises(DataError, match=needle) as e:
        forecast_split(t, period, what="--test-period")
    assert str(e.value).startswith("--test-period")


def test_missing_times_are_an_error():
    t = _times(n=20)[1].copy()
    t[3] = np.nan
    with pytest.raises(DataError, match="needs a time for every row"):
        forecast_split(t, "2021Q1")


def test_quarter_helpers():
    assert parse_quarter("2024Q1") == 2024.125 and parse_quarter("Q4 2019") == 2019.875
    for bad in ("2024", "2024Q5", "24Q1", "", "2024-01-01"):
        with pytest.raises(DataError, match="--at .* is not a quarter"):
            parse_quarter(bad, "--at")
    assert [quarter_label(i) for i in period_bounds("2019Q1:2022Q4")] == ["2019Q1", "2022Q4"]
    assert quarter_index(decimal_year(QUARTERS)).tolist() == list(range(2019 * 4, 2022 * 4))
