"""A run's quarters as a form picks them (issue 23, the Train page): :func:`gpcore.run.timespan.time_run_fields`
turns a range and a forecast test period into RunConfig fields and names the pick to change when they do not fit;
:func:`check_time_rows` keeps a time run off a single quarter whichever front end built it."""

from __future__ import annotations

import numpy as np
import pytest

from gpcore.errors import ConfigError, DataError
from gpcore.run.config import RunConfig
from gpcore.run.timespan import check_time_rows, default_test_period, rows_in, time_run_fields

Q = [f"{y}Q{q}" for y in (2019, 2020) for q in range(1, 5)]
NAMES = {"first": "First quarter", "last": "Last quarter", "test_from": "Test from", "test_to": "Test to"}


def test_the_fields_are_a_valid_run_config():
    f = time_run_fields(Q, "2019Q2", "2020Q4", "forecast", "2020Q2", "2020Q3", period="2019:2020")
    assert f == {"time_input": True, "quarter": "2019Q2:2020Q4", "split": "forecast", "test_period": "2020Q2:2020Q3"}
    cfg = RunConfig(data="x.csv", y="v", **f)
    assert cfg.time_input and cfg.split == "forecast"
    every = time_run_fields(list(reversed(Q)), "2019Q1", "2020Q4", "block", period="2019:2020")
    assert every["quarter"] == "2019:2020", "all of the data set's quarters: its own period (same identity)"
    assert every["test_period"] is None and every["split"] == "block"
    assert time_run_fields(Q, "2019Q1", "2020Q4")["quarter"] is None, "no period: the whole file, as the data set"


def test_the_default_test_period_is_a_year_or_the_last_quarter():
    assert default_test_period(Q) == ("2020Q1", "2020Q4")
    assert default_test_period(Q[:6]) == ("2019Q3", "2020Q2")
    assert default_test_period(Q[:5]) == ("2020Q1", "2020Q1")
    assert default_test_period(Q[:2]) == ("2019Q2", "2019Q2")


@pytest.mark.parametrize("args, needles", [
    (("2019Q3", "2019Q3"), ["needs at least 2 quarters", "2019Q3 holds only 1", "earlier First quarter",
                            "later Last quarter"]),
    (("2020Q2", "2019Q4"), ["First quarter 2020Q2 comes after Last quarter 2019Q4"]),
    (("2018Q4", "2020Q4"), ["First quarter 2018Q4 is not a quarter of the data (2019Q1..2020Q4)"]),
    (("2019Q1", "2020Q4", "forecast"), ["needs a test period", "Test from", "Test to"]),
    (("2019Q1", "2020Q2", "forecast", "2020Q1", "2020Q4"),
     ["test period 2020Q1:2020Q4 is not inside the quarters of the run (2019Q1:2020Q2)", "widen the range"]),
    (("2019Q3", "2020Q4", "forecast", "2019Q3", "2020Q4"),
     ["nothing is left to train on before the test period", "later Test from", "earlier First quarter"]),
    (("2019Q1", "2020Q4", "forecast", "2020Q3", "2020Q1"), ["Test from 2020Q3 comes after Test to 2020Q1"]),
])
def test_bad_picks_name_the_control_and_the_fix(args, needles):
    with pytest.raises(ConfigError) as e:
        time_run_fields(Q, *args, names=NAMES)
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_one_quarter_of_data_is_no_time_input():
    with pytest.raises(ConfigError, match="the data has 1"):
        time_run_fields(["2023Q1"], "2023Q1", "2023Q1")


def test_rows_in_a_range():
    from gpcore.data.temporal import decimal_year

    t = decimal_year(["2019Q1", "2019Q4", "2020Q2", "2020Q3"])
    assert rows_in(t, "2019Q2", "2020Q2").tolist() == [False, True, True, False]


def test_a_time_run_needs_rows_of_two_quarters():
    from gpcore.data.temporal import decimal_year

    check_time_rows(decimal_year(["2019Q1", "2019Q2"]), True, None)
    check_time_rows(decimal_year(["2019Q1"]), False, "2019Q1")  # no time input: nothing to check
    with pytest.raises(DataError, match=r"at least 2 quarters; the rows read hold only 2019Q1 \(--quarter 2019Q1\)"):
        check_time_rows(decimal_year(["2019Q1", "2019Q1"]), True, "2019Q1")
    with pytest.raises(DataError, match="hold none"):
        check_time_rows(np.array([np.nan]), True, None)


def test_the_cli_refuses_a_time_run_on_one_quarter(tmp_path, capsys):
    """prepare's check: ``fit --time-input --quarter 2020Q4`` ends with one error line naming --quarter."""
    from gpcore.cli import main
    from tests.gpcore.test_cli_time import write_spacetime_csv

    csv = write_spacetime_csv(tmp_path / "st.csv", n=160)
    rc = main(["fit", "--data", str(csv), "--y", "download_mbps", "--model", "vecchia", "--time-input", "--quarter",
               "2020Q4", "--grid", "none", "--set", "epochs=1", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "only 2020Q4 (--quarter 2020Q4)" in err, err
