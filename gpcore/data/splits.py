"""Train / validation / test splits returning index arrays.

* :func:`random_split` — seeded random split (the DBK protocol uses 8:1:1).
* :func:`block_split` — spatially blocked split: the plane (a local metric CRS) is cut into square
  blocks of ``block_km``; every block goes whole to one part, so test points are not next to
  training points from the same block. Use it to measure how a model extrapolates in space.
* :func:`forecast_split` — split in time: test = the rows of a test period, train and validation = the rows of
  the quarters before it (validation = the last of those quarters). Use it to measure how a model extrapolates
  in time (docs/methods/spacetime.md, "The forecast split").

>>> tr, va, te = random_split(100, seed=0)
>>> len(tr), len(va), len(te)
(80, 10, 10)
"""

from __future__ import annotations

import numpy as np

from gpcore.data._crs import centre_of, local_crs, project
from gpcore.errors import ConfigError, DataError

DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


def _check_fractions(fractions) -> np.ndarray:
    f = np.asarray(fractions, dtype=float)
    if f.shape != (3,) or not np.all(np.isfinite(f)) or np.any(f < 0) or abs(f.sum() - 1.0) > 1e-6:
        raise ConfigError(
            f"fractions={tuple(fractions)!r} must be three non-negative numbers (train, validation, test) "
            "that sum to 1, e.g. (0.8, 0.1, 0.1)"
        )
    return f


def _part_sizes(n: int, f: np.ndarray) -> tuple[int, int, int]:
    n_val = int(round(f[1] * n))
    n_test = int(round(f[2] * n))
    return n - n_val - n_test, n_val, n_test


