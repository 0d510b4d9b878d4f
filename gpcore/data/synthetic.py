"""Seeded synthetic data with known true mean and noise, for tests and demos.

* :func:`hetero_1d` — the DBK paper's 1-D heteroscedastic toy (docs/methods/dbk.md §2.11, erratum D1):
  ``x ~ U[-1, 1]``, ``mu(x) = 0.3 (1 - s1) + 0.9 (s1 - s2) - 0.6 (s2 - s3)`` with
  ``s1 = logistic(200 (x + 0.6))``, ``s2 = logistic(200 x)``, ``s3 = logistic(200 (x - 0.4))``, and noise sd
  ``sigma(x) = amplitude * |sin(10 x)|`` (amplitude 0.2 by default; the paper's printed "2" is an erratum).
* :func:`hetero_2d` — its 2-D analogue on ``[-1, 1]^2``: ``mu(u, v) = mu_1d(u) + mu_1d(v)`` (sharp steps along
  both axes) and ``sigma(u, v) = amplitude * sqrt((sin^2(10 u) + sin^2(10 v)) / 2)``; optionally placed in a
  lon/lat box.
* :func:`synthetic_ookla` — a table with the Ookla sample schema (quarter, quadkey, lon, lat, avg_d_kbps,
  avg_u_kbps, avg_lat_ms, tests, devices, county_metro) whose log10 download speed is
  ``N(mu(lon, lat, quarter), sd(lon, lat)^2)`` with the fields of :func:`ookla_truth`, also stored in the columns
  ``true_mean_log10_mbps`` and ``true_sd_log10_mbps``.
* :func:`ookla_points` — the same world as plain arrays at any size (millions of places in a second): places
  drawn as :func:`synthetic_ookla` draws its tiles (dense cities, sparse countryside), kept as they fall, one
  quarter; for the scale benchmark (``benchmarks/bench_scale.py``).

Everything is a pure function of its arguments and ``seed`` (``numpy.random.default_rng``).

>>> x, y, mu, sd = hetero_1d(5, seed=0)
>>> x.shape, bool(abs(mu_1d(-0.3) - 0.9) < 1e-6)
((5,), True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpcore.data import quadkey as qk

#: Lon/lat box (W, E, S, N) of the synthetic Ookla table: most of Missouri.
SYNTH_BBOX = (-94.6, -90.2, 36.6, 40.5)
#: Synthetic "cities": centre (u, v) in [-1, 1]^2 of the box, radius in the same units, and weight.
CITIES = ((-0.72, 0.05, 0.16, 1.0), (0.72, 0.12, 0.20, 1.0), (0.05, 0.35, 0.10, 0.7), (-0.35, -0.70, 0.09, 0.6))
DEFAULT_QUARTERS = ("2023Q1", "2023Q2", "2023Q3", "2023Q4")


def _logistic(z):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=float)))


def mu_1d(x):
    """True mean of the 1-D toy, elementwise (any shape)."""
    x = np.asarray(x, dtype=float)
    s1, s2, s3 = _logistic(200 * (x + 0.6)), _logistic(200 * x), _logistic(200 * (x - 0.4))
    return 0.3 * (1 - s1) + 0.9 * (s1 - s2) - 0.6 * (s2 - s3)


def sd_1d(x, amplitude: float = 0.2):
    """True noise standard deviation of the 1-D toy, ``amplitude * |sin(10 x)|``, elementwise."""
    return amplitude * np.abs(np.sin(10 * np.asarray(x, dtype=float)))


def hetero_1d(n: int, seed: int = 0, amplitude: float = 0.2):
    """Draw the DBK 1-D heteroscedastic data set.

    Parameters
    ----------
    n : int
        Number of points.
    seed : int
    amplitude : float
        Noise amplitude (default 0.2, see docs/methods/dbk.md §2.11, erratum D1).

    Returns
    -------
    x, y, mu, sd : ndarray of float64, shape (n,)
        Inputs in [-1, 1], noisy targets ``y = mu + sd * eps``, the true mean and noise sd at ``x``.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=int(n))
    mu, sd = mu_1d(x), sd_1d(x, amplitude)
    y = mu + sd * rng.standard_normal(int(n))
    return x, y, mu, sd


def mu_2d(u, v):
    """True mean of the 2-D toy on [-1, 1]^2, ``mu_1d(u) + mu_1d(v)``, elementwise."""
    return mu_1d(u) + mu_1d(v)


def sd_2d(u, v, amplitude: float = 0.2):
    """True noise sd of the 2-D toy, ``amplitude * sqrt((sin^2(10u) + sin^2(10v)) / 2)``, elementwise."""
    su, sv = np.sin(10 * np.asarray(u, dtype=float)), np.sin(10 * np.asarray(v, dtype=float))
    return amplitude * np.sqrt(0.5 * (su**2 + sv**2))


