"""Quarters and dates: parse them, select a period, or turn them into a numeric model input.

A time column may hold Ookla quarters (``"2023Q1"``, ``"2023-Q1"``, ``"Q1 2023"``), dates
(``"2023-02-17"``, datetime values) or years (``2023``). :func:`decimal_year` maps each value to a
float year (a quarter to its middle: 2023Q1 -> 2023.125), which can be an extra model input.
:func:`select_time` filters by a period spec: ``"all"``, a year ``"2023"``, a quarter ``"2023Q1"``, an
inclusive range ``"2021Q3:2022Q2"``, or a list of these.

>>> decimal_year(["2023Q1", "2023Q4"]).tolist()
[2023.125, 2023.875]
>>> select_time(["2022Q4", "2023Q1", "2023Q3"], "2023").tolist()
[False, True, True]
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpcore.errors import DataError

#: Column names recognised (case-insensitive) as the time column when none is given.
TIME_COLUMN_NAMES = ("quarter", "date", "datetime", "timestamp", "time", "period", "year")

_Q_FIRST = re.compile(r"^\s*(\d{4})\s*[-_ /]?\s*[qQ]([1-4])\s*$")
_Q_LAST = re.compile(r"^\s*[qQ]([1-4])\s*[-_ /]?\s*(\d{4})\s*$")
_YEAR = re.compile(r"^\s*(\d{4})\s*$")


def parse_time(values) -> pd.DataFrame:
    """Year, quarter and decimal year of each value.

    Parameters
    ----------
    values : array-like, shape (n,)

    Returns
    -------
    DataFrame with n rows and columns ``year`` (Int64), ``quarter`` (Int64, 1-4; missing for
    bare years) and ``decimal`` (float; NaN where the value is not a time).
    """
    s = pd.Series(values).reset_index(drop=True)
    if len(s) > 64 and not pd.api.types.is_numeric_dtype(s):
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
        if len(uniques) < len(s) // 2:
            parsed = parse_time(pd.Series(uniques, dtype=s.dtype))
            taken = parsed.iloc[np.where(codes >= 0, codes, 0)].reset_index(drop=True)
            taken.loc[codes < 0, :] = pd.NA
            taken["decimal"] = taken["decimal"].astype(float)
            return taken
    n = len(s)
    year = np.full(n, np.nan)
    quarter = np.full(n, np.nan)
    decimal = np.full(n, np.nan)
    if n == 0:
        return pd.DataFrame({"year": year, "quarter": quarter, "decimal": decimal}).astype(
            {"year": "Int64", "quarter": "Int64"}
        )
    if pd.api.types.is_datetime64_any_dtype(s):
        dt = s
    elif pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        v = s.to_numpy(dtype=float, na_value=np.nan)
        ok = np.isfinite(v) & (v >= 1000) & (v <= 3000)
        year[ok] = np.floor(v[ok])
        decimal[ok] = np.where(v[ok] == np.floor(v[ok]), v[ok] + 0.5, v[ok])
        return _frame(year, quarter, decimal)
    else:
        text = s.astype("string")
        m1 = text.str.extract(_Q_FIRST)
        m2 = text.str.extract(_Q_LAST)
        my = text.str.extract(_YEAR)
        y = pd.to_numeric(m1[0].fillna(m2[1]), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        q = pd.to_numeric(m1[1].fillna(m2[0]), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        is_q = np.isfinite(y) & np.isfinite(q)
        year[is_q], quarter[is_q] = y[is_q], q[is_q]
        decimal[is_q] = y[is_q] + (q[is_q] - 1) / 4 + 0.125
        yy = pd.to_numeric(my[0], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        is_y = ~is_q & np.isfinite(yy)
        year[is_y] = yy[is_y]
        decimal[is_y] = yy[is_y] + 0.5
        rest = ~is_q & ~is_y & text.notna().to_numpy()
        if not rest.any():
            return _frame(year, quarter, decimal)
        dt = pd.Series(pd.NaT, index=s.index, dtype="datetime64[ns]")
        try:
            parsed = pd.to_datetime(text[rest], errors="coerce", format="mixed")
            if getattr(parsed.dt, "tz", None) is not None:
                parsed = parsed.dt.tz_convert(None)
            dt.loc[rest] = parsed.astype("datetime64[ns]")
        except (ValueError, TypeError, OverflowError):
            pass
    if getattr(dt.dt, "tz", None) is not None:
        dt = dt.dt.tz_convert(None)
    ok = dt.notna().to_numpy()
    if ok.any():
        d = dt[ok]
        days = np.where(d.dt.is_leap_year, 366.0, 365.0)
        year[ok] = d.dt.year.to_numpy(dtype=float)
        quarter[ok] = d.dt.quarter.to_numpy(dtype=float)
        frac = (d.dt.day_of_year.to_numpy(dtype=float) - 1 + d.dt.hour.to_numpy(dtype=float) / 24) / days
        decimal[ok] = year[ok] + frac
    return _frame(year, quarter, decimal)


def _frame(year, quarter, decimal) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "year": pd.array(np.where(np.isfinite(year), year, np.nan), dtype="Float64").astype("Int64"),
            "quarter": pd.array(np.where(np.isfinite(quarter), quarter, np.nan), dtype="Float64").astype("Int64"),
            "decimal": decimal,
        }
    )


def decimal_year(values) -> np.ndarray:
    """Decimal year of each value (NaN where not a time), shape (n,); quarters map to their middle."""
    return parse_time(values)["decimal"].to_numpy(dtype=float)


def quarter_labels(values) -> np.ndarray:
    """Canonical ``"YYYYQn"`` label of each value (``None`` where no quarter is known), shape (n,)."""
    p = parse_time(values)
    ok = (p["year"].notna() & p["quarter"].notna()).to_numpy()
    out = np.full(len(p), None, dtype=object)
    y = p["year"].to_numpy(dtype=float, na_value=np.nan)
    q = p["quarter"].to_numpy(dtype=float, na_value=np.nan)
    out[ok] = [f"{int(a)}Q{int(b)}" for a, b in zip(y[ok], q[ok], strict=True)]
    return out


def _parse_period(token: str) -> tuple[int, int]:
    """First and last quarter index (``year * 4 + quarter - 1``) of ``"2023"`` or ``"2023Q1"``."""
    m = _Q_FIRST.match(token)
    if m:
        i = int(m.group(1)) * 4 + int(m.group(2)) - 1
        return i, i
    m = _Q_LAST.match(token)
    if m:
        i = int(m.group(2)) * 4 + int(m.group(1)) - 1
        return i, i
    m = _YEAR.match(token)
    if m:
        y = int(m.group(1))
        return y * 4, y * 4 + 3
    raise DataError(
        f"time period {token!r} is not understood; use 'all', a year like '2023', a quarter like '2023Q1', "
        "a range like '2021Q3:2022Q2', or a list of these"
    )


def _selects_all(spec) -> bool:
    if spec is None:
        return True
    tokens = spec.split(",") if isinstance(spec, str) else [str(t) for t in spec]
    return all(not t.strip() for t in tokens) or any(t.strip().lower() == "all" for t in tokens)


def period_ranges(spec) -> list[tuple[int, int]]:
    """The quarters a period spec selects, as sorted, disjoint, non-adjacent inclusive ranges of quarter indices
    (``year * 4 + quarter - 1``); ``[]`` for ``None`` / ``"all"``, which select everything.

    Overlapping or touching parts merge, so every spelling of one selection gives one answer:

    >>> period_ranges("2023") == period_ranges("2023Q1:2023Q2, 2023Q3:2023Q4") == [(8092, 8095)]
    True
    """
    if _selects_all(spec):
        return []
    tokens = [t.strip() for t in spec.split(",")] if isinstance(spec, str) else [str(t).strip() for t in spec]
    parts = []
    for token in tokens:
        if not token:
            continue
        if ":" in token:
            a, b = token.split(":", 1)
            parts.append((_parse_period(a)[0], _parse_period(b)[1]))
        else:
            parts.append(_parse_period(token))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(parts):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        elif lo <= hi:
            merged.append((lo, hi))
    return merged


def canonical_period(spec, known=None) -> str:
    """The one spelling of the selection ``spec`` makes: ``"all"`` or merged ranges like ``"2019Q1:2020Q4,2023Q1"``.

    With ``known`` (every quarter the data holds, when each of its rows has one), the selection is taken within
    them, so a range that covers all of them is ``"all"`` as well. Data-set identities use it
    (:mod:`gpcore.identity`): ``--quarter 2019Q1:2023Q4`` and the Data page's "all" are one data set.

    >>> canonical_period("2023Q4, 2023Q1:2023Q3")
    '2023Q1:2023Q4'
    >>> canonical_period("2019Q1:2030Q4", known=["2019Q1", "2019Q2"])
    'all'
    >>> canonical_period("2019", known=["2019Q1", "2019Q2", "2020Q1"])
    '2019Q1:2019Q2'
    """
    ranges = period_ranges(spec)
    if not ranges:
        return "all"
    if known is not None:
        have = sorted({_parse_period(str(k))[0] for k in known})  # integers: no rounding decides
        chosen = [i for i in have if any(lo <= i <= hi for lo, hi in ranges)]
        if chosen == have:
            return "all"
        ranges = period_ranges([quarter_label(i) for i in chosen]) if chosen else ranges
    return ",".join(quarter_label(lo) if lo == hi else f"{quarter_label(lo)}:{quarter_label(hi)}" for lo, hi in ranges)


def select_time(values, spec) -> np.ndarray:
    """Boolean mask (shape (n,)) of the values that fall in the period ``spec``.

    ``spec`` is ``None``/``"all"`` (everything), ``"2023"``, ``"2023Q1"``, ``"2021Q3:2022Q2"`` (inclusive),
    a comma-separated string of these, or a list of them; the parts are merged first
    (:func:`period_ranges`). Dates match the calendar quarter they fall in; a bare year value matches only
    when the selection covers its whole year. Values that are not times never match.
    """
    p = parse_time(values)
    n = len(p)
    if _selects_all(spec):
        return np.ones(n, dtype=bool)
    year = p["year"].to_numpy(dtype=float, na_value=np.nan)
    quarter = p["quarter"].to_numpy(dtype=float, na_value=np.nan)
    has_q = np.isfinite(quarter)
    lo_i = np.where(has_q, year * 4 + quarter - 1, year * 4)
    hi_i = np.where(has_q, lo_i, year * 4 + 3)
    mask = np.zeros(n, dtype=bool)
    for lo, hi in period_ranges(spec):
        with np.errstate(invalid="ignore"):
            mask |= (lo_i >= lo) & (hi_i <= hi)
    return mask


def find_time_column(columns) -> str | None:
    """First column whose lower-cased name is in :data:`TIME_COLUMN_NAMES` (in that order), or None."""
    lower = {str(c).strip().lower(): c for c in columns}
    for name in TIME_COLUMN_NAMES:
        if name in lower:
            return lower[name]
    return None


# ---------------------------------------------------------------------------------------------
# quarters as numbers: time as a model input (docs/methods/spacetime.md)
# ---------------------------------------------------------------------------------------------


def quarter_index(decimal) -> np.ndarray:
    """Quarter index ``year * 4 + quarter - 1`` of decimal years as :func:`decimal_year` writes them (a quarter's
    middle, or a date: the calendar quarter of that day), shape (n,), int64; -1 where the value is NaN.

    >>> quarter_index([2023.125, 2023.99, decimal_year(["2023-04-01"])[0]]).tolist()
    [8092, 8095, 8093]
    """
    t = np.asarray(decimal, dtype=float).reshape(-1)
    ok = np.isfinite(t)
    out = np.full(t.shape, -1, dtype=np.int64)
    year = np.floor(t[ok]).astype(np.int64)
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    day = np.floor((t[ok] - year) * np.where(leap, 366.0, 365.0) + 1e-6).astype(np.int64)  # 0-based day of year
    month = ((year - 1970).astype("datetime64[Y]").astype("datetime64[D]") + day).astype("datetime64[M]")
    out[ok] = year * 4 + (month.astype(np.int64) % 12) // 3
    return out


def quarter_label(index: int) -> str:
    """``"YYYYQn"`` of a quarter index (:func:`quarter_index`)."""
    y, q = divmod(int(index), 4)
    return f"{y}Q{q + 1}"


def quarter_middle(index) -> np.ndarray | float:
    """Decimal year of the middle of quarter ``index`` (what :func:`decimal_year` gives its label)."""
    return np.asarray(index, dtype=float) / 4.0 + 0.125 if np.ndim(index) else float(index) / 4.0 + 0.125


def parse_quarter(text, what: str = "quarter") -> float:
    """Decimal year (the middle) of one quarter written like ``"2024Q1"`` (or ``"2024-Q1"``, ``"Q1 2024"``).

    ``what`` names the setting or flag in the error (a :class:`DataError` for anything that is not one quarter).

    >>> parse_quarter("2024Q1")
    2024.125
    """
    s = str(text)
    if not (_Q_FIRST.match(s) or _Q_LAST.match(s)):
        raise DataError(f"{what} {text!r} is not a quarter; write one quarter like 2024Q1")
    return quarter_middle(_parse_period(s)[0])


def period_bounds(spec, what: str = "period") -> tuple[int, int]:
    """First and last quarter index of one period: a quarter ``"2023Q1"``, a year ``"2023"`` or an inclusive range
    ``"2023Q1:2023Q4"``. ``what`` names the setting or flag in the error (:class:`DataError`).

    >>> [quarter_label(i) for i in period_bounds("2023Q2:2024")]
    ['2023Q2', '2024Q4']
    """
    s = str(spec).strip() if spec is not None else ""
    try:
        if ":" in s:
            a, b = s.split(":", 1)
            lo, hi = _parse_period(a)[0], _parse_period(b)[1]
        else:
            lo, hi = _parse_period(s)
    except DataError:
        raise DataError(f"{what} {spec!r} is not a period; write a quarter (2023Q1), a year (2023) or a range of "
                        "them (2023Q1:2023Q4)") from None
    if hi < lo:
        raise DataError(f"{what} {spec!r} ends before it starts; write the earlier quarter first (2023Q1:2023Q4)")
    return lo, hi
