"""What each column of a file holds, before any column is chosen: for pickers and previews.

:func:`read_table` reads a file as :func:`~gpcore.data.read_measurements` would (same formats, size
limit and messages) but stops before locating coordinates, so a file whose coordinate columns are
not recognised can still offer its columns to choose from. :func:`profile_columns` tells, per
column, whether it is a number column *as read_measurements will treat it* — a column with a few
text cells ("n/a", "500k+") among numbers is still one, and the cells that will be dropped are
listed with their 1-based data rows and values — and :func:`guess_target` picks a default target
that is never a coordinate or an id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpcore.data._parsers import read_frame
from gpcore.data._source import DEFAULT_MAX_BYTES, open_source
from gpcore.data._validate import NA_TOKENS
from gpcore.data.report import ReadReport, rows_text, values_text

#: Column names (lower case, non-letters removed) that hold coordinates, never a target.
COORDINATE_NAMES = {
    "lon", "lng", "long", "longitude", "lat", "latitude", "x", "y", "easting", "northing", "tilex", "tiley",
    "xcoord", "ycoord", "lonwgs84", "latwgs84",
}
#: Columns that identify or locate a record; never a default target.
ID_NAMES = {"id", "fid", "objectid", "quadkey", "geoid", "fips", "index", "rowid", "timeyear"}
#: Targets whose values are positive and span decades: log10 is the sensible default transform.
LOG_HINTS = ("mbps", "kbps", "speed", "price", "value", "rent", "income", "cost", "population", "pm25", "pm10")


def _key(name) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def is_coordinate_name(name) -> bool:
    """Whether a column name reads as a coordinate (``lon``, ``Latitude``, ``x_coord``, ``tile_y`` ...)."""
    return _key(name) in COORDINATE_NAMES


@dataclass(frozen=True)
class ColumnProfile:
    """One column: is it usable as numbers, and which rows would be dropped as a target or weight."""

    name: str
    numeric: bool
    n_present: int
    text_rows: tuple[int, ...] = ()  # 1-based data rows with text where a number is expected
    text_values: tuple[str, ...] = ()
    missing_rows: tuple[int, ...] = ()  # 1-based data rows that are empty / NA
    positive: bool = False

    @property
    def n_dropped(self) -> int:
        return len(self.text_rows) + len(self.missing_rows)

    def drop_note(self) -> str:
        """Which rows would be dropped with this column as the target, and why ("" when none)."""
        parts = []
        if self.text_rows:
            parts.append(
                f"{len(self.text_rows)} with text where a number is expected ({values_text(list(self.text_values))}"
                f" in {rows_text(np.asarray(self.text_rows), len(self.text_rows))})"
            )
        if self.missing_rows:
            n = len(self.missing_rows)
            parts.append(f"{n} empty or NA ({rows_text(np.asarray(self.missing_rows), n)})")
        if not parts:
            return ""
        total = self.n_dropped
        return f"{total} row{'s' if total != 1 else ''} of '{self.name}' will be dropped: " + "; ".join(parts)


def read_table(source, *, name: str | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES) -> pd.DataFrame:
    """The file's table as read (all columns, no row dropped); DataError for unreadable files."""
    src = open_source(source, name, max_bytes)
    df, _, _ = read_frame(src, ReadReport(file=src.name), layer=None, sep=None, decimal=".")
    return df


def profile_column(s: pd.Series) -> ColumnProfile:
    """Profile one column with the same rules :func:`read_measurements` applies to a target column."""
    name = str(s.name)
    rows = np.arange(1, len(s) + 1)
    if isinstance(s, pd.DataFrame) or pd.api.types.is_bool_dtype(s):
        return ColumnProfile(name, False, int(len(s)))
    if pd.api.types.is_numeric_dtype(s):
        v = s.to_numpy(dtype=float, na_value=np.nan)
        missing = np.isnan(v)
        ok = v[~missing]
        return ColumnProfile(name, bool(ok.size), int((~missing).sum()), missing_rows=tuple(rows[missing].tolist()),
                             positive=bool(ok.size and np.all(ok > 0)))
    if not (pd.api.types.is_object_dtype(s) or pd.api.types.is_string_dtype(s)):
        return ColumnProfile(name, False, int(s.notna().sum()))
    text = s.astype("string").str.strip()
    missing = (text.isna() | text.str.lower().isin(NA_TOKENS)).to_numpy(dtype=bool)
    num = numbers_of(text.mask(missing))
    bad = np.isnan(num) & ~missing
    present = int((~missing).sum())
    usable = present > 0 and bad.sum() <= 0.5 * present and (~np.isnan(num)).any()
    if not usable:
        return ColumnProfile(name, False, present)
    ok = num[~np.isnan(num)]
    return ColumnProfile(
        name, True, present, text_rows=tuple(rows[bad].tolist()),
        text_values=tuple(text[bad].astype(str).tolist()), missing_rows=tuple(rows[missing].tolist()),
        positive=bool(np.all(ok > 0)),
    )


def numbers_of(text: pd.Series) -> np.ndarray:
    """``pd.to_numeric(text, errors="coerce")`` as floats (NaN where a value is no number), shape (n,), converted once
    per distinct value: a quarter or county column of 142,803 rows has a few dozen (0.08 s -> 0.003 s each)."""
    codes, uniques = pd.factorize(text)
    if len(uniques) == 0:
        return np.full(len(text), np.nan)
    nums = pd.to_numeric(pd.Series(uniques, dtype="string"), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return np.where(codes >= 0, nums[np.maximum(codes, 0)], np.nan)


def profile_columns(df: pd.DataFrame, skip=("geometry",)) -> dict[str, ColumnProfile]:
    """:func:`profile_column` of every column except ``skip``, in file order."""
    return {str(c): profile_column(df[c]) for c in df.columns if str(c) not in skip}


def guess_target(profiles: dict[str, ColumnProfile], coordinates=(), preferred=("download_mbps", "value", "target")):
    """The default target: a preferred name, else the first number column that is not a coordinate, id or weight.

    ``coordinates`` are the columns the reader located points with (never the target). None when there is
    no candidate.
    """
    numeric = [n for n, p in profiles.items() if p.numeric]
    for name in preferred:
        if name in numeric:
            return name
    skip = {str(c) for c in coordinates if c}
    for name in numeric:
        if name in skip or is_coordinate_name(name) or _key(name) in ID_NAMES or _key(name) in ("tests", "devices"):
            continue
        return name
    rest = [n for n in numeric if n not in skip and not is_coordinate_name(n)]
    return rest[0] if rest else None


def default_transform(profile: ColumnProfile | None) -> str:
    """``log10`` for positive speeds, prices and other quantities spanning decades; else ``identity``."""
    if profile is None or not profile.positive:
        return "identity"
    return "log10" if any(h in _key(profile.name) for h in LOG_HINTS) else "identity"