def to_unit(lon, lat, bbox):
    """Map lon/lat in the box ``(W, E, S, N)`` linearly to ``(u, v)`` in [-1, 1]^2."""
    w, e, s, n = bbox
    return 2 * (np.asarray(lon, dtype=float) - w) / (e - w) - 1, 2 * (np.asarray(lat, dtype=float) - s) / (n - s) - 1


def from_unit(u, v, bbox):
    """Inverse of :func:`to_unit`."""
    w, e, s, n = bbox
    return w + (np.asarray(u) + 1) * (e - w) / 2, s + (np.asarray(v) + 1) * (n - s) / 2


def hetero_2d(n: int, seed: int = 0, amplitude: float = 0.2, bbox=None):
    """Draw the 2-D analogue of the heteroscedastic toy.

    Parameters
    ----------
    n : int
    seed : int
    amplitude : float
    bbox : (W, E, S, N), optional
        When given, inputs are returned as lon/lat in this box (the fields are defined on the unit square).

    Returns
    -------
    X : ndarray, shape (n, 2)
        ``(u, v)`` in [-1, 1]^2, or ``(lon, lat)`` when ``bbox`` is given.
    y, mu, sd : ndarray, shape (n,)
    """
    rng = np.random.default_rng(seed)
    uv = rng.uniform(-1.0, 1.0, size=(int(n), 2))
    mu, sd = mu_2d(uv[:, 0], uv[:, 1]), sd_2d(uv[:, 0], uv[:, 1], amplitude)
    y = mu + sd * rng.standard_normal(int(n))
    X = uv if bbox is None else np.column_stack(from_unit(uv[:, 0], uv[:, 1], bbox))
    return X, y, mu, sd


def urban_intensity(lon, lat, bbox=SYNTH_BBOX):
    """How "urban" each place is in the synthetic world, in [0, 1] (sum of city bumps, capped), shape (n,)."""
    u, v = to_unit(lon, lat, bbox)
    total = np.zeros(np.broadcast(u, v).shape)
    for cu, cv, r, wgt in CITIES:
        total = total + wgt * np.exp(-((u - cu) ** 2 + (v - cv) ** 2) / r**2)
    return np.minimum(total, 1.0)


def ookla_truth(lon, lat, quarter_index=0, bbox=SYNTH_BBOX):
    """True mean and noise sd of log10(download Mbps) in the synthetic Ookla world.

    ``mu = 1.15 + 0.6 * urban + 0.1 * mu_1d(u) + 0.04 * quarter_index`` and ``sd = 0.18 + 0.22 * (1 - urban)``
    (noisier in the countryside), with ``urban`` from :func:`urban_intensity` and ``u`` the scaled longitude.

    Returns
    -------
    mu, sd : ndarray, shape (n,)
    """
    urban = urban_intensity(lon, lat, bbox)
    u, _ = to_unit(lon, lat, bbox)
    mu = 1.15 + 0.6 * urban + 0.1 * mu_1d(u) + 0.04 * np.asarray(quarter_index, dtype=float)
    sd = 0.18 + 0.22 * (1.0 - urban)
    return mu, sd


