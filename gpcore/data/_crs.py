"""Local projected CRSs and fast point reprojection (internal helpers)."""

from __future__ import annotations

import functools

import numpy as np
import pyproj
import shapely

WGS84 = pyproj.CRS.from_epsg(4326)


def crs_name(crs: pyproj.CRS) -> str:
    """``"EPSG:32615 (WGS 84 / UTM zone 15N)"``, or the CRS's name when it has no EPSG code (for messages)."""
    epsg = crs.to_epsg()
    return f"EPSG:{epsg} ({crs.name})" if epsg else crs.name


def local_crs(lon: float, lat: float) -> pyproj.CRS:
    """A metric CRS for work around ``(lon, lat)``: its WGS 84 UTM zone, or polar LAEA beyond 84 deg."""
    if not (np.isfinite(lon) and np.isfinite(lat)):
        raise ValueError("local_crs needs a finite centre")
    if abs(lat) < 84:
        zone = int(np.clip(np.floor((lon + 180) / 6) + 1, 1, 60))
        return pyproj.CRS.from_epsg((32600 if lat >= 0 else 32700) + zone)
    return pyproj.CRS.from_proj4(f"+proj=laea +lat_0={90 if lat > 0 else -90} +lon_0=0 +datum=WGS84 +units=m")


def laea_crs(lon: float, lat: float) -> pyproj.CRS:
    """Lambert azimuthal equal-area CRS centred on ``(lon, lat)`` (metres)."""
    return pyproj.CRS.from_proj4(f"+proj=laea +lat_0={lat:.6f} +lon_0={lon:.6f} +datum=WGS84 +units=m +no_defs")


@functools.lru_cache(maxsize=64)
def transformer(src, dst) -> pyproj.Transformer:
    """Cached ``always_xy`` transformer between two CRSs (anything pyproj accepts, hashable)."""
    return pyproj.Transformer.from_crs(src, dst, always_xy=True)


def project(x, y, src, dst) -> tuple[np.ndarray, np.ndarray]:
    """Reproject coordinate arrays of shape (n,); ``src``/``dst`` are CRSs (pyproj.CRS or user input)."""
    src = pyproj.CRS.from_user_input(src)
    dst = pyproj.CRS.from_user_input(dst)
    if src == dst:
        return np.asarray(x, dtype=float).copy(), np.asarray(y, dtype=float).copy()
    tx, ty = transformer(src, dst).transform(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    return np.asarray(tx, dtype=float), np.asarray(ty, dtype=float)


def project_geometry(geom, src, dst):
    """Reproject a shapely geometry (or array of them) between CRSs."""
    src = pyproj.CRS.from_user_input(src)
    dst = pyproj.CRS.from_user_input(dst)
    if src == dst:
        return geom
    tr = transformer(src, dst)

    def _xy(coords: np.ndarray) -> np.ndarray:
        return np.column_stack(tr.transform(coords[:, 0], coords[:, 1]))

    return shapely.transform(geom, _xy)


def centre_of(lon: np.ndarray, lat: np.ndarray) -> tuple[float, float]:
    """Middle of the bounding box of finite points (longitudes assumed not to cross the antimeridian)."""
    ok = np.isfinite(lon) & np.isfinite(lat)
    if not ok.any():
        return 0.0, 0.0
    return float((np.min(lon[ok]) + np.max(lon[ok])) / 2), float((np.min(lat[ok]) + np.max(lat[ok])) / 2)
