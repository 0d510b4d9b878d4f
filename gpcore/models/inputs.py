"""Input checks shared by every model: arrays of points, targets, weights and stratum labels.

Each function returns a clean ``float64`` (or string) NumPy array or raises :class:`~gpcore.errors.InputError`
naming the argument, the offending rows and what to do about them.
"""

from __future__ import annotations

import math

import numpy as np

from gpcore.errors import InputError


def as_2d_float(X, what: str = "X", d: int | None = None) -> np.ndarray:
    """Validate a point array: numeric, finite, 2-D (a 1-D array is one column)."""
    try:
        arr = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be numeric; it holds values that are not numbers") from None
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InputError(f"{what} must be a 2-D array of shape (n, d); got shape {arr.shape}")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} row(s) with NaN or inf (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); drop or impute them first"
        )
    if d is not None and arr.shape[1] != d:
        raise InputError(f"{what} has {arr.shape[1]} column(s) but the model was fitted with d = {d}")
    return arr


def as_weights(w, n: int, what: str = "weights") -> np.ndarray:
    """Validate per-observation weights: ``(n,)``, finite and > 0 (e.g. a count of measurements)."""
    arr = as_1d_float(w, n, what)
    bad = ~(arr > 0)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} value(s) <= 0 (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); a weight is a number of measurements, so it must be > 0: "
            "drop those rows or fix the weight column"
        )
    return arr


def as_groups(groups, n: int, what: str = "groups") -> np.ndarray:
    """Validate stratum labels: one per row (strings; missing values become ``'nan'``)."""
    arr = np.asarray(groups).astype(str).reshape(-1)
    if arr.shape[0] != n:
        raise InputError(f"{what} has {arr.shape[0]} labels but X has {n} rows; they must match")
    return arr


def as_1d_float(y, n: int, what: str = "y") -> np.ndarray:
    try:
        arr = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be numeric; it holds values that are not numbers") from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InputError(f"{what} must be 1-D of shape (n,); got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"{what} has {arr.shape[0]} values but X has {n} rows; they must match")
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{what} has {rows.size} NaN or inf value(s) (rows {', '.join(map(str, rows[:8]))}"
            f"{', ...' if rows.size > 8 else ''}); drop or impute them first"
        )
    return arr


def check_scalers(x_lo, x_span, y_mean, y_std, what: str) -> None:
    """The input box and target scale must be finite (and positive): else every prediction is NaN."""
    x_lo, x_span = np.asarray(x_lo, dtype=np.float64), np.asarray(x_span, dtype=np.float64)
    if not (np.all(np.isfinite(x_lo)) and np.all(np.isfinite(x_span)) and np.all(x_span > 0)):
        raise InputError(
            f"{what}: the input coordinates span a non-finite range (values near the float limit); "
            "check the coordinate columns"
        )
    if not (math.isfinite(y_mean) and math.isfinite(y_std) and y_std > 0):
        raise InputError(
            f"{what}: the target's mean or standard deviation is not finite (values near the float limit, e.g. "
            "1e308, overflow); rescale the target column (divide it by a power of ten) or use a log transform"
        )