def synthetic_ookla(n: int = 4000, seed: int = 0, bbox=SYNTH_BBOX, quarters=DEFAULT_QUARTERS) -> pd.DataFrame:
    """A synthetic table in the schema of the bundled Ookla files, with known truth.

    Points are zoom-16 tile centres (60% clustered around the synthetic cities, 40% uniform in ``bbox``),
    one record per (quarter, tile). ``county_metro`` is ``urban > 0.3``.

    Returns
    -------
    DataFrame, n rows
        Columns quarter, quadkey, lon, lat, avg_d_kbps, avg_u_kbps, avg_lat_ms, tests, devices,
        county_metro, true_mean_log10_mbps, true_sd_log10_mbps.
    """
    rng = np.random.default_rng(seed)
    m = int(np.ceil(1.3 * n)) + 10
    n_city = int(0.6 * m)
    which = rng.choice(len(CITIES), size=n_city, p=np.array([c[3] for c in CITIES]) / sum(c[3] for c in CITIES))
    centres = np.array([[c[0], c[1]] for c in CITIES])[which]
    radii = np.array([c[2] for c in CITIES])[which]
    uv_city = centres + rng.standard_normal((n_city, 2)) * radii[:, None]
    uv = np.clip(np.vstack([uv_city, rng.uniform(-1, 1, size=(m - n_city, 2))]), -1, 1)
    lon, lat = from_unit(uv[:, 0], uv[:, 1], bbox)
    tx, ty = qk.lonlat_to_tile(lon, lat, 16)
    q_idx = rng.integers(0, len(quarters), size=m)
    frame = pd.DataFrame({"q": q_idx, "tx": tx, "ty": ty}).drop_duplicates(["q", "tx", "ty"]).head(n)
    perm = rng.permutation(len(frame))
    frame = frame.iloc[perm].reset_index(drop=True)
    tx, ty, q_idx = (frame[c].to_numpy() for c in ("tx", "ty", "q"))
    k = len(frame)
    lon, lat = qk.tile_centre(tx, ty, 16)
    mu, sd = ookla_truth(lon, lat, q_idx, bbox)
    urban = urban_intensity(lon, lat, bbox)
    eps_d, eps_u = rng.standard_normal(k), rng.standard_normal(k)
    down = np.power(10.0, mu + sd * eps_d)
    up = np.power(10.0, mu - 0.55 + 0.8 * sd * eps_u)
    tests = 1 + rng.poisson(3 + 40 * urban)
    devices = np.minimum(tests, 1 + rng.poisson(1 + 10 * urban))
    latency = np.maximum(5, np.round(25 + 30 * (1 - urban) + 8 * rng.standard_normal(k)))
    return pd.DataFrame(
        {
            "quarter": np.asarray(quarters, dtype=object)[q_idx],
            "quadkey": qk.tile_to_quadkey(tx, ty, 16),
            "lon": lon,
            "lat": lat,
            "avg_d_kbps": np.maximum(1, np.round(1000 * down)).astype(np.int64),
            "avg_u_kbps": np.maximum(1, np.round(1000 * up)).astype(np.int64),
            "avg_lat_ms": latency.astype(np.int64),
            "tests": tests.astype(np.int64),
            "devices": devices.astype(np.int64),
            "county_metro": urban > 0.3,
            "true_mean_log10_mbps": mu,
            "true_sd_log10_mbps": sd,
        }
    )


def ookla_points(n: int, seed: int = 0, bbox=SYNTH_BBOX, quarter_index: int = 0, city_share: float = 0.6):
    """``n`` places of the synthetic Ookla world and their noisy log10 download speed, vectorised for millions.

    A share ``city_share`` of the places falls around the synthetic cities (:data:`CITIES`, by weight), the rest
    uniformly in ``bbox``, as in :func:`synthetic_ookla`; a city draw outside the box is replaced by a uniform one.
    Unlike :func:`synthetic_ookla` the places are not snapped to zoom-16 tiles nor deduplicated, so any ``n`` is
    possible (the default box holds only about 730,000 zoom-16 tiles, and ``synthetic_ookla`` returns fewer rows
    than asked once its draws repeat tiles). ``y = mu + sd * eps`` with ``(mu, sd)`` of :func:`ookla_truth` at
    ``quarter_index``.

    Returns
    -------
    X : ndarray of float64, shape (n, 2)
        ``(lon, lat)`` in ``bbox``.
    y, mu, sd : ndarray of float64, shape (n,)
        Noisy log10 Mbps, the true mean and the true noise sd at ``X``.

    >>> X, y, mu, sd = ookla_points(1000, seed=0)
    >>> X.shape, y.shape, bool((sd >= 0.18).all())
    ((1000, 2), (1000,), True)
    """
    rng = np.random.default_rng(seed)
    n = int(n)
    cities = np.asarray(CITIES, dtype=float)
    which = rng.choice(len(cities), size=n, p=cities[:, 3] / cities[:, 3].sum())
    uv = cities[which, :2] + rng.standard_normal((n, 2)) * cities[which, 2:3]
    uniform = (rng.random(n) >= city_share) | (np.abs(uv) > 1).any(axis=1)
    uv[uniform] = rng.uniform(-1, 1, size=(int(uniform.sum()), 2))
    lon, lat = from_unit(uv[:, 0], uv[:, 1], bbox)
    mu, sd = ookla_truth(lon, lat, quarter_index, bbox)
    y = mu + sd * rng.standard_normal(n)
    return np.column_stack([lon, lat]), y, mu, sd


def write_synthetic_sample(path, n: int = 4000, seed: int = 0) -> None:
    """Write :func:`synthetic_ookla` (``n``, ``seed``) as the CSV bundled in ``sample_data/``."""
    synthetic_ookla(n, seed).to_csv(path, index=False, float_format="%.10g")


if __name__ == "__main__":  # python -m gpcore.data.synthetic OUT.csv
    import sys

    write_synthetic_sample(sys.argv[1] if len(sys.argv) > 1 else "synthetic_ookla_missouri_seed0.csv")
