"""Column profiles (gpcore/data/columns.py): converting text to numbers once per distinct value gives what pandas
gives converting every row."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcore.data.columns import numbers_of, profile_column

TOKENS = ["1", " 2.5", "2.5", "-0", "1e3", "abc", "", "NA", "nan", "inf", "-inf", "0x10", "1,5", "３", "7 ", "2023Q1"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6), st.none()), max_size=60))
def test_numbers_of_equals_to_numeric_row_by_row(values):
    text = pd.Series(values, dtype="string")
    want = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    got = numbers_of(text)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_text_column_profile_with_repeats():
    s = pd.Series(["3", "4", "x", None, "NA", "3", "5", "4"] * 1000, name="v")
    p = profile_column(s)
    assert p.numeric and p.n_present == 6000 and len(p.text_rows) == 1000 and len(p.missing_rows) == 2000
    assert set(p.text_values) == {"x"} and p.positive
    assert not profile_column(pd.Series(["2023Q1", "2023Q2"] * 50, name="q")).numeric
    assert not profile_column(pd.Series([None] * 5, dtype="string", name="e")).numeric
