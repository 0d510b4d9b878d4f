"""Checking column values and turning unusable rows into one message, or dropped rows in the report.

A read collects its problems in a :class:`ReadContext` (reason, column, row mask, hint); at the end
:func:`resolve_problems` either raises one :class:`DataError` listing every problem with its rows (1-based data
rows) and the fix, or, with ``allow_drop``, drops the rows and counts each reason in the :class:`ReadReport`.
Internal to :mod:`gpcore.data.readers`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import geopandas as gpd
import numpy as np
import pandas as pd

from gpcore.data.report import ROWS_NOTE, ReadReport, rows_text, values_text
from gpcore.errors import DataError

#: Cell texts (stripped, lower case) read as missing values.
NA_TOKENS = {"", "na", "n/a", "nan", "null", "none", "-", "--", "?", "missing", "#n/a", "nd", "<na>"}
_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+$")


@dataclass
class _Problem:
    """Rows that cannot be used for one reason (dropped only with ``allow_drop``)."""

    reason: str
    column: str | None
    mask: np.ndarray
    hint: str = ""


@dataclass
class ReadContext:
    """What one read knows while it checks columns: the file, its report, the rows left and the problems found."""

    src_name: str
    report: ReadReport
    rows: np.ndarray  # 1-based row numbers of the current frame
    decimal_comma_ok: bool = False
    crs_from_file: bool = False
    problems: list[_Problem] = field(default_factory=list)

    def where(self, column=None) -> str:
        return f"file '{self.src_name}'" + (f", column '{column}'" if column is not None else "")

    def rows_of(self, mask: np.ndarray) -> str:
        idx = np.flatnonzero(mask)
        return f"{rows_text(self.rows[idx], len(idx))}; {ROWS_NOTE}"

    def problem(self, reason: str, column, mask: np.ndarray, hint: str = "") -> None:
        if mask.any():
            self.problems.append(_Problem(reason, column, mask.copy(), hint))


def listing(names, limit: int = 30) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "(none)"


def missing_column(ctx: ReadContext, df: pd.DataFrame, column: str, role: str, extra: str = "") -> DataError:
    cols = [str(c) for c in df.columns if not (isinstance(df, gpd.GeoDataFrame) and c == df.geometry.name)]
    close = difflib.get_close_matches(str(column), cols, n=3, cutoff=0.6)
    lower = [c for c in cols if c.lower() == str(column).lower()]
    hint = f" Did you mean {', '.join(repr(c) for c in (lower or close))}?" if (lower or close) else ""
    return DataError(f"{ctx.where()}: no {role} column '{column}'; columns are: {listing(cols)}.{hint}{extra}")


def numeric_column(df: pd.DataFrame, column: str, ctx: ReadContext, role: str, *, numeric_hint: str = "") -> np.ndarray:
    """Column as float array, shape (n,); records missing / non-numeric / infinite rows as problems."""
    s = df[column]
    if isinstance(s, pd.DataFrame):
        raise DataError(f"{ctx.where(column)}: the name appears more than once; rename the duplicate columns")
    n = len(s)
    if pd.api.types.is_bool_dtype(s):
        raise DataError(f"{ctx.where(column)}: holds True/False values, not numbers; choose a numeric {role} column")
    if pd.api.types.is_numeric_dtype(s):
        v = s.to_numpy(dtype=float, na_value=np.nan)
        text_bad = np.zeros(n, dtype=bool)
        missing = np.isnan(v)
    else:
        text = s.astype("string").str.strip()
        missing = (text.isna() | text.str.lower().isin(NA_TOKENS)).to_numpy(dtype=bool)
        num = pd.to_numeric(text.mask(missing), errors="coerce")
        v = num.to_numpy(dtype=float, na_value=np.nan)
        text_bad = np.isnan(v) & ~missing
        if text_bad.any():
            bad_vals = text[text_bad]
            commas = bad_vals.str.fullmatch(_DECIMAL_COMMA.pattern).fillna(False).to_numpy(dtype=bool)
            if commas.all() and ctx.decimal_comma_ok:
                fixed = pd.to_numeric(bad_vals.str.replace(",", ".", regex=False), errors="coerce")
                v[text_bad] = fixed.to_numpy(dtype=float, na_value=np.nan)
                ctx.report.notes.append(f"column '{column}': {int(text_bad.sum())} decimal commas read as points")
                text_bad = np.isnan(v) & ~missing
            n_present = int((~missing).sum())
            if text_bad.any():
                examples = values_text(text[text_bad].tolist())
                comma_hint = (
                    "; values like '12,5' use a decimal comma: save the file with '.' as decimal separator or "
                    "pass decimal=','"
                    if commas.any()
                    else ""
                )
                if text_bad.sum() > 0.5 * max(n_present, 1):
                    raise DataError(
                        f"{ctx.where(column)}: not numeric ({int(text_bad.sum())} of {n_present} values are text, "
                        f"e.g. {examples} in {ctx.rows_of(text_bad)}){comma_hint}; "
                        f"{numeric_hint or f'choose a numeric {role} column'}"
                    )
                ctx.problem(
                    f"values with text where a number is expected ({examples})",
                    column,
                    text_bad,
                    "fix those cells" + comma_hint,
                )
    if missing.all():
        raise DataError(f"{ctx.where(column)}: all {n} values are missing; choose a column with data")
    ctx.problem("missing values (empty, NA or NaN)", column, missing & ~text_bad)
    inf = np.isinf(v)
    ctx.problem("infinite values", column, inf)
    return v


_SINGULAR = {
    "values": "value",
    "weights": "weight",
    "geometries": "geometry",
    "quadkeys": "quadkey",
    "points": "point",
    "features": "feature",
}


def _counted(n: int, phrase: str) -> str:
    """``"3 missing values"`` / ``"1 missing value"``: the first plural noun of ``phrase`` agrees with ``n``."""
    if n == 1:
        words = phrase.split(" ")
        for i, w in enumerate(words):
            if w in _SINGULAR:
                words[i] = _SINGULAR[w]
                break
        phrase = " ".join(words)
    return f"{n} {phrase}"


def resolve_problems(ctx: ReadContext, allow_drop: bool) -> np.ndarray:
    """Boolean keep-mask of shape (n,); raises when rows are unusable and dropping was not allowed."""
    n = len(ctx.rows)
    if not ctx.problems:
        return np.ones(n, dtype=bool)
    any_bad = np.zeros(n, dtype=bool)
    for p in ctx.problems:
        any_bad |= p.mask
    if not allow_drop:
        lines = []
        for p in ctx.problems:
            col = f"column '{p.column}': " if p.column is not None else ""
            hint = f"; {p.hint}" if p.hint else ""
            lines.append(f"{col}{_counted(int(p.mask.sum()), p.reason)} ({ctx.rows_of(p.mask)}){hint}")
        fix = (
            "fix the file, or drop these rows (Python: allow_drop=True; CLI: fit, predict and evaluate drop them "
            "unless --no-drop is given, `data inspect` needs --allow-drop)"
        )
        if len(lines) == 1:
            raise DataError(f"{ctx.where()}, {lines[0]}; {fix}")
        body = "\n".join(f"  - {ln}" for ln in lines)
        raise DataError(
            f"{ctx.where()}: {int(any_bad.sum())} of {n} rows cannot be used:\n{body}\n{fix[0].upper()}{fix[1:]}"
        )
    for p in ctx.problems:
        col = f"column '{p.column}': " if p.column is not None else ""
        ctx.report.drop(f"{col}{p.reason}", ctx.rows[p.mask])
    return ~any_bad
