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


def training_inputs(X, y, X_val, y_val, weights, val_weights, refuses_weights: str | None = None):
    """Validate what ``fit`` is given: ``(X, y, w, X_val, y_val, wv, has_val)`` as float64 arrays.

    ``refuses_weights``: the name of a model that takes no weights (passing them is an error). A validation
    set with no rows counts as none; with weights, the validation rows need theirs too.
    """
    X = as_2d_float(X, "X")
    y = as_1d_float(y, X.shape[0], "y")
    w = None if weights is None else as_weights(weights, X.shape[0], "weights")
    if w is not None and refuses_weights:
        raise InputError(
            f"{refuses_weights} does not take per-observation weights yet; fit it without weights "
            "(CLI: leave out --weight; Data page: Weight column '(none)') or choose another model"
        )
    if X.shape[0] < 2:
        raise InputError(f"need at least 2 training points, got {X.shape[0]}")
    has_val = X_val is not None or y_val is not None
    if has_val:
        if X_val is None or y_val is None:
            raise InputError("pass both X_val and y_val, or neither")
        X_val = as_2d_float(X_val, "X_val", d=X.shape[1])
        y_val = as_1d_float(y_val, X_val.shape[0], "y_val")
        if X_val.shape[0] == 0:
            has_val = False
    if val_weights is not None and w is None:
        raise InputError("val_weights were given without weights; pass weights for the training rows too")
    wv = None
    if has_val and w is not None:
        if val_weights is None:
            raise InputError("the model is fitted with weights: pass val_weights for the validation rows too")
        wv = as_weights(val_weights, X_val.shape[0], "val_weights")
    return X, y, w, X_val, y_val, wv, has_val
