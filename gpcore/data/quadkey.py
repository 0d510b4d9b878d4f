"""Web-mercator tile maths (Bing quadkeys, as used by the Ookla open-data tiles), vectorised.

A tile ``(x, y)`` at zoom ``z`` covers ``1/2^z`` of the web-mercator square in each direction, with
``x`` counting east from lon -180 and ``y`` counting south from lat 85.0511. Its quadkey is the
``z``-digit string interleaving the bits of ``y`` and ``x`` (digit = 2*ybit + xbit). Ookla tiles
are zoom 16 (about 610 m at the equator). All functions take and return NumPy arrays of shape (n,).

>>> tx, ty, zoom, ok = parse_quadkeys(["0323002122001010"])
>>> str(tile_to_quadkey(tx, ty, zoom)[0])
'0323002122001010'
"""

from __future__ import annotations

import numpy as np

#: Half the side of the web-mercator square in metres (EPSG:3857).
MERC_HALF = 20037508.342789244
#: Latitude limit of web mercator in degrees.
MERC_MAX_LAT = 85.0511287798066
EARTH_RADIUS = 6378137.0
MAX_ZOOM = 30


def parse_quadkeys(quadkeys) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tile indices of quadkey strings.

    Parameters
    ----------
    quadkeys : array-like of str, shape (n,)
        Quadkeys; ``None``/NaN, empty strings and strings with digits other than 0-3 are invalid.

    Returns
    -------
    tx, ty, zoom : ndarray of int64, shape (n,)
        Tile column, row and zoom (0 where invalid).
    valid : ndarray of bool, shape (n,)
    """
    raw = np.asarray(quadkeys, dtype=object)
    text = np.array(["" if not isinstance(q, str) else q.strip() for q in raw], dtype=str)
    n = len(text)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy(), np.zeros(0, dtype=bool)
    lengths = np.char.str_len(text).astype(np.int64)
    width = max(int(lengths.max()), 1)
    codes = text.astype(f"<U{width}").view(np.uint32).reshape(n, width).astype(np.int64)
    pos = np.arange(width)[None, :]
    inside = pos < lengths[:, None]
    digits = codes - 48
    good_digit = (digits >= 0) & (digits <= 3)
    valid = (lengths > 0) & (lengths <= MAX_ZOOM) & np.all(good_digit | ~inside, axis=1)
    digits = np.where(inside & good_digit, digits, 0)
    shift = np.where(inside, lengths[:, None] - 1 - pos, 0)
    tx = np.sum((digits & 1) << shift, axis=1)
    ty = np.sum(((digits >> 1) & 1) << shift, axis=1)
    zoom = np.where(valid, lengths, 0)
    return np.where(valid, tx, 0), np.where(valid, ty, 0), zoom, valid


def tile_to_quadkey(tx, ty, zoom) -> np.ndarray:
    """Quadkey strings of tiles; ``tx``, ``ty`` shape (n,), ``zoom`` an int (or shape (n,), all equal).

    Returns
    -------
    ndarray of str, shape (n,)
    """
    tx = np.asarray(tx, dtype=np.int64)
    ty = np.asarray(ty, dtype=np.int64)
    z = int(np.max(zoom)) if np.ndim(zoom) else int(zoom)
    if len(tx) == 0:
        return np.zeros(0, dtype=f"<U{max(z, 1)}")
    if z == 0:
        return np.full(len(tx), "", dtype="<U1")
    shifts = np.arange(z - 1, -1, -1)
    digits = ((tx[:, None] >> shifts) & 1) + 2 * ((ty[:, None] >> shifts) & 1)
    chars = (digits + 48).astype(np.uint8)
    return chars.view(f"S{z}").ravel().astype(f"<U{z}")


def lonlat_to_mercator(lon, lat) -> tuple[np.ndarray, np.ndarray]:
    """EPSG:4326 degrees to EPSG:3857 metres (latitudes clipped to +-85.0511)."""
    lon = np.asarray(lon, dtype=float)
    lat = np.clip(np.asarray(lat, dtype=float), -MERC_MAX_LAT, MERC_MAX_LAT)
    x = EARTH_RADIUS * np.radians(lon)
    y = EARTH_RADIUS * np.log(np.tan(np.pi / 4 + np.radians(lat) / 2))
    return x, y


def mercator_to_lonlat(x, y) -> tuple[np.ndarray, np.ndarray]:
    """EPSG:3857 metres to EPSG:4326 degrees."""
    lon = np.degrees(np.asarray(x, dtype=float) / EARTH_RADIUS)
    lat = np.degrees(2 * np.arctan(np.exp(np.asarray(y, dtype=float) / EARTH_RADIUS)) - np.pi / 2)
    return lon, lat


def tile_size_m(zoom: int) -> float:
    """Side of a tile at ``zoom`` in web-mercator metres."""
    return 2 * MERC_HALF / 2**zoom


def tile_bounds(tx, ty, zoom) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(west, south, east, north)`` of tiles in degrees, each shape (n,)."""
    tx = np.asarray(tx, dtype=float)
    ty = np.asarray(ty, dtype=float)
    size = tile_size_m(zoom) if np.ndim(zoom) == 0 else 2 * MERC_HALF / 2.0 ** np.asarray(zoom)
    west, north = mercator_to_lonlat(-MERC_HALF + tx * size, MERC_HALF - ty * size)
    east, south = mercator_to_lonlat(-MERC_HALF + (tx + 1) * size, MERC_HALF - (ty + 1) * size)
    return west, south, east, north


def tile_centre(tx, ty, zoom) -> tuple[np.ndarray, np.ndarray]:
    """Web-mercator centre ``(lon, lat)`` of tiles in degrees, each shape (n,)."""
    tx = np.asarray(tx, dtype=float)
    ty = np.asarray(ty, dtype=float)
    size = tile_size_m(zoom) if np.ndim(zoom) == 0 else 2 * MERC_HALF / 2.0 ** np.asarray(zoom)
    return mercator_to_lonlat(-MERC_HALF + (tx + 0.5) * size, MERC_HALF - (ty + 0.5) * size)


def lonlat_to_tile(lon, lat, zoom: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile ``(tx, ty)`` holding each point at ``zoom``, each int64 shape (n,)."""
    x, y = lonlat_to_mercator(lon, lat)
    size = tile_size_m(zoom)
    last = 2**zoom - 1
    tx = np.clip(np.floor((x + MERC_HALF) / size), 0, last).astype(np.int64)
    ty = np.clip(np.floor((MERC_HALF - y) / size), 0, last).astype(np.int64)
    return tx, ty


def quadkey_centres(quadkeys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre ``(lon, lat)`` of each quadkey (NaN where invalid) and the valid mask, each shape (n,)."""
    tx, ty, zoom, valid = parse_quadkeys(quadkeys)
    lon, lat = tile_centre(tx, ty, np.where(valid, zoom, 0))
    return np.where(valid, lon, np.nan), np.where(valid, lat, np.nan), valid