def random_split(n: int, seed: int = 0, fractions=DEFAULT_FRACTIONS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded random split of ``range(n)``.

    Parameters
    ----------
    n : int
        Number of rows.
    seed : int
        Seed of ``numpy.random.default_rng``; the same ``(n, seed, fractions)`` gives the same split.
    fractions : (float, float, float)
        Train, validation and test shares, summing to 1. Validation and test sizes are
        ``round(f * n)``; train takes the rest.

    Returns
    -------
    train_idx, val_idx, test_idx : ndarray of int64
        Sorted, disjoint, together ``range(n)``; shapes (n_train,), (n_val,), (n_test,).
    """
    f = _check_fractions(fractions)
    n = int(n)
    if n < 0:
        raise ConfigError(f"n={n} must be non-negative")
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val, _ = _part_sizes(n, f)
    parts = np.split(perm, [n_train, n_train + n_val])
    return tuple(np.sort(p).astype(np.int64) for p in parts)  # type: ignore[return-value]


def block_ids(lon, lat, block_km: float = 10.0) -> np.ndarray:
    """Integer id of the ``block_km`` square block holding each point, shape (n,).

    Blocks are squares in the WGS 84 UTM zone of the data's centre, anchored at that CRS's origin.
    """
    lon = np.asarray(lon, dtype=float)
    lat = np.asarray(lat, dtype=float)
    if lon.shape != lat.shape or lon.ndim != 1:
        raise DataError(f"lon and lat must be 1-D arrays of equal length, got shapes {lon.shape} and {lat.shape}")
    if not (np.all(np.isfinite(lon)) and np.all(np.isfinite(lat))):
        raise DataError("lon/lat hold NaN or infinite values; read the data with read_measurements first")
    if not (np.isfinite(block_km) and block_km > 0):
        raise ConfigError(f"block_km={block_km!r} must be a positive number of kilometres")
    if len(lon) == 0:
        return np.zeros(0, dtype=np.int64)
    x, y = project(lon, lat, 4326, local_crs(*centre_of(lon, lat)))
    size = block_km * 1000.0
    bx = np.floor(x / size).astype(np.int64)
    by = np.floor(y / size).astype(np.int64)
    _, ids = np.unique(np.column_stack([bx, by]), axis=0, return_inverse=True)
    return ids.ravel().astype(np.int64)


def block_split(
    lon, lat, block_km: float = 10.0, seed: int = 0, fractions=DEFAULT_FRACTIONS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spatially blocked split: whole ``block_km`` squares go to train, validation or test.

    Blocks are visited in a seeded random order; each goes to the part furthest below its target
    count, so the point counts come close to ``fractions`` when there are many blocks.

    Parameters
    ----------
    lon, lat : array-like, shape (n,)
        Point coordinates in EPSG:4326 degrees.
    block_km : float
        Side of the square blocks in kilometres.
    seed : int
        Seed of the block order.
    fractions : (float, float, float)
        Target train, validation and test shares of the points.

    Returns
    -------
    train_idx, val_idx, test_idx : ndarray of int64
        Sorted, disjoint, together ``range(n)``; no block is split between parts.

    Raises
    ------
    DataError
        When there are fewer occupied blocks than parts with a non-zero share (use a smaller ``block_km``).
    """
    f = _check_fractions(fractions)
    ids = block_ids(lon, lat, block_km)
    n = len(ids)
    n_blocks = int(ids.max()) + 1 if n else 0
    needed = int(np.count_nonzero(f > 0))
    if n_blocks < needed:
        raise DataError(
            f"the {n} points fall in only {n_blocks} block(s) of {block_km:g} km, fewer than the {needed} parts "
            "to fill; use a smaller block_km"
        )
    counts = np.bincount(ids, minlength=n_blocks)
    order = np.random.default_rng(seed).permutation(n_blocks)
    targets = f * n
    filled = np.zeros(3)
    part_of_block = np.empty(n_blocks, dtype=np.int64)
    # First give each non-empty part one block, then fill by largest remaining deficit.
    first = [k for k in range(3) if f[k] > 0]
    for i, b in enumerate(order):
        if i < len(first):
            k = first[i]
        else:
            deficit = np.where(f > 0, targets - filled, -np.inf)
            k = int(np.argmax(deficit))
        part_of_block[b] = k
        filled[k] += counts[b]
    part = part_of_block[ids]
    return tuple(np.flatnonzero(part == k).astype(np.int64) for k in range(3))  # type: ignore[return-value]


#: share of the earlier rows the forecast split validates on when they hold a single quarter
FORECAST_FALLBACK_VAL = 0.1


def forecast_split(t, test_period: str, seed: int = 0, what: str = "test_period"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split in time: train and validation before ``test_period``, test inside it.

    Parameters
    ----------
    t : array-like, shape (n,)
        Decimal years of the rows (:func:`gpcore.data.temporal.decimal_year`; a quarter is its middle).
    test_period : str
        A quarter ``"2023Q1"``, a year ``"2023"`` or an inclusive range ``"2023Q1:2023Q4"``.
    seed : int
        Seed of the fallback validation draw (below).
    what : str
        How errors name ``test_period`` (``"--test-period"`` from the command line).

    Returns
    -------
    train_idx, val_idx, test_idx : ndarray of int64
        Sorted and disjoint. ``test_idx``: every row whose quarter lies in ``test_period``. ``val_idx``: the rows of
        the last quarter before the test period, so early stopping (and a recalibration) score a one-quarter-ahead
        forecast; when the earlier rows hold a single quarter, a seeded random 10 % of them instead. ``train_idx``:
        the other earlier rows. Rows after the test period are in no part. No validation or training row is ever
        in or after the test period.

    Raises
    ------
    DataError
        When ``t`` has missing values, ``test_period`` is malformed, or no row falls in or before the test period.
    """
    from gpcore.data import temporal

    t = np.asarray(t, dtype=float).reshape(-1)
    if not np.all(np.isfinite(t)):
        raise DataError(f"the forecast split needs a time for every row; {int((~np.isfinite(t)).sum())} row(s) have "
                        "none")
    lo, hi = temporal.period_bounds(test_period, what)
    qi = temporal.quarter_index(t)
    test = (qi >= lo) & (qi <= hi)
    before = qi < lo
    have = sorted({temporal.quarter_label(i) for i in np.unique(qi)})
    span = f"the data has {have[0]}..{have[-1]}" if have else "the data has no rows"
    if not test.any():
        raise DataError(f"{what} {test_period!r}: no row falls in it ({span}); choose quarters the data has")
    if not before.any():
        raise DataError(f"{what} {test_period!r}: no row comes before it ({span}), so nothing is left to train "
                        "on; choose a later test period or read earlier quarters (--quarter)")
    earlier = np.flatnonzero(before)
    quarters = np.unique(qi[earlier])
    if len(quarters) >= 2:
        is_val = qi[earlier] == quarters[-1]
    else:
        n_val = max(1, int(round(FORECAST_FALLBACK_VAL * len(earlier)))) if len(earlier) > 1 else 0
        is_val = np.zeros(len(earlier), dtype=bool)
        is_val[np.random.default_rng(seed).permutation(len(earlier))[:n_val]] = True
    return (earlier[~is_val].astype(np.int64), earlier[is_val].astype(np.int64),
            np.flatnonzero(test).astype(np.int64))
